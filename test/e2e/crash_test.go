package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/health"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/test/netns"
	"github.com/rdzv/rdzv/test/sim"
)

const (
	crashNodes = 1000
	crashJob   = "crash"
	// crashCap ends a hung run; it is no timing target.
	crashCap = 5 * time.Minute
)

// crashHeartbeat: the agents say they run gossip and no peer reports the
// victim unreachable, so the controller must assume its peers vouch for it
// and that, merely cut off, it trains on for the vouched timeout: its
// fencing deadline is long after it is declared lost, after the crashed
// controller's successor leads (once the dead one's leader lease of 5s has
// expired), which must still wait for it.
//
// The timeout is 5s, not the benchmark's 3s: this process runs the 1,000
// agents on a machine shared with other work, and a healthy node declared
// lost because its simulation was starved moves the job on again.
var crashHeartbeat = health.Heartbeat{Interval: time.Second, Timeout: 5 * time.Second, Vouched: 20 * time.Second}

// TestControllerCrashMidRecovery runs the real controller (embedded etcd,
// mutual TLS) with 1,000 simulated agents (package test/sim) and a job
// over all of them, silences one node, and SIGKILLs the controller three
// times during the recovery: when the survivors' first STOPPED reports of
// the failed generation are acknowledged, as soon as the next
// generation's round is stored, and when the first RUNNING reports of the
// next generation are acknowledged. Each time it restarts the controller
// on the same data directory and, before any agent reconnects, checks
// that everything the dead controller let out rests on durable state
// (every assignment on its stored round, every stop order on a stored
// decision). At the end: the job runs the next generation on every
// survivor and nothing else (no generation lost or reused across the
// crashes), every report a controller acknowledged is reflected in the
// stored state, no node got the next generation before every node had
// stopped the previous one, nor before the silent node's fencing
// deadline.
func TestControllerCrashMidRecovery(t *testing.T) {
	// Registered first, so it runs last, when every process and agent has
	// been stopped.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	binDir := os.Getenv("RDZV_BIN_DIR")
	if binDir == "" {
		netns.SkipOrFail(t, "e2e: RDZV_BIN_DIR is not set: run `make e2e`, or `make build` and set RDZV_BIN_DIR to the bin directory")
	}
	bin, err := filepath.Abs(filepath.Join(binDir, "rdzv-controller"))
	require.NoError(t, err)
	if info, err := os.Stat(bin); err != nil || info.Mode()&0o111 == 0 {
		netns.SkipOrFail(t, "e2e: %s is missing or not executable: run `make build`", bin)
	}
	if err := sim.RaiseNoFile(crashNodes*2 + 4096); err != nil {
		netns.SkipOrFail(t, "e2e: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), crashCap)
	defer cancel()
	dir := t.TempDir()
	certs, err := sim.LoadCerts(filepath.Join(dir, "pki"), crashNodes)
	require.NoError(t, err)
	ctl, err := sim.StartController(sim.ControllerConfig{Bin: bin, Dir: dir, Certs: certs, Heartbeat: crashHeartbeat})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctl.Stop()
		if t.Failed() {
			t.Logf("controller log (%s), last lines:\n%s", ctl.LogPath, ctl.Tail(30))
		}
		if dir := os.Getenv("RDZV_TEST_ARTIFACTS"); dir != "" {
			if data, err := os.ReadFile(ctl.LogPath); err == nil && os.MkdirAll(dir, 0o755) == nil {
				path := filepath.Join(dir, "crash-controller.log")
				if err := os.WriteFile(path, data, 0o644); err == nil {
					t.Logf("controller log kept in %s", path)
				}
			}
		}
	})
	op, err := certs.OperatorClient(ctl.Addr)
	require.NoError(t, err)
	defer op.Close()
	require.NoError(t, ctl.WaitLeading(ctx, op))

	rec := newCrashRecord()
	gate := sim.NewGate()
	agents := make([]*sim.Agent, crashNodes)
	for i := range agents {
		agents[i], err = sim.NewAgent(ctx, sim.AgentConfig{Index: i, Controller: ctl.Addr, Cert: certs.Agents[i], Roots: certs.Roots,
			Observe: rec.observe, Gate: gate, Gossip: true})
		require.NoError(t, err)
	}
	defer func() {
		var wg sync.WaitGroup
		for _, a := range agents {
			wg.Add(1)
			go func() { defer wg.Done(); a.Stop() }()
		}
		wg.Wait()
	}()
	began := time.Now()
	for _, a := range agents {
		a.Start(ctx)
	}
	// Every node ready first: on a loaded machine the registration storm
	// may cost a healthy node or two, which come back.
	require.NoError(t, sim.WaitFor(ctx, "every node ready", func() (bool, string) {
		st, err := readStored(ctx, ctl)
		if err != nil {
			return false, err.Error()
		}
		ready := 0
		for _, n := range st.nodes {
			if n.GetState() == rdzvv1.NodeState_NODE_STATE_READY {
				ready++
			}
		}
		return ready == crashNodes, fmt.Sprintf("%d of %d", ready, crashNodes)
	}))
	t.Logf("crash: %d agents registered in %s", crashNodes, time.Since(began).Round(time.Millisecond))

	spec, err := jobspec.Parse(fmt.Appendf(nil, `name: %s
nodes: {min: %d, max: %d}
command: [train.py]
rendezvous: {last_call: 0s, timeout: 0s}
restart: {max_restarts: 3, backoff: {initial: 100ms, max: 1s}}
`, crashJob, crashNodes-crashNodes/10, crashNodes))
	require.NoError(t, err)
	require.NoError(t, spec.Validate())
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	rec.resetDropped() // a controller that steps down while the nodes register costs the job nothing
	_, err = op.StartJob(sctx, &rdzvv1.StartJobRequest{Spec: spec.ToProto()})
	scancel()
	require.NoError(t, err)
	first := rec.firstAssignment(ctx, 1)
	require.NotNil(t, first, "no assignment of generation 1")
	size := int(first.GetNnodes())
	require.NoError(t, rec.waitAcked(ctx, rdzvv1.WorkerState_WORKER_STATE_RUNNING, 1, size))
	t.Logf("crash: generation 1 running on %d nodes", size)

	// Kill 1: the failed generation is being stopped. The victim is the
	// last rank: never the master.
	stopping := rec.whenAcked(rdzvv1.WorkerState_WORKER_STATE_STOPPED, 1, size/4)
	victim := agents[slices.IndexFunc(agents, func(a *sim.Agent) bool { return a.Name() == rec.lastRank(1) })]
	victim.Silence()
	silentFrom := victim.LastSent()
	crashAndRestart(ctx, t, ctl, op, gate, rec, stopping, "after the first STOPPED reports of generation 1 were acknowledged")

	// Kill 2: the next generation is committed, its assignments about to
	// leave.
	crashAndRestart(ctx, t, ctl, op, gate, rec, whenStored(ctx, t, ctl, store.RoundKey(crashJob, 2)), "once the round of generation 2 was stored")

	// Kill 3: the next generation is starting.
	starting := rec.whenAcked(rdzvv1.WorkerState_WORKER_STATE_RUNNING, 2, size/2)
	crashAndRestart(ctx, t, ctl, op, gate, rec, starting, "after the first RUNNING reports of generation 2 were acknowledged")

	// The job runs again: its round's every node runs its generation.
	var final *storedState
	require.NoError(t, sim.WaitFor(ctx, "the job running again", func() (bool, string) {
		var err error
		if final, err = readStored(ctx, ctl); err != nil {
			return false, err.Error()
		}
		gen := final.job.GetGeneration()
		round := final.rounds[gen].GetNodes()
		running := 0
		for _, n := range round {
			w := final.workers[n.GetNode()]
			a := agents[slices.IndexFunc(agents, func(a *sim.Agent) bool { return a.Name() == n.GetNode() })]
			if w.GetGeneration() == gen && w.GetState() == rdzvv1.WorkerState_WORKER_STATE_RUNNING && a.Running().GetGeneration() == gen {
				running++
			}
		}
		return gen >= 2 && final.job.GetState() == rdzvv1.JobState_JOB_STATE_RUNNING && running == len(round),
			fmt.Sprintf("job %s in generation %d, %d of its %d nodes running it", final.job.GetState(), gen, running, len(round))
	}))
	t.Logf("crash: generation %d running on %d nodes %s after the victim went silent", final.job.GetGeneration(),
		len(final.rounds[final.job.GetGeneration()].GetNodes()), time.Since(silentFrom).Round(time.Millisecond))

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.dropped) == 0 {
		require.Equal(t, uint64(2), final.job.GetGeneration(), "the crashes must not cost a generation: nothing failed but the victim")
	} else {
		// Healthy nodes declared lost on an overloaded machine move the
		// job on too.
		for why, n := range rec.dropped {
			t.Logf("crash: %d sessions of live agents ended: %s", n, why)
		}
	}
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_LOST, final.nodes[victim.Name()].GetState())
	require.NotContains(t, nodesOf(final.rounds[2]), victim.Name())
	rec.checkDurable(t, final)
	rec.checkGenerations(t, final)
	rec.checkReflected(t, final)
	rec.checkFencing(t, silentFrom.Add(crashHeartbeat.SelfFenceDeadline(false)))
}

