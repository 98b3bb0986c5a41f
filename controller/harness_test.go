package controller_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/agent"
	"github.com/rdzv/rdzv/agent/gpu"
	"github.com/rdzv/rdzv/agent/launchertest"
	"github.com/rdzv/rdzv/agent/netif"
	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/internal/testaddr"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	// waitTimeout only keeps a broken test from hanging; nothing here is
	// expected to take more than a few seconds.
	waitTimeout = 30 * time.Second
	pollEvery   = 20 * time.Millisecond

	heartbeatInterval = 100 * time.Millisecond
	heartbeatTimeout  = time.Second
	// vouchedFactor sets the vouched timeout in heartbeat timeouts.
	vouchedFactor  = 3
	vouchedTimeout = vouchedFactor * heartbeatTimeout

	masterPortMin = 41000
	masterPortMax = 41999
)

// fakeTorchrun stands in for torchrun. It records how it was launched in
// its working directory (the job's workdir, shared by every node here) in a
// file named <job>-<node>-<generation>, then acts out the job's command:
//
//	train.py ok               print a greeting and exit 0
//	train.py exit CODE        exit CODE
//	train.py hang             sleep until killed
//	train.py gate             wait until the file <job>.go appears, exit 0
//	train.py fail-on NODE CODE  once every node has started, exit CODE on
//	                          NODE and hang everywhere else
//
// The record is written to a temporary name first so a reader never sees
// half of it, and so fail-on can count the nodes that started.
var fakeTorchrun = `#!/bin/sh
rec="$PWD/$RDZV_JOB-$RDZV_NODE-$RDZV_GENERATION"
` + launchertest.Preamble("RDZV_[A-Z_]*|NCCL_SOCKET_IFNAME|GLOO_SOCKET_IFNAME|CUDA_VISIBLE_DEVICES|JOB_[A-Z_]*") + `nnodes=$2
shift 11
echo "hello from $RDZV_NODE rank $RDZV_NODE_RANK generation $RDZV_GENERATION"
case "$1" in
ok) exit 0 ;;
exit) exit "$2" ;;
hang) sleep 300 ;;
gate) while [ ! -e "$RDZV_JOB.go" ]; do sleep 0.05; done; exit 0 ;;
fail-on)
	[ "$RDZV_NODE" = "$2" ] || exec sleep 300
	while [ "$(ls "$RDZV_JOB"-*-"$RDZV_GENERATION" | wc -l)" -lt "$nnodes" ]; do sleep 0.05; done
	exit "$3"
	;;
*) echo "unknown mode $1" >&2; exit 99 ;;
esac
`

// cluster is one controller with embedded etcd, a set of in-process agents
// and API clients, all torn down with the test.
type cluster struct {
	t *testing.T
	// fakeGPUs is how many GPUs the fake agents connected from now on
	// have.
	fakeGPUs int
	cfg      controller.Config
	addr     string
	torchrun string
	// workdir is every job's working directory, where fakeTorchrun leaves
	// its records.
	workdir string

	// clock is the controller's clock when the test moves time itself
	// (newFakeClockCluster), nil on the wall clock. It carries over a
	// controller restart.
	clock *clockwork.FakeClock
	// lag is the controller's own lag as it measures it, set by the test,
	// on a fake clock (the machine's real scheduling means nothing there).
	lag atomic.Int64
	// gossip: fake agents connected from now on say they run gossip, so
	// that their assignments name peers to watch.
	gossip bool

	// wrapListener, if not nil, wraps the controller's listener.
	wrapListener func(net.Listener) net.Listener

	stopController func()
	// ctl is the running controller.
	ctl *controller.Controller
	// jobs, nodes and certs are an operator's clients.
	jobs  rdzvv1.JobServiceClient
	nodes rdzvv1.NodeServiceClient
	certs rdzvv1.CertificateServiceClient
	// logs holds every line the controller and the agents logged, at any
	// level; log is their logger.
	logs *observer.ObservedLogs
	log  *zap.Logger

	// ca issues every certificate of the cluster, into pkiDir: the
	// controller's, each agent's and the clients'; everything speaks
	// mutual TLS as in production.
	ca     *pki.CA
	pkiDir string
}

// runningAgent is an in-process agent; stop shuts it down as SIGTERM would.
type runningAgent struct {
	agent    *agent.Agent
	stateDir string
	stop     func()
}

