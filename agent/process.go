package agent

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ProcessSpec is one worker process to start.
type ProcessSpec struct {
	Path string
	Args []string
	Dir  string
	Env  []string
	// Output receives stdout and stderr.
	Output io.Writer
	// LogPath is the file Output appends to, for a spawner whose workers
	// outlive this agent and so open it themselves (ShimSpawner).
	LogPath string
	// ID names the worker among this node's (a shim's directory).
	ID string
	// Meta is kept with a shimmed worker and handed back on adoption.
	Meta []byte
	// ReportToken is the workers' report token (also in Env), kept with a
	// shimmed worker and handed back on adoption.
	ReportToken []byte
	// OrphanTimeout is how long a shimmed worker outlives an agent that
	// vanished without a word.
	OrphanTimeout time.Duration
	// Credential, when set, is the user and groups the process runs as
	// (from ResolveRunAs).
	Credential *syscall.Credential
	// Nice is the launcher's nice value, and its session's; 0 is
	// workerNice. Only a shim applies it.
	Nice int
}

// Exit is how a worker's launcher ended.
type Exit struct {
	Code   int
	Signal string
}

// Process is a started worker: the launcher and its whole process group.
type Process interface {
	Pid() int
	// Wait blocks until the launcher exits.
	Wait() Exit
	// Reason is the process's own account of its end, if it has one (a
	// shim that killed workers no agent adopted in time), else "". Called
	// once Wait has returned.
	Reason() string
	// Kill terminates the process group: SIGTERM, then SIGKILL after grace,
	// and returns once no process of the group is left.
	Kill(grace time.Duration) error
	// Detach lets go of the workers without stopping them: they run on
	// for hold, for the next agent to adopt, and Wait returns. Only for
	// processes of a Spawner that hands over.
	Detach(hold time.Duration) error
}

// Spawner starts worker processes; tests replace it.
type Spawner interface {
	Spawn(spec ProcessSpec) (Process, error)
	// HandsOver reports whether the workers it starts can outlive this
	// agent for the next one to adopt (Process.Detach, then Adopt).
	// Workers that cannot are stopped with the agent.
	HandsOver() bool
	// Adopt finds the workers a previous agent left running, with their
	// status if they have ended since.
	Adopt() ([]Adopted, error)
}

// ExecSpawner runs workers as real processes, each launcher in a session
// (and so a process group) of its own: its parent can signal torchrun and
// every worker it forked at once, and the launcher's session's autogroup
// can be given the workers' priority without the parent's (yieldCPU). In
// production that parent is the worker's shim (see shim.go), which runs
// the launcher with it; the agent itself spawns through ShimSpawner.
type ExecSpawner struct {
	// ProcRoot is where to look for leftover group members (default /proc).
	ProcRoot string
	// Reaper says that the calling process is a child subreaper
	// (PR_SET_CHILD_SUBREAPER) that spawns nothing but this one launcher,
	// as a shim is: every child of it counts as the launcher's, so that
	// workers orphaned by a launcher that died on its own (torchrun
	// OOM-killed), reparented to it rather than to init, are still found
	// and killed with the rest.
	Reaper bool
}

func (s ExecSpawner) Spawn(spec ProcessSpec) (Process, error) {
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Dir, cmd.Env = spec.Dir, spec.Env
	cmd.Stdout, cmd.Stderr = spec.Output, spec.Output
	// No Pdeathsig: the parent stops the whole group itself when it decides
	// to (a shim on the agent's request, or when no agent adopted the
	// workers in time), and Pdeathsig would only reach the launcher, not the
	// workers it forked. Nor does systemd stop them: the agent's unit has
	// KillMode=process, which signals the agent alone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: spec.Credential}
	// With a pipe for output, Wait would also wait for every group member
	// still holding it; the launcher's exit is what matters here.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", spec.Path, err)
	}
	p := &execProcess{cmd: cmd, procRoot: s.ProcRoot, reaper: s.Reaper, done: make(chan struct{})}
	go p.reap()
	return p, nil
}

// HandsOver is false: nothing would stop an ExecSpawner's workers in time
// once the agent is gone.
func (ExecSpawner) HandsOver() bool { return false }

// Adopt finds nothing, since no ExecSpawner's workers are left running.
func (ExecSpawner) Adopt() ([]Adopted, error) { return nil, nil }

type execProcess struct {
	cmd      *exec.Cmd
	procRoot string
	reaper   bool
	done     chan struct{}
	exit     Exit
}

func (p *execProcess) Pid() int { return p.cmd.Process.Pid }

func (p *execProcess) reap() {
	err := p.cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.exit = Exit{Code: -1, Signal: unix.SignalName(ws.Signal())}
		} else {
			p.exit = Exit{Code: ee.ExitCode()}
		}
	default:
		p.exit = Exit{Code: -1, Signal: "unknown"}
	}
	close(p.done)
}