func nodesOf(r *rdzvv1.Round) []string {
	var out []string
	for _, n := range r.GetNodes() {
		out = append(out, n.GetNode())
	}
	return out
}

// crashAndRestart SIGKILLs the controller as soon as trigger fires,
// restarts it on the same data directory with the agents held back, checks
// that what the dead controller let out is durable, then lets the agents
// reconnect.
func crashAndRestart(ctx context.Context, t *testing.T, ctl *sim.Controller, op *client.Client, gate *sim.Gate, rec *crashRecord, trigger <-chan struct{}, when string) {
	t.Helper()
	select {
	case <-trigger:
	case <-ctx.Done():
		t.Fatalf("crash %s: %v", when, ctx.Err())
	}
	gate.Close()
	rec.setDown(true)
	ctl.Kill()
	life := rec.nextLife()
	t.Logf("crash %d: controller killed %s (%s)", life, when, rec.summary())
	require.NoError(t, ctl.Restart())
	require.NoError(t, ctl.WaitLeading(ctx, op))
	rec.setDown(false)
	st, err := readStored(ctx, ctl)
	require.NoError(t, err)
	rec.mu.Lock()
	rec.checkDurable(t, st)
	rec.mu.Unlock()
	t.Logf("crash %d: the restarted controller leads; what the killed one let out is durable (job %s in generation %d)", life, st.job.GetState(), st.job.GetGeneration())
	gate.Open()
}

