// Package cli holds what the daemons' mains share: logger construction and
// flag helpers.
package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/coreos/go-systemd/v22/daemon"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/rdzv/rdzv/buildinfo"
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

// ErrExit is returned by Parse when it has answered --help or --version:
// the caller exits 0.
var ErrExit = errors.New("answered --help or --version")

// Parse parses a daemon's flags, adding --version. --help and --version
// print to stdout and return ErrExit (exit 0, as any command's help);
// a flag error is returned with a pointer to --help, and nothing else is
// printed, so the caller prints it once.
func Parse(fs *flag.FlagSet, args []string, about string) error {
	version := fs.Bool("version", false, "print the version and exit")
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Print(Usage(fs, about))
		return ErrExit
	case err != nil:
		return fmt.Errorf("%w (see %s --help)", err, fs.Name())
	case *version:
		fmt.Printf("%s %s\n", fs.Name(), buildinfo.Get())
		return ErrExit
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q: %s takes flags only (see %s --help)", fs.Arg(0), fs.Name(), fs.Name())
	}
	return nil
}

// Usage is a daemon's --help: what it is, then every flag with its default.
// docs/daemons.md is made of it.
func Usage(fs *flag.FlagSet, about string) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "Usage: %s [flags]\n\n%s\n\nFlags (a flag given overrides the --config file):\n", fs.Name(), strings.TrimSpace(about))
	out := fs.Output()
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(out)
	return b.String()
}

// Daemon is a long-running component.
type Daemon interface {
	Run(ctx context.Context) error
}

// readier is a Daemon that says when it is ready for systemd's
// Type=notify: the controller once it serves, the agent once it supervises
// (see the units in deploy/systemd).
type readier interface {
	Ready() <-chan struct{}
}

// RunDaemon runs d until SIGINT or SIGTERM and exits non-zero if it failed.
// Under systemd (NOTIFY_SOCKET set) it sends READY=1 when d is ready and
// STOPPING=1 when it is told to stop; elsewhere those are no-ops.
func RunDaemon(prog string, log *zap.Logger, d Daemon) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	running, ended := context.WithCancel(ctx)
	notified := make(chan struct{})
	go func() {
		defer close(notified)
		notify(running, log, d)
	}()
	err := d.Run(ctx)
	ended()
	<-notified
	stop()
	_ = log.Sync()
	if err != nil {
		Fatal(prog, err)
	}
}

// notify tells systemd when d is ready and when it is stopping.
func notify(ctx context.Context, log *zap.Logger, d Daemon) {
	sd := func(state string) {
		if _, err := daemon.SdNotify(false, state); err != nil {
			log.Warn("notifying systemd failed", zap.String("state", state), zap.Error(err))
		}
	}
	if r, ok := d.(readier); ok {
		select {
		case <-r.Ready():
			sd(daemon.SdNotifyReady)
		case <-ctx.Done():
		}
	}
	<-ctx.Done()
	sd(daemon.SdNotifyStopping)
}

// ParseConfig parses args into fs (see Parse), then loads the config file
// that path names with load, or returns def without one; the caller applies
// the flags given over it.
func ParseConfig[T any](fs *flag.FlagSet, args []string, about string, path *string, def T, load func(string) (T, error)) (T, error) {
	if err := Parse(fs, args, about); err != nil {
		return def, err
	}
	if *path == "" {
		return def, nil
	}
	return load(*path)
}

// ControllerFlag registers --controller, the controller address(es) of a
// daemon that connects to it, $RDZV_CONTROLLER by default.
func ControllerFlag(fs *flag.FlagSet) *string {
	return fs.String("controller", os.Getenv("RDZV_CONTROLLER"), "controller host:port, or replicas host:port,host:port,... (default $RDZV_CONTROLLER)")
}

// ApplyController sets field from --controller when it was given, or when
// the config file left the field empty (so $RDZV_CONTROLLER fills it).
func ApplyController(fs *flag.FlagSet, addr, field *string) {
	if Set(fs)["controller"] || *field == "" {
		*field = *addr
	}
}
