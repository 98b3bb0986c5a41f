package controller_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/internal/testaddr"
)

// A controller restarted on its data directory, and stopped as SIGTERM
// stops it (Run's context ends), logs no error: log-based alerts fire on
// them. Embedded etcd used to log one with a stack trace for each of its
// servers that closing it shut. The first start on a fresh data directory
// is only the set-up: etcd itself may log a harmless error while it
// bootstraps ("failed to update storage version", etcd-io/etcd#18978).
func TestCleanShutdownLogsNoError(t *testing.T) {
	cfg := embeddedConfig(t)
	leadEmbedded(t, cfg, testLogger(t).Named("first"))()

	core, logs := observer.New(zapcore.DebugLevel)
	leadEmbedded(t, cfg, zap.New(zapcore.NewTee(testLogger(t).Core(), core)))()
	require.NotZero(t, logs.FilterMessage("controller stopped").Len(), "the shutdown ran to its end")
	var errs []string
	for _, e := range logs.All() {
		if e.Level >= zapcore.ErrorLevel {
			errs = append(errs, fmt.Sprintf("%s: %s %v", e.LoggerName, e.Message, e.ContextMap()))
		}
	}
	require.Empty(t, errs, "error lines logged by a clean shutdown")
}

// A controller killed while leading leaves its leader key in its embedded
// etcd, on a lease that etcd renews for a full TTL when it restarts. The
// next run revokes it and leads at once rather than waiting out its own
// dead self. The leftover here is a key like the killed run's, on a lease
// far longer than the wait for the lead.
func TestRestartRevokesItsKilledRunsLease(t *testing.T) {
	cfg := embeddedConfig(t)
	stop := leadEmbedded(t, cfg, testLogger(t).Named("first"))
	sock, err := filepath.Abs(cfg.EmbeddedEtcdSocket())
	require.NoError(t, err)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"unix://" + sock}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	lease, err := cli.Grant(rpcCtx(t), int64((4 * waitTimeout).Seconds()))
	require.NoError(t, err)
	leftover := fmt.Sprintf("%s/%x", store.ElectionName(), lease.ID)
	_, err = cli.Put(rpcCtx(t), leftover, cfg.Advertised(), clientv3.WithLease(lease.ID))
	require.NoError(t, err)
	require.NoError(t, cli.Close())
	stop()

	core, logs := observer.New(zapcore.DebugLevel)
	stop = leadEmbedded(t, cfg, zap.New(zapcore.NewTee(testLogger(t).Core(), core)))
	defer stop()
	require.Equal(t, 1, logs.FilterMessage("revoked the previous run's leader lease").FilterField(zap.String("key", leftover)).Len())
}

// embeddedConfig is an insecure controller's on an embedded etcd of its
// own.
func embeddedConfig(t *testing.T) controller.Config {
	cfg := controller.DefaultConfig()
	cfg.Insecure, cfg.DataDir, cfg.Listen = true, t.TempDir(), testaddr.Free(t)
	cfg.HTTP.Listen = "127.0.0.1:0"
	return cfg
}

// leadEmbedded runs a controller until it leads; stop stops it as SIGTERM
// does and checks that it returned no error.
func leadEmbedded(t *testing.T, cfg controller.Config, log *zap.Logger) (stop func()) {
	t.Helper()
	ctl, err := controller.New(cfg, log)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctl.Run(ctx) }()
	poll(t, ctl.Leading, func() string { return "controller never took the lead" })
	return func() {
		cancel()
		require.NoError(t, <-done)
	}
}
