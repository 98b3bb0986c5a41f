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