// newCluster starts a controller; edits adjust its config first.
func newCluster(t *testing.T, edits ...func(*controller.Config)) *cluster {
	t.Helper()
	return startCluster(t, nil, nil, edits)
}

// newFakeClockCluster is newCluster with the controller on a fake clock
// that only advance moves: for tests that something does not happen
// before a deadline, which waiting in real time can never show on a
// loaded machine. The clock starts at the wall clock's time, since the
// certificates are issued against the wall clock and the controller
// judges their expiry by its own.
func newFakeClockCluster(t *testing.T, edits ...func(*controller.Config)) *cluster {
	t.Helper()
	return startCluster(t, clockwork.NewFakeClockAt(time.Now()), nil, edits)
}

// startCluster starts a cluster; wrap, if not nil, wraps the controller's
// listener.
func startCluster(t *testing.T, clock *clockwork.FakeClock, wrap func(net.Listener) net.Listener, edits []func(*controller.Config)) *cluster {
	t.Helper()
	c := &cluster{t: t, workdir: t.TempDir(), clock: clock, wrapListener: wrap}
	var observed zapcore.Core
	observed, c.logs = observer.New(zapcore.DebugLevel)
	c.log = zap.New(zapcore.NewTee(testLogger(t).Core(), observed))
	bin := t.TempDir()
	c.torchrun = filepath.Join(bin, "torchrun")
	require.NoError(t, os.WriteFile(c.torchrun, []byte(fakeTorchrun), 0o755))

	c.cfg = controller.DefaultConfig()
	c.cfg.DataDir = t.TempDir()
	c.cfg.Heartbeat.Interval.Duration = heartbeatInterval
	c.cfg.Heartbeat.Timeout.Duration = heartbeatTimeout
	// Set below from the heartbeat timeout, unless an edit sets it.
	c.cfg.Heartbeat.VouchedTimeout.Duration = 0
	c.cfg.MasterPortRange = controller.PortRange{Min: masterPortMin, Max: masterPortMax}
	c.addr = testaddr.Free(t)
	c.cfg.Listen = c.addr
	// Metrics and health on a port of the OS's choosing: tests run side
	// by side, and the default port is a running controller's.
	c.cfg.HTTP.Listen = "127.0.0.1:0"
	c.newCA()
	c.cfg.TLS.Files = c.issue(pki.Identity{Role: pki.RoleController, Name: "controller"}, net.IPv4(127, 0, 0, 1))
	for _, edit := range edits {
		edit(&c.cfg)
	}
	if c.cfg.Heartbeat.VouchedTimeout.Duration == 0 {
		c.cfg.Heartbeat.VouchedTimeout.Duration = vouchedFactor * c.cfg.Heartbeat.Timeout.Duration
	}
	c.startController()

	conn := c.dial(c.issue(pki.Identity{Role: pki.RoleOperator, Name: "test-operator"}))
	c.jobs, c.nodes = rdzvv1.NewJobServiceClient(conn), rdzvv1.NewNodeServiceClient(conn)
	c.certs = rdzvv1.NewCertificateServiceClient(conn)
	return c
}

// issue writes a certificate for id and returns the files a daemon or
// client is configured with. It is valid for longer than the controller
// warns of an expiry ahead (two weeks), so that only the tests about
// expiry see those warnings and their etcd writes.
func (c *cluster) issue(id pki.Identity, ips ...net.IP) pki.Files {
	c.t.Helper()
	files, _ := c.issueFor(id, 30*24*time.Hour, ips...)
	return files
}

// issueFor is issue with a validity, also returning the certificate: a
// later call for the same identity renews it in place.
func (c *cluster) issueFor(id pki.Identity, validFor time.Duration, ips ...net.IP) (pki.Files, *pki.Issued) {
	c.t.Helper()
	is, err := c.ca.Issue(pki.Request{Identity: id, IPs: ips, ValidFor: validFor, Now: time.Now()})
	require.NoError(c.t, err)
	cert, key, err := is.Save(pki.DefaultOut(c.pkiDir, id), true)
	require.NoError(c.t, err)
	return pki.Files{Cert: cert, Key: key, CA: filepath.Join(c.pkiDir, pki.CACertFile)}, is
}

