package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a background process on a Host.
type Proc struct {
	Name string
	Host *Host

	pid     int
	logPath string
	done    chan struct{}
	err     error

	stopOnce sync.Once
	stopErr  error
}

// Start runs argv on h in the background, with env added to the test's
// environment and stdout and stderr appended to <LogDir>/<host>-<name>.log.
// The process and its process group are stopped when t ends, and in any case
// when the cluster is removed.
func (h *Host) Start(t testing.TB, name string, env []string, argv ...string) *Proc {
	t.Helper()
	logPath := filepath.Join(h.c.LogDir, h.Name+"-"+name+".log")
	// Appending keeps the output of earlier runs of a restarted process.
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("netns: %v", err)
	}
	defer f.Close()
	fmt.Fprintf(f, "=== %s %s: %s\n", time.Now().Format(time.RFC3339Nano), h.Name, strings.Join(argv, " "))
	cmd := h.command(context.Background(), env, argv)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("netns: starting %s on %s: %v", name, h.Name, err)
	}
	p := &Proc{Name: name, Host: h, pid: cmd.Process.Pid, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	h.c.mu.Lock()
	h.c.procs = append(h.c.procs, p)
	h.c.mu.Unlock()
	t.Cleanup(func() {
		if err := p.terminate(); err != nil {
			t.Errorf("netns: %v", err)
		}
	})
	return p
}

// Run runs argv on h to completion and returns what it wrote. Cancelling ctx
// kills its whole process group.
func (h *Host) Run(ctx context.Context, env []string, argv ...string) (stdout, stderr string, err error) {
	cmd := h.command(ctx, env, argv)
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A child that escaped the process group could hold the pipes open.
	cmd.WaitDelay = time.Second
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), errOut.String(), fmt.Errorf("%s on %s: %w (stderr: %q)",
			strings.Join(argv, " "), h.Name, err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), errOut.String(), nil
}

// Pid is the process group leader's pid, which is also the group's id.
func (p *Proc) Pid() int { return p.pid }

// LogPath is the file the process's stdout and stderr go to.
func (p *Proc) LogPath() string { return p.logPath }

// Exited is closed once the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.done }

// Wait waits for the process to exit and returns how it ended, as
// exec.Cmd.Wait does.
func (p *Proc) Wait() error {
	<-p.done
	return p.err
}

// Stop sends sig to the process's whole group, which outlives the process
// itself while any child is still in it. A group with nobody left is not an
// error.
func (p *Proc) Stop(sig syscall.Signal) error {
	if err := syscall.Kill(-p.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signalling %s on %s: %w", p.Name, p.Host.Name, err)
	}
	return nil
}

// terminate stops the process group gracefully, then by force, once: both
// the test that started it and the cluster's cleanup call it.
func (p *Proc) terminate() error {
	p.stopOnce.Do(func() { p.stopErr = p.stopGroup() })
	return p.stopErr
}

func (p *Proc) stopGroup() error {
	if err := p.Stop(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(stopGrace):
	}
	// Also catches children that outlived a leader which exited on SIGTERM.
	if err := p.Stop(syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(settleTimeout):
		return fmt.Errorf("%s on %s (pid %d) still running %s after SIGKILL", p.Name, p.Host.Name, p.pid, settleTimeout)
	}
}
