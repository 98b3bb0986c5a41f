package controller_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/controller/keyring"
	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/internal/testaddr"
	"github.com/rdzv/rdzv/internal/testetcd"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// replica is one controller of a replicated cluster.
type replica struct {
	ctl  *controller.Controller
	addr string
	stop func()
}

// haCluster is controller replicas on one etcd, with the cluster helpers
// (agents, jobs) talking to all of them: clients find the leader.
type haCluster struct {
	*cluster
	etcd     string
	replicas []*replica
	// keys is the secrets key file every replica shares.
	keys string
}

func newHACluster(t *testing.T, replicas int) *haCluster {
	t.Helper()
	endpoint, _ := testetcd.Start(t, "ha-test")
	c := &cluster{t: t, workdir: t.TempDir()}
	c.torchrun = filepath.Join(t.TempDir(), "torchrun")
	require.NoError(t, os.WriteFile(c.torchrun, []byte(fakeTorchrun), 0o755))
	c.log = testLogger(t)
	c.newCA()
	h := &haCluster{cluster: c, etcd: endpoint, keys: filepath.Join(t.TempDir(), "secrets.key")}
	require.NoError(t, keyring.Create(h.keys, time.Now()))
	var addrs []string
	for range replicas {
		addr := testaddr.Free(t)
		addrs = append(addrs, addr)
		h.replicas = append(h.replicas, h.startReplica(addr))
	}
	h.clients(addrs...)
	return h
}

// clients points agents started from now on, and the API helpers, at
// addrs in this order.
func (h *haCluster) clients(addrs ...string) {
	h.addr = strings.Join(addrs, ",")
	cfg := client.DefaultConfig()
	cfg.Endpoints, cfg.Logger = addrs, testLogger(h.t).Named("client")
	cfg.TLS = &client.TLS{Files: h.issue(pki.Identity{Role: pki.RoleOperator, Name: "ops"})}
	c, err := client.New(cfg)
	require.NoError(h.t, err)
	h.t.Cleanup(func() { _ = c.Close() })
	h.jobs, h.nodes = c, c
}

func (h *haCluster) startReplica(addr string) *replica {
	t := h.t
	t.Helper()
	cfg := controller.DefaultConfig()
	cfg.Etcd.Endpoints = []string{h.etcd}
	cfg.SecretsKeyFile = h.keys
	cfg.Listen, cfg.AdvertiseAddr = addr, addr
	cfg.HTTP.Listen = "127.0.0.1:0"
	cfg.LeaderLeaseTTL.Duration = 2 * time.Second
	cfg.Etcd.RequestTimeout.Duration = 2 * time.Second
	cfg.Heartbeat.Interval.Duration = heartbeatInterval
	cfg.Heartbeat.Timeout.Duration = heartbeatTimeout
	cfg.Heartbeat.VouchedTimeout.Duration = vouchedTimeout
	cfg.MasterPortRange = controller.PortRange{Min: masterPortMin, Max: masterPortMax}
	cfg.TLS.Files = h.issue(pki.Identity{Role: pki.RoleController, Name: "controller-" + strings.ReplaceAll(strings.ReplaceAll(addr, ".", "-"), ":", "-")}, net.IPv4(127, 0, 0, 1))
	h.cfg = cfg
	ctl, stop := runController(t, cfg, addr, nil, testLogger(t).Named("controller-"+addr))
	return &replica{ctl: ctl, addr: addr, stop: stop}
}

// leader waits until exactly one replica leads and returns it.
func (h *haCluster) leader(except ...*replica) *replica {
	h.t.Helper()
	var lead *replica
	poll(h.t, func() bool {
		lead = nil
		n := 0
		for _, r := range h.replicas {
			skip := false
			for _, e := range except {
				skip = skip || e == r
			}
			if !skip && r.ctl.Leading() {
				lead, n = r, n+1
			}
		}
		return n == 1
	}, func() string { return "no single leader" })
	return lead
}

// refusal is what a replica answers a direct call with.
func refusal(t *testing.T, c *cluster, addr string) (reason, leader string) {
	t.Helper()
	r, err := pki.NewReloader(c.issue(pki.Identity{Role: pki.RoleViewer, Name: "direct"}), nil, testLogger(t))
	require.NoError(t, err)
	conf, err := r.ClientConfig(addr)
	require.NoError(t, err)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(conf)))
	require.NoError(t, err)
	defer conn.Close()
	_, err = rdzvv1.NewJobServiceClient(conn).ListJobs(rpcCtx(t), &rdzvv1.ListJobsRequest{})
	require.Error(t, err, "%s serves although it does not lead", addr)
	reason, leader, ok := wire.Parse(err)
	require.True(t, ok, "not a controller's refusal: %v", err)
	return reason, leader
}

func leaderEvents(c *cluster) []*rdzvv1.Event {
	var out []*rdzvv1.Event
	for _, e := range c.events("") {
		if e.GetKind() == controller.EventLeaderElected {
			out = append(out, e)
		}
	}
	return out
}