// newCA creates the cluster CA that every certificate of the test chains to.
func (c *cluster) newCA() {
	c.pkiDir = c.t.TempDir()
	ca, err := pki.NewCA("test-ca", 365*24*time.Hour, time.Now())
	require.NoError(c.t, err)
	require.NoError(c.t, ca.Save(c.pkiDir, false))
	c.ca = ca
}

// dial connects to the controller with files, as the agent and rdzvctl do;
// the connection is closed with the test.
func (c *cluster) dial(files pki.Files) *grpc.ClientConn {
	c.t.Helper()
	r, err := pki.NewReloader(files, nil, testLogger(c.t))
	require.NoError(c.t, err)
	conf, err := r.ClientConfig(c.addr)
	require.NoError(c.t, err)
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
	require.NoError(c.t, err)
	c.t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// startController runs a controller on c's data directory and address; a
// second call after stopController is a controller restart.
func (c *cluster) startController() {
	t := c.t
	t.Helper()
	var opts []controller.Option
	if c.clock != nil {
		opts = append(opts, controller.WithClock(c.clock), controller.WithLag(func() time.Duration { return time.Duration(c.lag.Load()) }))
	}
	ctl, stop := runController(t, c.cfg, c.addr, c.wrapListener, c.log.Named("controller"), opts...)
	// Alone on its etcd it wins the election at once; the API serves only
	// from then on.
	poll(t, ctl.Leading, func() string { return "controller never took the lead" })
	c.ctl, c.stopController = ctl, stop
}

// runController runs a controller with cfg on addr, its listener wrapped
// by wrap unless nil, until the test ends, and returns once it serves;
// stop ends it earlier.
func runController(t *testing.T, cfg controller.Config, addr string, wrap func(net.Listener) net.Listener, log *zap.Logger, opts ...controller.Option) (ctl *controller.Controller, stop func()) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	if wrap != nil {
		lis = wrap(lis)
	}
	ctl, err = controller.New(cfg, log, append(opts, controller.WithListener(lis))...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctl.Run(ctx) }()
	select {
	case <-ctl.Ready():
	case err := <-done:
		cancel()
		require.NoError(t, err, "controller exited before serving")
	case <-time.After(waitTimeout):
		cancel()
		require.FailNow(t, "controller not ready")
	}
	require.Equal(t, addr, ctl.Addr().String())
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		require.NoError(t, <-done)
	}
	t.Cleanup(stop)
	return ctl, stop
}

// addAgent starts an agent named name with gpus fake GPUs, its
// configuration changed by opts. It returns once the controller lists the
// node as ready.
func (c *cluster) addAgent(name string, gpus int, labels map[string]string, opts ...func(*agent.Config)) *runningAgent {
	t := c.t
	t.Helper()
	cfg := agent.DefaultConfig()
	cfg.Controller = c.addr
	cfg.NodeName = name
	cfg.Labels = labels
	cfg.FakeGPUs = gpus
	cfg.StateDir = t.TempDir()
	// Not the node's /dev/shm: an agent's start frees what it finds there.
	cfg.MemoryCheckpointDir = t.TempDir()
	cfg.StopGrace.Duration = 2 * time.Second
	// Workers run as the test's user: they write into c.workdir.
	cfg.RunAs, cfg.AllowRoot = fmt.Sprintf("%d:%d", os.Geteuid(), os.Getegid()), true
	cfg.TLS = c.issue(pki.Identity{Role: pki.RoleAgent, Name: name})
	// Real gossip and checkpoint peer listeners between the in-process
	// agents, on ports the OS picks; metrics and health too.
	cfg.GossipPort, cfg.PeerPort = 0, 0
	cfg.HTTP.Listen = "127.0.0.1:0"
	for _, opt := range opts {
		opt(&cfg)
	}
	a, err := agent.New(cfg, c.log.Named(name), gpu.Fake{Count: gpus, Node: name}, loopbackOnly{}, agent.ExecSpawner{})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	ra := &runningAgent{agent: a, stateDir: cfg.StateDir, stop: func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		require.NoError(t, <-done, "agent %s", name)
	}}
	t.Cleanup(ra.stop)
	c.waitNode(name, func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_READY })
	return ra
}

