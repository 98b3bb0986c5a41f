package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/test/testpki"
)

// ControllerConfig is how to run the real rdzv-controller binary.
type ControllerConfig struct {
	// Bin is the rdzv-controller binary.
	Bin string
	// Dir holds its data directory (Dir/data), log (Dir/controller.log,
	// appended to across restarts) and profile socket.
	Dir string
	// Certs has its certificate (ControllerName, for 127.0.0.1).
	Certs *Certs
	// Heartbeat is its liveness settings.
	Heartbeat health.Heartbeat
	// Pprof serves its runtime profiles on PprofSocket.
	Pprof bool
	// ConfigFile, if set, is its --config (the flags above override it).
	ConfigFile string
	// Env is added to the environment it inherits (KEY=VALUE), e.g. to
	// set the Go runtime's GOGC or GOMEMLIMIT for it alone.
	Env []string
}

// Controller is the real rdzv-controller binary, with embedded etcd and
// mutual TLS, listening on 127.0.0.1.
type Controller struct {
	cfg         ControllerConfig
	Addr        string
	DataDir     string
	PprofSocket string
	LogPath     string

	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// StartController starts the controller on a free port with a fresh data
// directory.
func StartController(cfg ControllerConfig) (*Controller, error) {
	p, err := NewController(cfg)
	if err != nil {
		return nil, err
	}
	return p, p.Start()
}

// NewController prepares the controller (its free port, its fresh data
// directory) without starting it; Start starts it.
func NewController(cfg ControllerConfig) (*Controller, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Controller{cfg: cfg, Addr: l.Addr().String(), DataDir: filepath.Join(cfg.Dir, "data"),
		LogPath: filepath.Join(cfg.Dir, "controller.log")}
	l.Close()
	if cfg.Pprof {
		p.PprofSocket = filepath.Join(cfg.Dir, "pprof.sock")
	}
	if err := os.MkdirAll(p.DataDir, 0o700); err != nil {
		return nil, err
	}
	return p, nil
}

// Start starts a controller that NewController prepared.
func (p *Controller) Start() error { return p.start() }

// Restart starts the controller again, after it exited, on the same
// address and data directory.
func (p *Controller) Restart() error {
	if p.Running() {
		return errors.New("the controller is still running")
	}
	return p.start()
}

func (p *Controller) start() error {
	logFile, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	hb := p.cfg.Heartbeat
	args := append([]string{"--listen", p.Addr, "--data-dir", p.DataDir, "--http-listen", "127.0.0.1:0",
		"--heartbeat-interval", hb.Interval.String(), "--heartbeat-timeout", hb.Timeout.String(), "--heartbeat-vouched-timeout", hb.Vouched.String(), "--log-level", "info"},
		testpki.DaemonArgs(p.cfg.Certs.Dir, "controller", ControllerName)...)
	if p.PprofSocket != "" {
		args = append(args, "--pprof-socket", p.PprofSocket)
	}
	if p.cfg.ConfigFile != "" {
		args = append(args, "--config", p.cfg.ConfigFile)
	}
	p.cmd = exec.Command(p.cfg.Bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	if len(p.cfg.Env) > 0 {
		p.cmd.Env = append(os.Environ(), p.cfg.Env...)
	}
	// The controller inherits this process's raised RLIMIT_NOFILE, and dies
	// with it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting %s: %w", p.cfg.Bin, err)
	}
	exited := make(chan struct{})
	p.exited = exited
	go func() {
		err := p.cmd.Wait()
		logFile.Close()
		p.waitErr = err
		close(exited)
	}()
	return nil
}

// Pid is the running controller's process id, 0 before it started.
func (p *Controller) Pid() int {
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Stop sends SIGTERM, and SIGKILL if the controller is not gone in 20s;
// a controller never started is left as it is.
func (p *Controller) Stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		p.Kill()
	}
}

// Kill SIGKILLs the controller, as a crash would, and waits until it is
// gone.
func (p *Controller) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Running reports whether the controller has not exited.
func (p *Controller) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// WaitErr is how the controller exited; nil while it runs.
func (p *Controller) WaitErr() error {
	select {
	case <-p.exited:
		return p.waitErr
	default:
		return nil
	}
}

// EtcdEndpoint is the embedded etcd's client endpoint (its Unix socket).
func (p *Controller) EtcdEndpoint() (string, error) {
	sock, err := filepath.Abs(controller.Config{DataDir: p.DataDir}.EmbeddedEtcdSocket())
	if err != nil {
		return "", err
	}
	return "unix://" + sock, nil
}

// WaitLeading waits until the controller answers op's API calls as leader.
func (p *Controller) WaitLeading(ctx context.Context, op *client.Client) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := op.ListNodes(cctx, &rdzvv1.ListNodesRequest{PageSize: 1})
		cancel()
		if err == nil {
			return nil
		}
		if !p.Running() {
			return fmt.Errorf("the controller exited: %w", p.WaitErr())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the controller does not lead: %w (last: %w)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Tail is the last n lines of the controller's log, for diagnostics.
func (p *Controller) Tail(n int) string { return TailFile(p.LogPath, n) }

// TailFile is the last n lines of the file at path, for diagnostics.
func TailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// RaiseNoFile lifts this process's open-file limit to need, which the
// controller inherits: each simulated agent holds a connection here, and
// each of them one there.
func RaiseNoFile(need uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Max < need {
		// Only root may raise the hard limit.
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: need, Max: need}); err != nil {
			return fmt.Errorf("RLIMIT_NOFILE hard limit is %d, %d needed, and raising it failed: %w (raise `ulimit -Hn`)", lim.Max, need, err)
		}
		return nil
	}
	lim.Cur = lim.Max
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

// WaitFor polls cond until it holds or ctx ends; the error says what was
// awaited and the state cond last described.
func WaitFor(ctx context.Context, what string, cond func() (bool, string)) error {
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %s: %w", what, state, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}