// The leader goes away mid-job: the follower takes over, the agents (given
// the follower first) reconnect to it, and the job carries on in the same
// generation to its end, with no attempt failed.
func TestFailoverKeepsJobRunning(t *testing.T) {
	h := newHACluster(t, 2)
	first := h.leader()
	follower := h.replicas[0]
	if follower == first {
		follower = h.replicas[1]
	}
	// The follower learns who leads from etcd's watch, a moment after the
	// leader knows: until then it refuses with no leader to name.
	var reason, hint string
	require.Eventually(t, func() bool {
		reason, hint = refusal(t, h.cluster, follower.addr)
		return reason != wire.ReasonNoLeader
	}, waitTimeout, 20*time.Millisecond, "the follower never learned who leads")
	require.Equal(t, wire.ReasonNotLeader, reason)
	require.Equal(t, first.addr, hint, "the follower names the leader")
	// Follower first: agents and API calls must follow its redirect.
	h.clients(follower.addr, first.addr)

	h.addAgent("node-a", 0, nil)
	h.addAgent("node-b", 0, nil)
	h.startJob(h.spec("train", 2, 2, "gate"))
	before := h.waitRunning("train")

	begin := time.Now()
	first.stop()
	require.Equal(t, running, h.getJob("train").GetState(), "a call made during the election waits for its end")
	require.Same(t, follower, h.leader(first))
	t.Logf("follower leads %s after the leader stopped", time.Since(begin).Round(time.Millisecond))
	// Both agents reconnect to it and the job is still the same generation.
	h.waitJob("train", func(j *rdzvv1.Job) bool {
		return j.GetState() == running && j.GetGeneration() == before.GetGeneration() && len(j.GetAssignments()) == 2 &&
			j.GetAssignments()[0].GetState() == rdzvv1.WorkerState_WORKER_STATE_RUNNING &&
			j.GetAssignments()[1].GetState() == rdzvv1.WorkerState_WORKER_STATE_RUNNING
	})
	for _, n := range []string{"node-a", "node-b"} {
		h.waitNode(n, func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_BUSY })
	}
	elected := leaderEvents(h.cluster)
	require.Len(t, elected, 2, "one election per lead")
	require.Contains(t, elected[1].GetMessage(), "controller "+follower.addr+" leads (previous leader: "+first.addr+")")

	h.release("train")
	j := h.waitJobState("train", succeeded)
	require.Equal(t, before.GetGeneration(), j.GetGeneration(), "no restart across the failover")
	kinds := eventKinds(h.events("train"))
	require.NotContains(t, kinds, "attempt_failed")
	// The agents report their running workers again to the new leader;
	// the generation's phases are still written once each.
	for _, kind := range []string{controller.EventWorkersRunning, controller.EventWorkersExited} {
		n := 0
		for _, k := range kinds {
			if k == kind {
				n++
			}
		}
		require.Equal(t, 1, n, "%s events: %v", kind, kinds)
	}
}

// A leader whose lease is gone (expired, revoked) stops leading at once,
// refuses calls from then on naming the new leader, and stands by.
func TestLeaseLossStepsDown(t *testing.T) {
	h := newHACluster(t, 2)
	first := h.leader()
	h.addAgent("node-a", 0, nil)

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{h.etcd}, DialTimeout: 5 * time.Second,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	require.NoError(t, err)
	defer cli.Close()
	resp, err := cli.Get(rpcCtx(t), store.CandidatesPrefix(), clientv3.WithFirstCreate()...)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, first.addr, string(resp.Kvs[0].Value))
	_, err = cli.Revoke(rpcCtx(t), clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)

	second := h.leader(first)
	poll(t, func() bool { return !first.ctl.Leading() }, func() string { return "deposed leader still leads" })
	poll(t, func() bool {
		reason, hint := refusal(t, h.cluster, first.addr)
		return reason == wire.ReasonNotLeader && hint == second.addr
	}, func() string { return "the deposed leader does not redirect to the new one" })
	// It campaigns again, as a follower.
	poll(t, func() bool {
		resp, err := cli.Get(rpcCtx(t), store.CandidatesPrefix(), clientv3.WithPrefix())
		return err == nil && len(resp.Kvs) == 2
	}, func() string { return "the deposed leader is not a candidate again" })
	h.waitNode("node-a", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_READY })
}

// Without etcd nobody can lead: the controller refuses calls saying so, and
// serves again once etcd is back.
func TestEtcdDownRefusesClearly(t *testing.T) {
	endpoint, stopEtcd := testetcd.Start(t, "ha-test")
	c := &cluster{t: t}
	c.log = testLogger(t)
	c.newCA()
	h := &haCluster{cluster: c, etcd: endpoint, keys: filepath.Join(t.TempDir(), "secrets.key")}
	require.NoError(t, keyring.Create(h.keys, time.Now()))
	r := h.startReplica(testaddr.Free(t))
	h.replicas = append(h.replicas, r)
	h.leader()
	stopEtcd()
	poll(t, func() bool { return !r.ctl.Leading() }, func() string { return "still leading without etcd" })
	poll(t, func() bool {
		reason, _ := refusal(t, h.cluster, r.addr)
		return reason == wire.ReasonEtcdUnavailable
	}, func() string { return "no etcd-unavailable refusal" })
}
