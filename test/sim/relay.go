package sim

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/rdzv/rdzv/test/testpki"
)

// Relay is the real rdzv-relay binary, listening on 127.0.0.1, in front
// of a Controller.
type Relay struct {
	Addr    string
	LogPath string
	// PprofSocket serves the relay's runtime profiles (--pprof-socket).
	PprofSocket string

	cmd    *exec.Cmd
	exited chan struct{}
}

// StartRelay starts relay i (its certificate from certs.IssueRelay) with
// bin, towards the controller at controller, logging to dir.
func StartRelay(bin, dir string, certs *Certs, i int, controller string) (*Relay, error) {
	if err := certs.IssueRelay(i); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{Addr: l.Addr().String(), LogPath: filepath.Join(dir, RelayName(i)+".log"), PprofSocket: filepath.Join(dir, RelayName(i)+".pprof.sock"),
		exited: make(chan struct{})}
	l.Close()
	logFile, err := os.OpenFile(r.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	args := append([]string{"--listen", r.Addr, "--controller", controller, "--http-listen", "", "--log-level", "info", "--pprof-socket", r.PprofSocket},
		testpki.DaemonArgs(certs.Dir, "relay", RelayName(i))...)
	r.cmd = exec.Command(bin, args...)
	r.cmd.Stdout, r.cmd.Stderr = logFile, logFile
	// It inherits this process's raised RLIMIT_NOFILE, and dies with it.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() {
		_ = r.cmd.Wait()
		logFile.Close()
		close(r.exited)
	}()
	// Ready once it accepts connections.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", r.Addr); err == nil {
			c.Close()
			return r, nil
		}
		select {
		case <-r.exited:
			return nil, fmt.Errorf("%s exited at start: %s", RelayName(i), TailFile(r.LogPath, 5))
		default:
		}
		if time.Now().After(deadline) {
			r.Stop()
			return nil, fmt.Errorf("%s does not listen on %s", RelayName(i), r.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Pid is the relay's process id.
func (r *Relay) Pid() int { return r.cmd.Process.Pid }

// Stop sends SIGTERM, and SIGKILL if the relay is not gone in 10s.
func (r *Relay) Stop() {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.exited
	}
}