// whenStored fires once key is in the controller's etcd.
func whenStored(ctx context.Context, t *testing.T, ctl *sim.Controller, key string) <-chan struct{} {
	t.Helper()
	endpoint, err := ctl.EtcdEndpoint()
	require.NoError(t, err)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	fired := make(chan struct{})
	wctx, cancel := context.WithCancel(ctx)
	resp, err := cli.Get(wctx, key)
	if err != nil || len(resp.Kvs) > 0 {
		cancel()
		cli.Close()
		require.NoError(t, err)
		close(fired)
		return fired
	}
	wch := cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1))
	go func() {
		defer cli.Close()
		defer cancel()
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					close(fired)
					return
				}
			}
			if wr.Err() != nil {
				return
			}
		}
	}()
	return fired
}

// storedState is what etcd holds of the job and the nodes.
type storedState struct {
	job     *rdzvv1.Job
	rounds  map[uint64]*rdzvv1.Round
	workers map[string]*rdzvv1.WorkerStatus
	nodes   map[string]*rdzvv1.Node
}

func readStored(ctx context.Context, ctl *sim.Controller) (*storedState, error) {
	endpoint, err := ctl.EtcdEndpoint()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, store.Prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	st := &storedState{job: &rdzvv1.Job{}, rounds: map[uint64]*rdzvv1.Round{}, workers: map[string]*rdzvv1.WorkerStatus{}, nodes: map[string]*rdzvv1.Node{}}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		var m proto.Message
		var put func()
		if key == store.JobKey(crashJob) {
			m = st.job
		} else if _, ok := strings.CutPrefix(key, store.RoundsPrefix(crashJob)); ok {
			r := &rdzvv1.Round{}
			m, put = r, func() { st.rounds[r.GetGeneration()] = r }
		} else if node, ok := strings.CutPrefix(key, store.WorkersPrefix(crashJob)); ok {
			w := &rdzvv1.WorkerStatus{}
			m, st.workers[node] = w, w
		} else if node, ok := strings.CutPrefix(key, store.NodesPrefix()); ok {
			n := &rdzvv1.Node{}
			m, st.nodes[node] = n, n
		} else {
			continue
		}
		if err := proto.Unmarshal(kv.Value, m); err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		if put != nil {
			put()
		}
	}
	return st, nil
}