// spec is a job for fakeTorchrun with no last call, so it commits as soon
// as min nodes are eligible.
func (c *cluster) spec(name string, min, max uint32, command ...string) *rdzvv1.JobSpec {
	return &rdzvv1.JobSpec{
		Name: name, NodesMin: min, NodesMax: max,
		Command: append([]string{"train.py"}, command...), Workdir: c.workdir,
		Env:                map[string]string{"JOB_VAR": "from-job"},
		LauncherTorchrun:   c.torchrun,
		RendezvousLastCall: durationpb.New(0),
	}
}

func (c *cluster) startJob(spec *rdzvv1.JobSpec) *rdzvv1.Job {
	c.t.Helper()
	resp, err := c.jobs.StartJob(rpcCtx(c.t), &rdzvv1.StartJobRequest{Spec: spec})
	require.NoError(c.t, err)
	return resp.GetJob()
}

func (c *cluster) getJob(name string) *rdzvv1.Job {
	c.t.Helper()
	resp, err := c.jobs.GetJob(rpcCtx(c.t), &rdzvv1.GetJobRequest{Name: name})
	require.NoError(c.t, err)
	return resp.GetJob()
}

func (c *cluster) stopJob(name string) *rdzvv1.Job {
	c.t.Helper()
	resp, err := c.jobs.StopJob(rpcCtx(c.t), &rdzvv1.StopJobRequest{Name: name})
	require.NoError(c.t, err)
	return resp.GetJob()
}

func (c *cluster) listJobs() []*rdzvv1.Job {
	c.t.Helper()
	resp, err := c.jobs.ListJobs(rpcCtx(c.t), &rdzvv1.ListJobsRequest{})
	require.NoError(c.t, err)
	return resp.GetJobs()
}

func (c *cluster) listNodes() map[string]*rdzvv1.Node {
	c.t.Helper()
	resp, err := c.nodes.ListNodes(rpcCtx(c.t), &rdzvv1.ListNodesRequest{})
	require.NoError(c.t, err)
	out := map[string]*rdzvv1.Node{}
	for _, n := range resp.GetNodes() {
		out[n.GetInfo().GetName()] = n
	}
	return out
}

// events lists a job's events, or the cluster's with job "".
func (c *cluster) events(job string) []*rdzvv1.Event {
	c.t.Helper()
	resp, err := c.jobs.ListEvents(rpcCtx(c.t), &rdzvv1.ListEventsRequest{Job: job})
	require.NoError(c.t, err)
	return resp.GetEvents()
}

// waitJob polls until cond holds for the job and returns it.
// waitEvent waits for an event of kind in job's history.
func (c *cluster) waitEvent(job, kind string) *rdzvv1.Event {
	c.t.Helper()
	var found *rdzvv1.Event
	poll(c.t, func() bool {
		for _, ev := range c.events(job) {
			if ev.GetKind() == kind {
				found = ev
				return true
			}
		}
		return false
	}, func() string { return fmt.Sprintf("no %s event for job %s", kind, job) })
	return found
}

func (c *cluster) waitJob(name string, cond func(*rdzvv1.Job) bool) *rdzvv1.Job {
	c.t.Helper()
	var last *rdzvv1.Job
	poll(c.t, func() bool { last = c.getJob(name); return cond(last) },
		func() string { return "job " + name + ": " + prototext.Format(last) })
	return last
}

func (c *cluster) waitJobState(name string, state rdzvv1.JobState) *rdzvv1.Job {
	c.t.Helper()
	return c.waitJob(name, func(j *rdzvv1.Job) bool { return j.GetState() == state })
}

// waitRunning waits until every assigned node reports its workers running,
// so what follows acts on live processes.
func (c *cluster) waitRunning(name string) *rdzvv1.Job {
	c.t.Helper()
	return c.waitJob(name, func(j *rdzvv1.Job) bool {
		if j.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING || len(j.GetAssignments()) == 0 {
			return false
		}
		for _, a := range j.GetAssignments() {
			if a.GetState() != rdzvv1.WorkerState_WORKER_STATE_RUNNING {
				return false
			}
		}
		return true
	})
}

func (c *cluster) waitNode(name string, cond func(*rdzvv1.Node) bool) *rdzvv1.Node {
	c.t.Helper()
	var last *rdzvv1.Node
	poll(c.t, func() bool { last = c.listNodes()[name]; return last != nil && cond(last) },
		func() string { return "node " + name + ": " + prototext.Format(last) })
	return last
}

