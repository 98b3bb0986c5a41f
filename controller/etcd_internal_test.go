package controller

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/controller/store"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// The embedded etcd snapshots its raft log to disk every
// embeddedSnapshotCount entries, not etcd's 10,000: a snapshot file exists
// once that many more have been written, and a restart replays no more.
func TestEmbeddedEtcdSnapshotsItsLog(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, endpoint, err := startEmbedded(ctx, cfg, zaptest.NewLogger(t))
	require.NoError(t, err)
	defer e.close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()

	snaps := func() []string {
		files, err := filepath.Glob(filepath.Join(cfg.DataDir, "member", "snap", "*.snap"))
		require.NoError(t, err)
		return files
	}
	require.Empty(t, snaps(), "a fresh member has no snapshot yet")
	// Each put is one raft entry; writers side by side keep it quick.
	var g errgroup.Group
	g.SetLimit(16)
	for i := range embeddedSnapshotCount + embeddedCatchUpEntries {
		g.Go(func() error {
			_, err := cli.Put(ctx, fmt.Sprintf("/test/%d", i), "x")
			return err
		})
	}
	require.NoError(t, g.Wait())
	require.Eventually(t, func() bool { return len(snaps()) > 0 }, 30*time.Second, 50*time.Millisecond,
		"no snapshot after %d entries", embeddedSnapshotCount+embeddedCatchUpEntries)
}

// leadOnce runs a controller on cfg until it leads, lets check look at it
// under its lock, waits until what check decided is durable, and stops the
// controller as SIGTERM does.
func leadOnce(t *testing.T, cfg Config, check func(c *Controller)) {
	t.Helper()
	c, err := New(cfg, zaptest.NewLogger(t))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, c.Leading, 30*time.Second, 20*time.Millisecond, "never took the lead")
	c.mu.Lock()
	check(c)
	c.mu.Unlock()
	require.NoError(t, c.settle(ctx))
	cancel()
	require.NoError(t, <-done)
}

// A node's registration, kept apart from its record in memory (nodeInfo),
// is written whole with the record: a node lost under one lead is loaded
// by the next with all of its registration.
func TestNodeRecordKeepsItsRegistration(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Insecure, cfg.DataDir, cfg.Listen, cfg.HTTP.Listen = true, t.TempDir(), "127.0.0.1:0", "127.0.0.1:0"
	info := &rdzvv1.NodeInfo{
		Name: "n1", Address: "10.0.0.1", NcclInterface: "ib0", Labels: map[string]string{"rack": "r1"},
		Gpus:       []*rdzvv1.GPU{{Index: 0, Uuid: "GPU-0", Name: "NVIDIA H100"}, {Index: 1, Uuid: "GPU-1", Name: "NVIDIA H100"}},
		Interfaces: []*rdzvv1.NetworkInterface{{Name: "ib0", Addresses: []string{"10.0.0.1/24"}, Up: true}},
	}
	leadOnce(t, cfg, func(c *Controller) {
		_, err := c.store.CommitAll(context.Background(), c.store.PutNode(&rdzvv1.Node{Info: info, State: rdzvv1.NodeState_NODE_STATE_READY}))
		require.NoError(t, err)
	})
	leadOnce(t, cfg, func(c *Controller) {
		ns := c.nodes["n1"]
		require.NotNil(t, ns)
		require.Nil(t, ns.rec.GetInfo(), "the record is kept without its registration")
		require.True(t, proto.Equal(info, ns.info.decode()), "loaded %v", ns.info.decode())
		require.Equal(t, []uint32{0, 1}, ns.info.gpuIndices)
		now := c.clock.Now()
		c.markLost("n1", ns, now, now, "test")
		require.Nil(t, ns.rec.GetInfo(), "nor after a change")
	})
	leadOnce(t, cfg, func(c *Controller) {
		ns := c.nodes["n1"]
		require.Equal(t, rdzvv1.NodeState_NODE_STATE_LOST, ns.rec.GetState())
		require.True(t, proto.Equal(info, ns.info.decode()), "the lost node's record kept its registration: %v", ns.info.decode())
	})
}

// The first lead after revoking a killed run's lease grants the nodes it
// loads the lease's TTL on top of the reconnect grace, the time their
// agents used to have while it waited; a lead after a clean stop grants
// the plain grace.
func TestRevokedLeaseLengthensTheFirstGrace(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Insecure, cfg.DataDir, cfg.Listen, cfg.HTTP.Listen = true, t.TempDir(), "127.0.0.1:0", "127.0.0.1:0"
	plain := reconnectGrace + cfg.Heartbeat.Timeout.Duration
	ctx := context.Background()
	lead := func(check func(c *Controller)) { leadOnce(t, cfg, check) }
	grace := func(c *Controller) time.Duration { return c.nodes["n1"].graceUntil.Sub(c.tenure.began) }

	lead(func(c *Controller) {
		node := &rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: "n1", Address: "10.0.0.1"}, State: rdzvv1.NodeState_NODE_STATE_READY}
		_, err := c.store.CommitAll(ctx, c.store.PutNode(node))
		require.NoError(t, err)
		// What a killed run leaves: its key, on a lease far longer than
		// the test waits for the lead.
		cli := c.store.Client()
		lease, err := cli.Grant(ctx, 120)
		require.NoError(t, err)
		_, err = cli.Put(ctx, fmt.Sprintf("%s/%x", store.ElectionName(), lease.ID), "killed", clientv3.WithLease(lease.ID))
		require.NoError(t, err)
	})
	lead(func(c *Controller) {
		require.GreaterOrEqual(t, grace(c), plain+cfg.LeaderLeaseTTL.Duration, "after a revocation")
	})
	lead(func(c *Controller) {
		require.Less(t, grace(c), plain+cfg.LeaderLeaseTTL.Duration, "after a clean stop")
		require.GreaterOrEqual(t, grace(c), plain)
	})
}
