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
	"github.com/rdzv/rdzv/wire"
	"github.com/rdzv/rdzv/wire/yamlcheck"
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

// Apply overrides the config's files (at field, "tls") with the flags
// given.
func (t TLSFiles) Apply(f *File, field string, files *pki.Files) {
	f.Override("tls-cert", field+".cert", func() { files.Cert = *t.cert })
	f.Override("tls-key", field+".key", func() { files.Key = *t.key })
	f.Override("tls-ca", field+".ca", func() { files.CA = *t.ca })
}

// ExitConfig is a daemon's exit status when its configuration (the
// --config file or the flags) is wrong: EX_CONFIG of sysexits.h. The
// systemd units name it in RestartPreventExitStatus, so that a daemon
// is not restarted into the same mistake twice a second, forever.
const ExitConfig = 78

// ErrConfig marks an error in a daemon's configuration (exit ExitConfig).
var ErrConfig = errors.New("bad configuration")

// configError is an error of the configuration, shown as it is.
type configError struct{ err error }

func (e *configError) Error() string   { return e.err.Error() }
func (e *configError) Unwrap() []error { return []error{e.err, ErrConfig} }

// badConfig marks err as the configuration's; nil stays nil.
func badConfig(err error) error {
	if err == nil {
		return nil
	}
	return &configError{err}
}

// Fatal prints a startup error and exits non-zero: ExitConfig for an
// error of the configuration, 1 for any other.
func Fatal(prog string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
	if errors.Is(err, ErrConfig) {
		os.Exit(ExitConfig)
	}
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
		return badConfig(fmt.Errorf("%w (see %s --help)", err, fs.Name()))
	case *version:
		fmt.Printf("%s %s\n", fs.Name(), buildinfo.Get())
		return ErrExit
	case fs.NArg() > 0:
		return badConfig(fmt.Errorf("unexpected argument %q: %s takes flags only (see %s --help)", fs.Arg(0), fs.Name(), fs.Name()))
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

// File is a daemon's configuration as it is read: the --config file, then
// the flags given over it. Its errors, and Validate's, are the
// configuration's (exit ExitConfig), each placed in the file where it can
// be. Used by the daemon's main goroutine only.
type File struct {
	fs   *flag.FlagSet
	set  map[string]bool
	path string
	pos  yamlcheck.Positions
	// check is --check-config: Done answers, and the daemon exits.
	check bool
	// fields are the config fields the flags set, by flag.
	fields map[string]string
}

// ParseConfig registers --check-config, parses args into fs (see Parse),
// then loads the config file that path names with load, or returns def
// without one. The caller applies the flags given over it (File.Override)
// and ends with File.Done.
func ParseConfig[T any](fs *flag.FlagSet, args []string, about string, path *string, def T, load func(string) (T, yamlcheck.Positions, error)) (T, *File, error) {
	check := fs.Bool("check-config", false, fmt.Sprintf("read and validate the config file and flags, print \"ok\" or each problem, and exit (0, or %d for a bad configuration) without starting anything", ExitConfig))
	f := &File{fs: fs, fields: map[string]string{}}
	if err := Parse(fs, args, about); err != nil {
		return def, f, err
	}
	f.set, f.path, f.check = Set(fs), *path, *check
	if f.path == "" {
		return def, f, nil
	}
	cfg, pos, err := load(f.path)
	f.pos = pos
	return cfg, f, badConfig(err)
}

// Override applies a flag's value when the flag was given on the command
// line, so that otherwise the config file's value stands. field is the
// config field the flag sets: once a flag sets it, errors about it are not
// placed in the file.
func (f *File) Override(flag, field string, apply func()) {
	f.fields[flag] = field
	if f.set[flag] {
		f.pos.Without(field)
		apply()
	}
}

// Flags are the config fields the flags set, by flag name.
func (f *File) Flags() map[string]string { return f.fields }

// Usage is a flag's help text.
func (f *File) Usage(flag string) string {
	if fl := f.fs.Lookup(flag); fl != nil {
		return fl.Usage
	}
	return ""
}

// Done ends the configuration with err, Validate's verdict and any other
// problem found, joined: it returns it as the configuration's error, each
// problem that names a field of the file placed at its line and column.
// With --check-config it prints "ok" for a good configuration and returns
// ErrExit (exit 0), or returns the error (exit ExitConfig).
func (f *File) Done(err error) error {
	if err = f.pos.Place(err); err != nil {
		// The file is named when the errors are in it, not when they are
		// all the flags' or the hostname's.
		in := ""
		if yamlcheck.Placed(err) {
			in = f.path
		}
		err = badConfig(describe(in, err))
	}
	if f.check && err == nil {
		fmt.Println("ok")
		return ErrExit
	}
	return err
}

// describe is err with the file it is about, one problem a line.
func describe(path string, err error) error {
	return &problems{path: path, errs: flatten(err), err: err}
}

// flatten lists the errors that err joins, however deeply (a section's
// Validate joins its own).
func flatten(err error) []error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var errs []error
	for _, e := range j.Unwrap() {
		errs = append(errs, flatten(e)...)
	}
	return errs
}

// problems are a configuration's errors, about the file at path (if any).
type problems struct {
	path string
	// errs are the problems err joins, or err alone.
	errs []error
	err  error
}

func (p *problems) Error() string {
	var b strings.Builder
	if p.path != "" {
		b.WriteString(p.path + ": ")
	}
	if len(p.errs) < 2 {
		b.WriteString(p.err.Error())
		return b.String()
	}
	fmt.Fprintf(&b, "%d problems:", len(p.errs))
	for _, e := range p.errs {
		b.WriteString("\n  " + e.Error())
	}
	return b.String()
}

func (p *problems) Unwrap() error { return p.err }

// ControllerFlag registers --controller, the controller address(es) of a
// daemon that connects to it, $RDZV_CONTROLLER by default.
func ControllerFlag(fs *flag.FlagSet) *string {
	return fs.String("controller", os.Getenv("RDZV_CONTROLLER"), "controller host:port, or replicas host:port,host:port,... (default $RDZV_CONTROLLER)")
}

// ApplyController sets field (the config's "controller") from
// --controller when it was given, or when the config file left the field
// empty (so $RDZV_CONTROLLER fills it).
func ApplyController(f *File, addr, field *string) {
	f.Override("controller", "controller", func() { *field = *addr })
	if *field == "" {
		*field = *addr
	}
}

// CheckLogLevel checks the log_level field.
func CheckLogLevel(level string) error {
	if _, err := zapcore.ParseLevel(level); err != nil {
		return &wire.FieldError{Field: "log_level", Value: wire.Quote(level), Reason: "must be debug, info, warn or error"}
	}
	return nil
}