// waitIdle waits until every named node is ready and runs nothing.
func (c *cluster) waitIdle(names ...string) {
	c.t.Helper()
	for _, name := range names {
		c.waitNode(name, func(n *rdzvv1.Node) bool {
			return n.GetState() == rdzvv1.NodeState_NODE_STATE_READY && n.GetJob() == ""
		})
	}
}

// release opens the gate of a job whose command is "gate".
func (c *cluster) release(job string) {
	require.NoError(c.t, os.WriteFile(filepath.Join(c.workdir, job+".go"), nil, 0o644))
}

// record is what fakeTorchrun saw on one node.
func (c *cluster) record(job, node string, generation uint64) launchertest.Record {
	c.t.Helper()
	path := filepath.Join(c.workdir, fmt.Sprintf("%s-%s-%d", job, node, generation))
	poll(c.t, func() bool { _, err := os.Stat(path); return err == nil }, func() string { return path + " never written" })
	r, err := launchertest.Read(path)
	require.NoError(c.t, err)
	return r
}

// hasRecord reports whether fakeTorchrun ever ran for job on node.
func (c *cluster) hasRecord(job, node string, generation uint64) bool {
	_, err := os.Stat(filepath.Join(c.workdir, fmt.Sprintf("%s-%s-%d", job, node, generation)))
	return err == nil
}

// etcdRevision is the embedded etcd's current revision, which moves with
// every write.
func (c *cluster) etcdRevision() int64 {
	c.t.Helper()
	c.settle()
	cli := c.etcdClient()
	resp, err := cli.Get(rpcCtx(c.t), "rdzv-test-probe")
	require.NoError(c.t, err)
	return resp.Header.Revision
}

// etcdKeys lists the keys under prefix in the embedded etcd.
func (c *cluster) etcdKeys(prefix string) []string {
	c.t.Helper()
	c.settle()
	resp, err := c.etcdClient().Get(rpcCtx(c.t), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(c.t, err)
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Key))
	}
	return out
}

// settle waits until the controller's decisions so far are durable: the
// API shows them as soon as they are made, etcd a write later.
func (c *cluster) settle() {
	c.t.Helper()
	require.NoError(c.t, controller.Settle(rpcCtx(c.t), c.ctl))
}

// advance moves the fake clock on by d and runs a liveness pass at the
// instant it reaches. It goes in steps of half the heartbeat timeout at
// most, and after each waits until every node in alive has been heard at
// the new instant (their agents heartbeat in real time), so that only the
// nodes left out fall silent; then it runs a pass there too.
func (c *cluster) advance(d time.Duration, alive ...string) {
	c.t.Helper()
	require.NotNil(c.t, c.clock, "advance needs a cluster on a fake clock (newFakeClockCluster)")
	step := c.cfg.Heartbeat.Timeout.Duration / 2
	for d > 0 {
		s := min(d, step)
		d -= s
		c.clock.Advance(s)
		now := c.clock.Now()
		for _, name := range alive {
			c.waitNode(name, func(n *rdzvv1.Node) bool { return !n.GetLastHeartbeat().AsTime().Before(now) })
		}
		c.checkLiveness()
	}
}

// checkLiveness runs a liveness pass at the controller's time now and
// waits until what it decided is durable: the liveness loop's own passes
// run at unknown moments, so a test that something was not decided needs
// one it knows has run.
func (c *cluster) checkLiveness() {
	c.t.Helper()
	controller.CheckLiveness(c.ctl)
	c.settle()
}

func (c *cluster) etcdClient() *clientv3.Client {
	c.t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{"unix://" + c.cfg.EmbeddedEtcdSocket()}, DialTimeout: 5 * time.Second,
		Logger: zaptest.NewLogger(c.t, zaptest.Level(zap.WarnLevel)),
	})
	require.NoError(c.t, err)
	c.t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// groupGone reports whether no live process is left in process group pgid.
// Zombies do not count: they hold nothing, and whether they are reaped
// depends on the init process of the machine running the tests.
func groupGone(pgid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range entries {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) >= 3 && fields[0] != "Z" && fields[0] != "X" && fields[2] == strconv.Itoa(pgid) {
			return false
		}
	}
	return true
}

