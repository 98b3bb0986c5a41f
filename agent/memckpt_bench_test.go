package agent

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// BenchmarkShardPeerCopy times a shard of RDZV_BENCH_SHARD_MB (default
// 1024) MB between two agents over real mutual TLS on loopback, with the
// stores in /dev/shm as in production: a's worker reports it and it is
// replicated to b (replicate, until b holds it), then c, replacing a,
// fetches it from b and checks its checksum before its workers would
// start (fetch). `make bench` runs it; figures in docs/benchmarks.md.
func BenchmarkShardPeerCopy(b *testing.B) {
	mb := 1024
	if s := os.Getenv("RDZV_BENCH_SHARD_MB"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(b, err, "RDZV_BENCH_SHARD_MB")
		mb = n
	}
	root, err := os.MkdirTemp("/dev/shm", "rdzv-bench-shard-")
	require.NoError(b, err)
	b.Cleanup(func() { _ = os.RemoveAll(root) })
	certs := peerPKI(b, "a", "b", "c")
	stores, addrs := map[string]*memStore{}, map[string]string{}
	for _, n := range []string{"a", "b", "c"} {
		m := newMemStore(root, n, zap.NewNop())
		m.peerTLS = certs[n].AgentPeerClientConfig
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)
		srv := newPeerServer(m, certs[n].AgentPeerServerConfig(), zap.NewNop())
		go func() { _ = srv.serve(ln) }()
		b.Cleanup(srv.shutdown)
		stores[n], addrs[n] = m, ln.Addr().String()
	}
	data := make([]byte, mb<<20)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)
	spec := &rdzvv1.JobSpec{Name: "train", CheckpointMemory: &rdzvv1.CheckpointMemorySpec{Replicas: 1, MaxBytes: uint64(4*mb) << 20}}
	ctx := context.Background()
	var replicate, fetch time.Duration
	b.ResetTimer()
	for i := range b.N {
		gen := uint64(2*i + 1)
		envA, err := stores["a"].prepare(ctx, &rdzvv1.Assignment{Spec: spec, Generation: gen, NodeRank: 0,
			ReplicaPeers: []*rdzvv1.ReplicaPeer{{Node: "b", Addr: addrs["b"]}}}, nil)
		require.NoError(b, err)
		_, err = stores["b"].prepare(ctx, &rdzvv1.Assignment{Spec: spec, Generation: gen, NodeRank: 1}, nil)
		require.NoError(b, err)
		require.NoError(b, os.WriteFile(filepath.Join(envA[memDirEnv], shardName(40, 0)), data, 0o600))
		start := time.Now()
		require.NoError(b, stores["a"].reported("train", gen, 40, 0, int64(len(data)), sum))
		for {
			if h, _ := stores["b"].held("train"); len(h) == 1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		replicate += time.Since(start)

		start = time.Now()
		_, err = stores["c"].prepare(ctx, &rdzvv1.Assignment{Spec: spec, Generation: gen + 1, NodeRank: 0,
			ResumeMemoryStep: 40, ResumeMemoryGeneration: gen,
			MemorySources: []*rdzvv1.ShardSource{{Rank: 0, Node: "b", Addr: addrs["b"]}}}, nil)
		require.NoError(b, err)
		fetch += time.Since(start)
		for _, n := range []string{"a", "b", "c"} {
			stores[n].drop("train")
		}
	}
	b.ReportMetric(replicate.Seconds()/float64(b.N), "replicate-s/op")
	b.ReportMetric(fetch.Seconds()/float64(b.N), "fetch-s/op")
	b.ReportMetric(float64(mb)/(fetch.Seconds()/float64(b.N)), "fetch-MB/s")
}

// BenchmarkShardPushSmall times replicating a small shard (64 KiB: a small
// model's state, saved every step) from one agent to another over mutual
// TLS on loopback, one after another as the replication loop sends them:
// over the kept connection of a peer client (reused), and over a new
// connection each (fresh: a TLS handshake at both ends per shard).
func BenchmarkShardPushSmall(b *testing.B) {
	certs := peerPKI(b, "a", "b")
	m := newMemStore(b.TempDir(), "b", zap.NewNop())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	srv := newPeerServer(m, certs["b"].AgentPeerServerConfig(), zap.NewNop())
	go func() { _ = srv.serve(ln) }()
	b.Cleanup(srv.shutdown)
	spec := &rdzvv1.JobSpec{Name: "train", CheckpointMemory: &rdzvv1.CheckpointMemorySpec{Replicas: 1, MaxBytes: 64 << 20}}
	_, err = m.prepare(context.Background(), &rdzvv1.Assignment{Spec: spec, Generation: 1, NodeRank: 1}, nil)
	require.NoError(b, err)
	b.Cleanup(func() { m.drop("train") })
	data := make([]byte, 64<<10)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)
	push := func(b *testing.B, c *http.Client, i int) {
		require.NoError(b, pushShard(context.Background(), c, ln.Addr().String(), "train", shardKey{1, uint64(i), 0}, data, sum))
	}
	conf := certs["a"].AgentPeerClientConfig("b")
	b.Run("reused", func(b *testing.B) {
		c := peerClient(conf)
		defer c.CloseIdleConnections()
		for i := range b.N {
			push(b, c, i)
		}
	})
	b.Run("fresh", func(b *testing.B) {
		for i := range b.N {
			c := peerClient(conf)
			push(b, c, i)
			c.CloseIdleConnections()
		}
	})
}
