package agent

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func TestMemIndexEvictsOldestStepFirst(t *testing.T) {
	type add struct {
		key  shardKey
		size int64
	}
	for _, tc := range []struct {
		name    string
		max     int64
		adds    []add
		held    []*rdzvv1.MemoryHeld
		bytes   int64
		notKept bool
	}{
		{name: "within the bound", max: 100, adds: []add{{shardKey{1, 10, 0}, 20}, {shardKey{1, 10, 1}, 20}, {shardKey{1, 20, 0}, 20}},
			held: []*rdzvv1.MemoryHeld{{Generation: 1, Step: 10, Ranks: []uint32{0, 1}}, {Generation: 1, Step: 20, Ranks: []uint32{0}}}, bytes: 60},
		{name: "the oldest step goes whole", max: 60, adds: []add{{shardKey{1, 10, 0}, 20}, {shardKey{1, 10, 1}, 20}, {shardKey{1, 20, 0}, 20}, {shardKey{1, 20, 1}, 20}},
			held: []*rdzvv1.MemoryHeld{{Generation: 1, Step: 10, Ranks: []uint32{1}}, {Generation: 1, Step: 20, Ranks: []uint32{0, 1}}}, bytes: 60},
		{name: "an older generation goes before a lower step of a newer one", max: 40,
			adds: []add{{shardKey{1, 90, 0}, 20}, {shardKey{2, 50, 0}, 20}, {shardKey{2, 60, 0}, 20}},
			held: []*rdzvv1.MemoryHeld{{Generation: 2, Step: 50, Ranks: []uint32{0}}, {Generation: 2, Step: 60, Ranks: []uint32{0}}}, bytes: 40},
		{name: "a shard replaced counts once", max: 40, adds: []add{{shardKey{1, 10, 0}, 20}, {shardKey{1, 10, 0}, 30}},
			held: []*rdzvv1.MemoryHeld{{Generation: 1, Step: 10, Ranks: []uint32{0}}}, bytes: 30},
		{name: "at most memMaxSteps steps", adds: func() []add {
			var out []add
			for s := range uint64(memMaxSteps + 2) {
				out = append(out, add{shardKey{1, s + 1, 0}, 1})
			}
			return out
		}(), held: func() []*rdzvv1.MemoryHeld {
			var out []*rdzvv1.MemoryHeld
			for s := range uint64(memMaxSteps) {
				out = append(out, &rdzvv1.MemoryHeld{Generation: 1, Step: s + 3, Ranks: []uint32{0}})
			}
			return out
		}(), bytes: memMaxSteps},
		{name: "a shard beyond the bound alone is not kept", max: 40, adds: []add{{shardKey{1, 10, 0}, 20}, {shardKey{1, 20, 0}, 50}},
			held: []*rdzvv1.MemoryHeld{}, bytes: 0, notKept: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := memIndex{maxBytes: tc.max}
			if tc.max == 0 {
				// At most memMaxSteps steps, whatever their size.
				x.maxBytes = 1 << 40
			}
			kept := true
			for _, a := range tc.adds {
				_, kept = x.add(a.key, &shard{size: a.size})
			}
			require.Equal(t, !tc.notKept, kept)
			require.Equal(t, tc.held, x.held())
			require.Equal(t, tc.bytes, x.bytes)
		})
	}
}

func TestParseShardPath(t *testing.T) {
	for _, tc := range []struct {
		path string
		want shardRef
		err  string
	}{
		{path: "/v1/shards/train/3/120/7", want: shardRef{job: "train", key: shardKey{3, 120, 7}}},
		{path: "/v1/shards/train/3/120", err: "path must be"},
		{path: "/v1/shards/train/3/120/7/8", err: "path must be"},
		{path: "/v1/shards/../3/120/7", err: "job"},
		{path: "/v1/shards/train/-1/120/7", err: "generation: must be a decimal number"},
		{path: "/v1/shards/train/3/012/7", err: "step: must be a decimal number"},
		{path: "/v1/shards/train/3/12/4294967296", err: "rank: must be a decimal number"},
		{path: "/v2/x", err: "path must start with"},
	} {
		got, err := parseShardPath(tc.path)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.path)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
}