func (c *cluster) waitGroupGone(pgid int) {
	c.t.Helper()
	poll(c.t, func() bool { return groupGone(pgid) }, func() string { return fmt.Sprintf("process group %d still has members", pgid) })
}

// poll checks cond until it holds; describe says what was last seen when it
// never does.
func poll(t *testing.T, cond func() bool, describe func() string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			require.FailNow(t, "condition not met within "+waitTimeout.String(), describe())
		}
		time.Sleep(pollEvery)
	}
}

func rpcCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func testLogger(t *testing.T) *zap.Logger { return zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)) }

// fakeAgent speaks the agent protocol from a script, for what a real agent
// never does on purpose: go silent, or vanish without reporting.
type fakeAgent struct {
	t      *testing.T
	name   string
	stream rdzvv1.AgentService_ConnectClient
	cancel context.CancelFunc
	msgs   chan *rdzvv1.ConnectResponse
	// sendMu serialises Send: a gRPC stream allows one sender at a time, and
	// keepAlive sends from its own goroutine.
	sendMu sync.Mutex
	ctx    context.Context
	// ended is closed when the stream has ended, with endErr why.
	ended  chan struct{}
	endErr error
	// acks carries the sequence numbers of heartbeat acknowledgements.
	acks chan uint64
	// probes counts the master port probes answered.
	probes atomic.Int32
}

// waitEnd waits for the controller to end the stream and returns how. Only
// the receiving goroutine calls Recv: gRPC allows one receiver at a time.
func (f *fakeAgent) waitEnd() error {
	f.t.Helper()
	select {
	case <-f.ended:
		return f.endErr
	case <-time.After(waitTimeout):
		require.FailNow(f.t, "the controller never ended the stream of "+f.name)
		return nil
	}
}

// connectFake registers a node named name with no GPUs on loopback, running
// workers (as an agent that adopted them reports).
func (c *cluster) connectFake(name string, workers ...*rdzvv1.WorkerStatus) *fakeAgent {
	c.t.Helper()
	return c.connectFakeWith(c.issue(pki.Identity{Role: pki.RoleAgent, Name: name}), name, workers...)
}

// connectFakeWith is connectFake presenting the certificate in files.
func (c *cluster) connectFakeWith(files pki.Files, name string, workers ...*rdzvv1.WorkerStatus) *fakeAgent {
	c.t.Helper()
	return c.connectFakeOn(rdzvv1.NewAgentServiceClient(c.dial(files)), name, workers...)
}

// connectFakeOn is connectFake on an agent service: the controller's, or
// a relay's (dialRelay).
func (c *cluster) connectFakeOn(agents rdzvv1.AgentServiceClient, name string, workers ...*rdzvv1.WorkerStatus) *fakeAgent {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := agents.Connect(ctx)
	require.NoError(t, err)
	f := &fakeAgent{t: t, name: name, stream: stream, cancel: cancel, msgs: make(chan *rdzvv1.ConnectResponse, 64), acks: make(chan uint64, 64)}
	f.ctx = ctx
	// The register goes before the first receive: a stream through
	// package client (a relay's, dialRelay) finds its server on that
	// receive, with what was sent before it.
	info := &rdzvv1.NodeInfo{Name: name, Address: "127.0.0.1", NcclInterface: "lo", AgentVersion: "fake"}
	for i := range c.fakeGPUs {
		info.Gpus = append(info.Gpus, &rdzvv1.GPU{Index: uint32(i)})
	}
	if c.gossip {
		// Nothing listens there: the controller only hands it to peers.
		info.GossipAddr = "127.0.0.1:7946"
	}
	f.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: info, Workers: workers}}})
	received := make(chan struct{})
	f.ended = received
	go func() {
		defer close(received)
		defer close(f.msgs)
		for {
			m, err := stream.Recv()
			if err != nil {
				f.endErr = err
				return
			}
			if ack := m.GetHeartbeatAck(); ack != nil {
				select {
				case f.acks <- ack.GetSeq():
				default: // nobody is looking for acks (keepAlive's)
				}
				continue
			}
			if probe := m.GetPortProbe(); probe != nil {
				// Answered here, as a real agent does, so scripts only see
				// what they act on.
				f.probes.Add(1)
				f.sendMu.Lock()
				_ = stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_PortProbeResult{PortProbeResult: &rdzvv1.PortProbeResult{
					RequestId: probe.GetRequestId(), Port: probe.GetPortMin(),
				}}})
				f.sendMu.Unlock()
				continue
			}
			f.msgs <- m
		}
	}()
	t.Cleanup(func() {
		f.crash()
		<-received
	})
	require.NotNil(t, f.next().GetRegistered())
	return f
}