// seen is one order an agent got: when (in the record's causal order) and
// from which controller life (0: before the first crash).
type seen struct {
	node  string
	order uint64
	life  int
	asg   *rdzvv1.Assignment
	stop  *rdzvv1.StopWorkers
}

type ackKey struct {
	state rdzvv1.WorkerState
	gen   uint64
}

// crashRecord is what the agents saw, observed as it happened
// (sim.Observer). order numbers every event: an event that caused another
// (a STOPPED report, the next generation's assignment) has the lower
// number.
type crashRecord struct {
	order atomic.Uint64

	mu   sync.Mutex
	life int
	// down is set while a controller is dead; dropped counts the sessions
	// of live agents that ended otherwise: the controller dropped them.
	down        bool
	dropped     map[string]int // by why
	acked       map[ackKey]int
	triggers    map[ackKey][]trigger
	reports     map[string][]*rdzvv1.WorkerStatus // acknowledged, per node
	assignments []seen
	stops       []seen
	taken       map[uint64]map[string]uint64 // generation → node → order its workers started
	ended       map[uint64]map[string]uint64 // generation → node → order its workers ended
	firstAsgAt  map[uint64]time.Time         // generation → first assignment taken
}

type trigger struct {
	n  int
	ch chan struct{}
}

func newCrashRecord() *crashRecord {
	return &crashRecord{acked: map[ackKey]int{}, triggers: map[ackKey][]trigger{}, reports: map[string][]*rdzvv1.WorkerStatus{},
		dropped: map[string]int{}, taken: map[uint64]map[string]uint64{}, ended: map[uint64]map[string]uint64{}, firstAsgAt: map[uint64]time.Time{}}
}

func (r *crashRecord) observe(e sim.Event) {
	order := r.order.Add(1)
	node := e.Agent.Name()
	r.mu.Lock()
	defer r.mu.Unlock()
	switch e.Kind {
	case sim.SessionEnded:
		if !r.down {
			r.dropped[e.Err.Error()]++
		}
	case sim.Assignment:
		r.assignments = append(r.assignments, seen{node: node, order: order, life: r.life, asg: e.Assignment})
		if e.Taken {
			mark(r.taken, e.Gen, node, order)
			if _, ok := r.firstAsgAt[e.Gen]; !ok {
				r.firstAsgAt[e.Gen] = e.At
			}
		}
	case sim.StopOrder:
		r.stops = append(r.stops, seen{node: node, order: order, life: r.life, stop: e.Stop})
	case sim.WorkersEnded:
		mark(r.ended, e.Gen, node, order)
	case sim.ReportAcked:
		r.reports[node] = append(r.reports[node], e.Report)
		k := ackKey{e.Report.GetState(), e.Gen}
		r.acked[k]++
		for _, tr := range r.triggers[k] {
			if r.acked[k] == tr.n {
				close(tr.ch)
			}
		}
	}
}

func mark(m map[uint64]map[string]uint64, gen uint64, node string, order uint64) {
	if m[gen] == nil {
		m[gen] = map[string]uint64{}
	}
	if _, ok := m[gen][node]; !ok {
		m[gen][node] = order
	}
}

// firstAssignment waits for the first assignment of generation gen.
func (r *crashRecord) firstAssignment(ctx context.Context, gen uint64) *rdzvv1.Assignment {
	var first *rdzvv1.Assignment
	_ = sim.WaitFor(ctx, "an assignment", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, s := range r.assignments {
			if s.asg.GetGeneration() == gen {
				first = s.asg
				return true, ""
			}
		}
		return false, ""
	})
	return first
}