// FuzzShardRequest: whatever another agent sends as a shard's path and
// checksum, the parsers return an error or a shard that prints back the
// same, and never panic.
func FuzzShardRequest(f *testing.F) {
	f.Add("/v1/shards/train/3/120/7", strings.Repeat("ab", 32))
	f.Add("/v1/shards//0/0/0", "zz")
	f.Fuzz(func(t *testing.T, path, sum string) {
		if ref, err := parseShardPath(path); err == nil {
			require.Equal(t, path, shardPath(ref.job, ref.key))
		}
		_, _ = parseShardSum([]string{sum})
	})
}

// peerPKI issues agent certificates of one CA for names, and one of
// another CA for "stranger".
func peerPKI(t testing.TB, names ...string) map[string]*pki.Reloader {
	t.Helper()
	out := map[string]*pki.Reloader{}
	for _, caName := range []string{"cluster", "other"} {
		dir := t.TempDir()
		ca, err := pki.NewCA(caName, time.Hour, time.Now())
		require.NoError(t, err)
		require.NoError(t, ca.Save(dir, false))
		issue := names
		if caName == "other" {
			issue = []string{"stranger"}
		}
		for _, n := range issue {
			is, err := ca.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleAgent, Name: n}, ValidFor: time.Minute * 30, Now: time.Now()})
			require.NoError(t, err)
			cert, key, err := is.Save(filepath.Join(dir, n), false)
			require.NoError(t, err)
			r, err := pki.NewReloader(pki.Files{Cert: cert, Key: key, CA: filepath.Join(dir, pki.CACertFile)}, nil, zaptest.NewLogger(t))
			require.NoError(t, err)
			out[n] = r
		}
	}
	return out
}

