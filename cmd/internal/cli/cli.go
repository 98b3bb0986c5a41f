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

	"github.com/rdzv/rdzv/pki"
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

// Override returns a function that applies a flag's value only when the
// flag was given on the command line, so that otherwise the config file's
// value stands.
func Override(fs *flag.FlagSet) func(name string, apply func()) {
	set := Set(fs)
	return func(name string, apply func()) {
		if set[name] {
			apply()
		}
	}
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

// TLSFiles are the --tls-cert, --tls-key and --tls-ca flags.
type TLSFiles struct{ cert, key, ca *string }

// TLSFlags registers the TLS file flags of a daemon whose certificate has
// role.
func TLSFlags(fs *flag.FlagSet, role string) TLSFiles {
	return TLSFiles{
		cert: fs.String("tls-cert", "", "this "+role+"'s certificate (rdzvctl pki issue "+role+" NAME)"),
		key:  fs.String("tls-key", "", "this "+role+"'s private key"),
		ca:   fs.String("tls-ca", "", "the cluster CA certificate (ca.crt)"),
	}
}

// Apply overrides the config's files with the flags given.
func (t TLSFiles) Apply(fs *flag.FlagSet, files *pki.Files) {
	set := Set(fs)
	if set["tls-cert"] {
		files.Cert = *t.cert
	}
	if set["tls-key"] {
		files.Key = *t.key
	}
	if set["tls-ca"] {
		files.CA = *t.ca
	}
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