// lastRank is the node of the highest rank in generation gen, of those
// assigned so far.
func (r *crashRecord) lastRank(gen uint64) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	node, rank := "", -1
	for _, s := range r.assignments {
		if s.asg.GetGeneration() == gen && int(s.asg.GetNodeRank()) > rank {
			node, rank = s.node, int(s.asg.GetNodeRank())
		}
	}
	return node
}

// whenAcked fires once n reports of state in generation gen have been
// acknowledged.
func (r *crashRecord) whenAcked(state rdzvv1.WorkerState, gen uint64, n int) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := ackKey{state, gen}
	ch := make(chan struct{})
	if r.acked[k] >= n {
		close(ch)
	} else {
		r.triggers[k] = append(r.triggers[k], trigger{n: n, ch: ch})
	}
	return ch
}

func (r *crashRecord) waitAcked(ctx context.Context, state rdzvv1.WorkerState, gen uint64, n int) error {
	select {
	case <-r.whenAcked(state, gen, n):
		return nil
	case <-ctx.Done():
		r.mu.Lock()
		defer r.mu.Unlock()
		return fmt.Errorf("%d %s reports of generation %d acknowledged, %d awaited: %w", r.acked[ackKey{state, gen}], state, gen, n, ctx.Err())
	}
}

func (r *crashRecord) resetDropped() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.dropped)
}

// setDown marks a controller dying (true) or its successor leading.
func (r *crashRecord) setDown(down bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = down
}

// nextLife starts the next controller life and returns the one that ended.
func (r *crashRecord) nextLife() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.life++
	return r.life
}

func (r *crashRecord) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]ackKey, 0, len(r.acked))
	for k := range r.acked {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].gen != keys[j].gen {
			return keys[i].gen < keys[j].gen
		}
		return keys[i].state < keys[j].state
	})
	s := "acknowledged so far:"
	for _, k := range keys {
		s += fmt.Sprintf(" %d %s of generation %d;", r.acked[k], k.state, k.gen)
	}
	return s + fmt.Sprintf(" %d assignments and %d stop orders received", len(r.assignments), len(r.stops))
}

// checkDurable: whatever a controller let out rests on state that is
// durable (docs/design.md, "Design notes"): every assignment on its generation's
// stored round, every stop order on a stored decision that its generation
// is over. Callers hold r.mu.
func (r *crashRecord) checkDurable(t *testing.T, st *storedState) {
	t.Helper()
	for _, s := range r.assignments {
		a, gen := s.asg, s.asg.GetGeneration()
		require.GreaterOrEqual(t, st.job.GetGeneration(), gen, "%s got generation %d (controller life %d), stored job is at %d", s.node, gen, s.life, st.job.GetGeneration())
		round := st.rounds[gen]
		require.NotNil(t, round, "%s got generation %d (controller life %d), whose round is not stored", s.node, gen, s.life)
		require.Equal(t, [3]any{round.GetMasterAddr(), round.GetMasterPort(), len(round.GetNodes())}, [3]any{a.GetMasterAddr(), a.GetMasterPort(), int(a.GetNnodes())},
			"%s's assignment of generation %d (controller life %d) is not the stored round", s.node, gen, s.life)
		var rank int64 = -1
		for _, n := range round.GetNodes() {
			if n.GetNode() == s.node {
				rank = int64(n.GetNodeRank())
			}
		}
		require.Equal(t, int64(a.GetNodeRank()), rank, "%s's rank in generation %d (controller life %d)", s.node, gen, s.life)
	}
	for _, s := range r.stops {
		gen := s.stop.GetGeneration()
		over := st.job.GetGeneration() > gen || st.job.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING
		require.True(t, over, "%s was told to stop generation %d (%q, controller life %d), but the stored job is %s in generation %d",
			s.node, gen, s.stop.GetReason(), s.life, st.job.GetState(), st.job.GetGeneration())
	}
}