func (f *fakeAgent) send(m *rdzvv1.ConnectRequest) {
	f.t.Helper()
	f.sendMu.Lock()
	defer f.sendMu.Unlock()
	require.NoError(f.t, f.stream.Send(m))
}

// keepAlive heartbeats until the agent crashes, so a scripted agent in a
// longer test is not declared lost.
func (f *fakeAgent) keepAlive() {
	ctx := f.ctx
	go func() {
		ticker := time.NewTicker(heartbeatInterval)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				f.sendMu.Lock()
				err := f.stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{}}})
				f.sendMu.Unlock()
				if err != nil {
					return
				}
			}
		}
	}()
}

// heartbeat sends one heartbeat and waits for the controller to
// acknowledge it.
func (f *fakeAgent) heartbeat(seq uint64) {
	f.t.Helper()
	f.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: seq}}})
	timeout := time.After(waitTimeout)
	for {
		select {
		case got := <-f.acks:
			if got == seq {
				return
			}
		case <-timeout:
			require.FailNow(f.t, "heartbeat not acknowledged", "%s seq %d", f.name, seq)
		}
	}
}

// report sends a worker status for an assignment.
func (f *fakeAgent) report(a *rdzvv1.Assignment, state rdzvv1.WorkerState, exitCode int32) {
	f.t.Helper()
	f.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_WorkerStatus{WorkerStatus: &rdzvv1.WorkerStatus{
		Job: a.GetSpec().GetName(), Generation: a.GetGeneration(), State: state, ExitCode: exitCode,
		ExitedAt: timestamppb.Now(),
	}}})
}

// expectStop waits for the order to stop a generation, acknowledges it and
// returns it.
func (f *fakeAgent) expectStop(a *rdzvv1.Assignment) *rdzvv1.StopWorkers {
	f.t.Helper()
	stop := f.next().GetStopWorkers()
	require.NotNil(f.t, stop, "expected %s to be told to stop", f.name)
	require.Equal(f.t, a.GetGeneration(), stop.GetGeneration())
	f.report(a, rdzvv1.WorkerState_WORKER_STATE_STOPPED, -1)
	return stop
}

// next is the next message from the controller.
func (f *fakeAgent) next() *rdzvv1.ConnectResponse {
	f.t.Helper()
	select {
	case m, ok := <-f.msgs:
		require.True(f.t, ok, "controller closed the stream of %s", f.name)
		return m
	case <-time.After(waitTimeout):
		require.FailNow(f.t, "no message for "+f.name)
		return nil
	}
}

// run waits for an assignment and reports its workers running.
func (f *fakeAgent) run() *rdzvv1.Assignment {
	f.t.Helper()
	m := f.next()
	a := m.GetAssignment()
	require.NotNil(f.t, a, "expected an assignment for %s, got %v", f.name, m)
	f.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_WorkerStatus{WorkerStatus: &rdzvv1.WorkerStatus{
		Job: a.GetSpec().GetName(), Generation: a.GetGeneration(), State: rdzvv1.WorkerState_WORKER_STATE_RUNNING,
	}}})
	return a
}

// crash drops the stream without a word, as a killed agent process does.
func (f *fakeAgent) crash() { f.cancel() }

// closed reports whether the controller ended the stream.
func (f *fakeAgent) closed() bool {
	for {
		select {
		case _, ok := <-f.msgs:
			if !ok {
				return true
			}
		default:
			return false
		}
	}
}

// loopbackOnly is a machine whose only interface is lo, as an agent sees a
// host in a single-machine test: the NCCL interface falls back to lo.
type loopbackOnly struct{}

func (loopbackOnly) Interfaces() ([]netif.Interface, error) {
	return []netif.Interface{{
		Name: "lo", Index: 1, Kind: netif.KindLoopback, Up: true, MTU: 65536,
		Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")},
	}}, nil
}

func (loopbackOnly) DefaultRouteInterface() (string, error) {
	return "", errors.New("no default route")
}

func (loopbackOnly) InterfaceFacing(string) (string, error) { return "lo", nil }