// Two agents over real mutual TLS: a's shard is replicated to b, and a
// replacement node c fetches it from b before its workers start; an agent
// of another CA, or a shard beyond the bound, gets nothing in.
func TestMemoryCheckpointReplicationAndFetch(t *testing.T) {
	// Registered first, so it runs after the servers' cleanups.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	certs := peerPKI(t, "a", "b", "c")
	root := t.TempDir()
	log := zaptest.NewLogger(t)
	stores := map[string]*memStore{}
	addrs := map[string]string{}
	for _, n := range []string{"a", "b", "c"} {
		m := newMemStore(root, n, log.Named(n))
		m.peerTLS = certs[n].AgentPeerClientConfig
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		srv := newPeerServer(m, certs[n].AgentPeerServerConfig(), log.Named(n))
		done := make(chan error, 1)
		go func() { done <- srv.serve(ln) }()
		t.Cleanup(func() { srv.shutdown(); require.NoError(t, <-done) })
		stores[n], addrs[n] = m, ln.Addr().String()
	}
	spec := &rdzvv1.JobSpec{Name: "train", CheckpointMemory: &rdzvv1.CheckpointMemorySpec{Replicas: 1, MaxBytes: 1 << 20}}
	ctx := context.Background()
	assign := func(node string, rank uint32, gen uint64, peer string) *rdzvv1.Assignment {
		a := &rdzvv1.Assignment{Spec: spec, Generation: gen, NodeRank: rank}
		if peer != "" {
			a.ReplicaPeers = []*rdzvv1.ReplicaPeer{{Node: peer, Addr: addrs[peer]}}
		}
		return a
	}
	envA, err := stores["a"].prepare(ctx, assign("a", 0, 1, "b"), nil)
	require.NoError(t, err)
	_, err = stores["b"].prepare(ctx, assign("b", 1, 1, "a"), nil)
	require.NoError(t, err)
	info, err := os.Stat(envA[memDirEnv])
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), info.Mode().Perm())

	// a's worker writes rank 0's shard of step 40 and reports it.
	data := []byte("rank zero's state at step 40")
	require.NoError(t, os.WriteFile(filepath.Join(envA[memDirEnv], shardName(40, 0)), data, 0o600))
	sum := sha256.Sum256(data)
	require.NoError(t, stores["a"].reported("train", 1, 40, 0, int64(len(data)), sum))
	require.Eventually(t, func() bool { h, _ := stores["b"].held("train"); return len(h) == 1 }, 10*time.Second, 10*time.Millisecond)
	held, bytes := stores["b"].held("train")
	require.Equal(t, []*rdzvv1.MemoryHeld{{Generation: 1, Step: 40, Ranks: []uint32{0}}}, held)
	require.Equal(t, int64(len(data)), bytes)
	// The metrics tell a node's own shards (shared memory) from its peers'
	// replicas (the agent's memory).
	limit := stores["a"].limit("train")
	require.Equal(t, []memUsage{{job: "train", own: int64(len(data)), limit: limit, steps: 1}}, stores["a"].usage())
	require.Equal(t, []memUsage{{job: "train", replica: int64(len(data)), limit: limit, steps: 1}}, stores["b"].usage())
	// And a registration carries them, so that a new leader knows them.
	require.Equal(t, []*rdzvv1.JobMemoryHeld{{Job: "train", Held: held}}, stores["b"].heldAll())

	// A report of another generation is refused.
	require.ErrorIs(t, stores["a"].reported("train", 2, 41, 0, 1, sum), errMemOff)

	// a is lost; c replaces it at node rank 0 and fetches rank 0 from b.
	_, err = stores["c"].prepare(ctx, &rdzvv1.Assignment{Spec: spec, Generation: 2, NodeRank: 0}, nil)
	require.NoError(t, err)
	a := assign("c", 0, 3, "b")
	a.ResumeMemoryStep, a.ResumeMemoryGeneration = 40, 1
	a.MemorySources = []*rdzvv1.ShardSource{{Rank: 0, Node: "b", Addr: addrs["b"]}}
	envC, err := stores["c"].prepare(ctx, a, nil)
	require.NoError(t, err)
	require.Equal(t, "40", envC[memResumeEnv])
	got, err := os.ReadFile(filepath.Join(envC[memDirEnv], shardName(40, 0)))
	require.NoError(t, err)
	require.Equal(t, data, got)

	// A shard nobody holds: the fetch fails, and says so.
	a.MemorySources = []*rdzvv1.ShardSource{{Rank: 1, Node: "b", Addr: addrs["b"]}}
	a.Generation = 4
	_, err = stores["c"].prepare(ctx, a, nil)
	require.ErrorContains(t, err, "404")

	// An agent certificate of another CA gets no shard in.
	stranger := certs["stranger"].AgentPeerClientConfig("b")
	require.Error(t, pushShard(ctx, peerClient(stranger), addrs["b"], "train", shardKey{1, 50, 0}, data, sum))
	// Nor one beyond the job's bound, nor for a job b does not run.
	big := make([]byte, 2<<20)
	err = pushShard(ctx, peerClient(certs["a"].AgentPeerClientConfig("b")), addrs["b"], "train", shardKey{1, 50, 0}, big, sha256.Sum256(big))
	require.Error(t, err)
	// b answers 413 and closes without reading the body, so the client may
	// see the connection reset before the answer.
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		require.ErrorContains(t, err, "413")
	}
	require.ErrorContains(t, pushShard(ctx, peerClient(certs["a"].AgentPeerClientConfig("b")), addrs["b"], "other", shardKey{1, 50, 0}, data, sum), "404")
	// A client dialing b as if it were c refuses b's certificate.
	_, _, err = fetchShard(ctx, peerClient(certs["a"].AgentPeerClientConfig("c")), addrs["b"], "train", shardKey{1, 40, 0}, 1<<20)
	require.ErrorContains(t, err, "presented the certificate of agent/b")

	for _, n := range []string{"a", "b", "c"} {
		stores[n].drop("train")
		stores[n].clients.closeAll()
		h, _ := stores[n].held("train")
		require.Empty(t, h)
	}
	_, err = os.Stat(filepath.Join(root, "a", "train"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// An exit report carries what the node holds of the job's in-memory
// checkpoints then; the status kept for registrations does not.
func TestExitReportCarriesHoldings(t *testing.T) {
	m := newMemStore(t.TempDir(), "a", zaptest.NewLogger(t))
	t.Cleanup(func() { m.drop("train") })
	spec := &rdzvv1.JobSpec{Name: "train", CheckpointMemory: &rdzvv1.CheckpointMemorySpec{Replicas: 1, MaxBytes: 1 << 20}}
	env, err := m.prepare(context.Background(), &rdzvv1.Assignment{Spec: spec, Generation: 3}, nil)
	require.NoError(t, err)
	s := &Supervisor{mem: m}
	st := &rdzvv1.WorkerStatus{Job: "train", Generation: 3, State: rdzvv1.WorkerState_WORKER_STATE_FAILED}
	require.Same(t, st, s.withMemory(st), "nothing held: the report as it is")

	data := []byte("rank one's state at step 7")
	require.NoError(t, os.WriteFile(filepath.Join(env[memDirEnv], shardName(7, 1)), data, 0o600))
	require.NoError(t, m.reported("train", 3, 7, 1, int64(len(data)), sha256.Sum256(data)))
	got := s.withMemory(st)
	require.Equal(t, []*rdzvv1.MemoryHeld{{Generation: 3, Step: 7, Ranks: []uint32{1}}}, got.GetMemory())
	require.Nil(t, st.GetMemory(), "the kept status is not changed")
	require.Equal(t, st.GetState(), got.GetState())
}

// TestMemoryLeftByAPreviousAgent: an agent that starts frees the shards a
// previous agent left in shared memory, which no index of its own holds,
// except those of the job whose workers it adopted. It takes the adopted
// generation's new shards, and the job's end frees its directory, old
// shards and all.
func TestMemoryLeftByAPreviousAgent(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	root := t.TempDir()
	node := filepath.Join(root, "a")
	for _, dir := range []string{"gone/g3", "adopted/g1", "adopted/g2"} {
		require.NoError(t, os.MkdirAll(filepath.Join(node, dir), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(node, dir, shardName(7, 0)), []byte("left behind"), 0o600))
	}
	m := newMemStore(root, "a", zaptest.NewLogger(t))
	spec := &rdzvv1.JobSpec{Name: "adopted", CheckpointMemory: &rdzvv1.CheckpointMemorySpec{Replicas: 1, MaxBytes: 1 << 20}}
	m.adopt(&rdzvv1.Assignment{Spec: spec, Generation: 2}, nil)
	m.sweep("adopted")
	entries, err := os.ReadDir(node)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, "adopted", entries[0].Name(), "the adopted job's directory is kept, every other one freed")

	// A shard the adopted generation saves from now on is taken; one of
	// another generation is not.
	data := []byte("saved after the agent restarted")
	require.NoError(t, os.WriteFile(filepath.Join(node, "adopted", "g2", shardName(9, 0)), data, 0o600))
	require.NoError(t, m.reported("adopted", 2, 9, 0, int64(len(data)), sha256.Sum256(data)))
	require.ErrorIs(t, m.reported("adopted", 1, 9, 0, int64(len(data)), sha256.Sum256(data)), errMemOff)
	held, _ := m.held("adopted")
	require.Equal(t, []*rdzvv1.MemoryHeld{{Generation: 2, Step: 9, Ranks: []uint32{0}}}, held)
	got, _, err := m.get("adopted", shardKey{2, 9, 0})
	require.NoError(t, err)
	require.Equal(t, data, got)

	m.drop("adopted")
	_, err = os.Stat(filepath.Join(node, "adopted"))
	require.ErrorIs(t, err, os.ErrNotExist, "the job's end frees its shards, those of no index too")

	// A job this agent never indexed is freed at its end as well.
	require.NoError(t, os.MkdirAll(filepath.Join(node, "unknown", "g1"), 0o700))
	m.drop("unknown")
	_, err = os.Stat(filepath.Join(node, "unknown"))
	require.ErrorIs(t, err, os.ErrNotExist)
	// And sweeping nothing is no error.
	newMemStore(filepath.Join(root, "none"), "a", zaptest.NewLogger(t)).sweep("")
}

// A peer's client, with its kept connection, is reused until
// peerClientAge, then replaced: a peer whose certificate was revoked
// since its handshake is not sent shards for longer. Clients past their
// age are dropped whichever node is asked for.
func TestPeerClientsAge(t *testing.T) {
	var made []string
	conf := func(node string) *tls.Config { made = append(made, node); return &tls.Config{ServerName: node} }
	var p peerClients
	t0 := time.Unix(1000, 0)
	b := p.get("b", conf, t0)
	require.Same(t, b, p.get("b", conf, t0.Add(peerClientAge-time.Second)), "reused within its age")
	c := p.get("c", conf, t0.Add(peerClientAge/2))
	require.NotSame(t, b, c, "one client per node")
	b2 := p.get("b", conf, t0.Add(peerClientAge))
	require.NotSame(t, b, b2, "replaced at its age")
	require.Len(t, p.byID, 2)
	p.get("b", conf, t0.Add(peerClientAge+peerClientAge/2))
	require.NotContains(t, p.byID, "c", "c's client, past its age, is dropped")
	require.Equal(t, []string{"b", "c", "b"}, made)
	p.closeAll()
	require.Empty(t, p.byID)
}