// checkGenerations: generations 1 to the job's were assigned, each as
// its stored round (one master, one size, one rank per node of the round)
// however many controllers sent it. Callers hold r.mu.
func (r *crashRecord) checkGenerations(t *testing.T, st *storedState) {
	t.Helper()
	ranks := map[uint64]map[string]uint32{}
	for _, s := range r.assignments {
		gen, a := s.asg.GetGeneration(), s.asg
		round := st.rounds[gen]
		require.Equal(t, [3]any{round.GetMasterAddr(), round.GetMasterPort(), len(round.GetNodes())}, [3]any{a.GetMasterAddr(), a.GetMasterPort(), int(a.GetNnodes())},
			"%s's assignment of generation %d (controller life %d) is not its stored round: a generation reused", s.node, gen, s.life)
		if ranks[gen] == nil {
			ranks[gen] = map[string]uint32{}
		}
		if prev, ok := ranks[gen][s.node]; ok {
			require.Equal(t, prev, a.GetNodeRank(), "%s got two ranks in generation %d", s.node, gen)
		}
		ranks[gen][s.node] = a.GetNodeRank()
	}
	for gen := uint64(1); gen <= st.job.GetGeneration(); gen++ {
		require.Len(t, ranks[gen], len(st.rounds[gen].GetNodes()), "nodes assigned generation %d", gen)
	}
	require.Len(t, ranks, int(st.job.GetGeneration()), "generations assigned")
}

// checkReflected: every report a controller acknowledged is in the stored
// state, or something later is: a newer generation, or the same one
// further on (running, then ended). Callers hold r.mu.
func (r *crashRecord) checkReflected(t *testing.T, st *storedState) {
	t.Helper()
	n := 0
	for node, reports := range r.reports {
		w := st.workers[node]
		for _, rep := range reports {
			n++
			// A later generation's round replaced the stored worker
			// statuses, a node's only if it is in that round too.
			if st.job.GetGeneration() > rep.GetGeneration() {
				continue
			}
			require.Equal(t, rep.GetGeneration(), w.GetGeneration(), "%s: acknowledged %s of generation %d, stored %s of generation %d",
				node, rep.GetState(), rep.GetGeneration(), w.GetState(), w.GetGeneration())
			if w.GetState() != rep.GetState() {
				require.Equal(t, rdzvv1.WorkerState_WORKER_STATE_RUNNING, rep.GetState(), "%s: acknowledged %s of generation %d, stored %s",
					node, rep.GetState(), rep.GetGeneration(), w.GetState())
				require.Contains(t, []rdzvv1.WorkerState{rdzvv1.WorkerState_WORKER_STATE_STOPPED, rdzvv1.WorkerState_WORKER_STATE_FAILED, rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED},
					w.GetState(), "%s: acknowledged RUNNING of generation %d, stored %s", node, rep.GetGeneration(), w.GetState())
			}
		}
	}
	// At least what the crashes waited for.
	require.GreaterOrEqual(t, n, crashNodes+crashNodes/4+crashNodes/2, "acknowledged reports")
}

// checkFencing: no node got a generation while any node still ran an
// earlier one, nor before the silent node, had it been merely cut off,
// would have fenced itself (fencedBy). Callers hold r.mu.
func (r *crashRecord) checkFencing(t *testing.T, fencedBy time.Time) {
	t.Helper()
	for gen, started := range r.taken {
		first, firstNode := uint64(0), ""
		for node, o := range started {
			if first == 0 || o < first {
				first, firstNode = o, node
			}
		}
		for prev := uint64(1); prev < gen; prev++ {
			for node := range r.taken[prev] {
				end, ok := r.ended[prev][node]
				require.True(t, ok, "%s never stopped generation %d, yet %s got generation %d", node, prev, firstNode, gen)
				require.Less(t, end, first, "%s got generation %d while %s still ran generation %d", firstNode, gen, node, prev)
			}
		}
	}
	require.False(t, r.firstAsgAt[2].Before(fencedBy), "generation 2 started at %s, before the silent node's fencing deadline %s",
		r.firstAsgAt[2].Format(time.RFC3339Nano), fencedBy.Format(time.RFC3339Nano))
}