func (p *execProcess) Wait() Exit {
	<-p.done
	return p.exit
}

// Reason is "": the exit status says all there is.
func (p *execProcess) Reason() string { return "" }

// errNoHandover refuses to detach a worker nothing would stop in time.
var errNoHandover = errors.New("workers started without a shim cannot outlive the agent")

// Detach is refused: see ExecSpawner.HandsOver.
func (p *execProcess) Detach(time.Duration) error { return errNoHandover }

// groupSweepTimeout bounds the wait for SIGKILLed group members to vanish
// (uninterruptible sleep in a GPU driver call can delay them).
const groupSweepTimeout = 30 * time.Second

func (p *execProcess) Kill(grace time.Duration) error {
	pgid := p.Pid()
	// The launcher's group and those of every process found below it:
	// torchrun (torch 2.x) starts each worker in a session of its own, so
	// a signal to the launcher's group alone does not reach them, and a
	// launcher SIGKILLed before its workers leaves them to init, running
	// on. Each scan adds what is below the launcher then, before any
	// SIGKILL can orphan it.
	groups := map[int]bool{pgid: true}
	// No grace means no SIGTERM either: a fenced worker must not get to run
	// a shutdown handler (a checkpoint save) at all.
	if grace > 0 && p.alive(groups) {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		deadline := time.Now().Add(grace)
		for time.Now().Before(deadline) && p.alive(groups) && !p.onlyLauncherLeft(pgid, groups) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	deadline := time.Now().Add(groupSweepTimeout)
	for p.alive(groups) {
		for g := range groups {
			_ = syscall.Kill(-g, syscall.SIGKILL)
		}
		for _, pid := range p.members(groups) {
			_ = syscall.Kill(pid, syscall.SIGKILL) // one that left for a group it may not be killed by
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process groups %v still have members after SIGKILL", slices.Sorted(maps.Keys(groups)))
		}
		time.Sleep(50 * time.Millisecond)
	}
	<-p.done
	return nil
}

// onlyLauncherLeft reports whether the workers are gone and only the
// launcher remains. torchrun (1.13) then waits minutes for its peers inside
// a call that ignores SIGTERM; its workers, the ones holding GPUs, have
// already exited, so the rest of the grace would only delay recovery.
func (p *execProcess) onlyLauncherLeft(pgid int, groups map[int]bool) bool {
	members := p.members(groups)
	return len(members) == 1 && members[0] == pgid
}

// alive reports whether any process other than a zombie is in groups,
// adding to groups those of the processes below them. The launcher itself
// counts until reaped.
func (p *execProcess) alive(groups map[int]bool) bool {
	members := p.members(groups)
	select {
	case <-p.done:
		return len(members) > 0
	default:
		return true
	}
}

// members lists the live (non-zombie) processes in groups, by reading
// /proc/<pid>/stat, and adds to groups the process group of every process
// below one of them (a child, a grandchild, whatever its group).
func (p *execProcess) members(groups map[int]bool) []int {
	var procs []procStat
	for _, pr := range readProcs(p.procRoot) {
		if pr.state != 'Z' && pr.state != 'X' {
			procs = append(procs, pr)
		}
	}
	// A process is a member when its group is one of groups or its parent
	// is a member (or, for a reaper, is this process): until nothing is
	// added (one pass per level of the tree). A member in this process's
	// own group (which a job cannot join from the session of its own it
	// starts in) would be killed with its launcher's group, never by
	// signalling that group: it holds the caller.
	own, self := syscall.Getpgrp(), -1
	if p.reaper {
		self = os.Getpid()
	}
	in := map[int]bool{}
	for added := true; added; {
		added = false
		for _, pr := range procs {
			if !in[pr.pid] && (groups[pr.pgrp] || in[pr.ppid] || pr.ppid == self) {
				in[pr.pid], added = true, true
				if pr.pgrp != own && pr.pgrp > 1 {
					groups[pr.pgrp] = true
				}
			}
		}
	}
	pids := make([]int, 0, len(in))
	for pid := range in {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids
}

// procStat is what members and the shim read of a process.
type procStat struct {
	pid, ppid, pgrp, sid int
	state                byte
}

// readProcs lists the processes under root (default /proc) from each
// /proc/<pid>/stat; a process that vanished meanwhile is left out.
func readProcs(root string) []procStat {
	if root == "" {
		root = "/proc"
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var procs []procStat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(root, e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the parenthesised command: state ppid pgrp session ...
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 4 || len(fields[0]) != 1 {
			continue
		}
		ppid, err1 := strconv.Atoi(fields[1])
		pgrp, err2 := strconv.Atoi(fields[2])
		sid, err3 := strconv.Atoi(fields[3])
		if err1 == nil && err2 == nil && err3 == nil {
			procs = append(procs, procStat{pid: pid, ppid: ppid, pgrp: pgrp, sid: sid, state: fields[0][0]})
		}
	}
	return procs
}
