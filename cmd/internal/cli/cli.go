// Package cli holds what the daemons' mains share: logger construction and
// flag helpers.
package cli

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/sync/errgroup"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// NewLogger builds a production JSON logger at level ("debug", "info", ...).
func NewLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log_level: %w", err)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.EncoderConfig.TimeKey = "time"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	cfg.Sampling = nil
	return cfg.Build()
}

// Set reports the names of the flags given on the command line, so that
// only those override a config file.
func Set(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// ParseLabels parses "k=v,k2=v2".
func ParseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	if s == "" {
		return labels, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--labels: %q is not key=value", kv)
		}
		labels[k] = v
	}
	return labels, nil
}

// Fatal prints a startup error and exits non-zero.
func Fatal(prog string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
	os.Exit(1)
}

// Daemon is a long-running component.
type Daemon interface {
	Run(ctx context.Context) error
}

// RunDaemon runs d until SIGINT or SIGTERM and exits non-zero if it failed.
func RunDaemon(prog string, log *zap.Logger, d Daemon) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.Run(gctx) })
	err := g.Wait()
	stop()
	_ = log.Sync()
	if err != nil {
		Fatal(prog, err)
	}
}
