package controller_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/internal/testaddr"
)

// A clean shutdown (SIGTERM, which cancels Run's context) logs no error:
// log-based alerts fire on them. Embedded etcd used to log one with a
// stack trace for each of its servers that closing it shut.
func TestCleanShutdownLogsNoError(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(zapcore.NewTee(testLogger(t).Core(), core))
	cfg := controller.DefaultConfig()
	cfg.Insecure, cfg.DataDir, cfg.Listen = true, t.TempDir(), testaddr.Free(t)
	cfg.HTTP.Listen = "127.0.0.1:0"
	ctl, err := controller.New(cfg, log)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctl.Run(ctx) }()
	poll(t, ctl.Leading, func() string { return "controller never took the lead" })
	cancel()
	require.NoError(t, <-done)

	require.NotZero(t, logs.FilterMessage("controller stopped").Len(), "the shutdown ran to its end")
	var errs []string
	for _, e := range logs.All() {
		if e.Level >= zapcore.ErrorLevel {
			errs = append(errs, fmt.Sprintf("%s: %s %v", e.LoggerName, e.Message, e.ContextMap()))
		}
	}
	require.Empty(t, errs, "error lines logged by a clean shutdown")
}
