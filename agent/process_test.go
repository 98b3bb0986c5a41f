package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// spawnShell starts script under /bin/sh with ExecSpawner, its output in a
// file as the supervisor's is, and returns the process and a reader of its
// output so far.
func spawnShell(t *testing.T, script string) (Process, func() string) {
	t.Helper()
	dir := t.TempDir()
	out, err := os.Create(filepath.Join(dir, "output"))
	require.NoError(t, err)
	defer out.Close() // the child has its own descriptor
	p, err := ExecSpawner{}.Spawn(ProcessSpec{Path: "/bin/sh", Args: []string{"-c", script}, Dir: dir, Env: os.Environ(), Output: out})
	require.NoError(t, err)
	// Whatever a test leaves running is not left to outlive it.
	t.Cleanup(func() { _ = p.Kill(0) })
	return p, func() string {
		b, err := os.ReadFile(out.Name())
		require.NoError(t, err)
		return string(b)
	}
}

func TestExecProcessKillsWholeGroup(t *testing.T) {
	tests := []struct {
		name string
		// script prints "ready" once its traps are set and its children
		// forked.
		script string
		// members is how many live processes the group has when ready.
		members int
		grace   time.Duration
		want    Exit
	}{
		{
			name:    "launcher and child die of SIGTERM",
			script:  `sleep 300 & echo ready; wait`,
			members: 2, grace: 5 * time.Second,
			want: Exit{Code: -1, Signal: "SIGTERM"},
		},
		{
			// torchrun 1.13: only the launcher ignores SIGTERM, and once
			// its workers and theirs are gone it lingers (waiting on its
			// peers) instead of exiting. Kill sees it alone and SIGKILLs
			// it then, not at the end of the grace, which outlasts the
			// test's own timeout.
			name:    "launcher lingers alone after its workers",
			script:  `sleep 300 & sh -c 'sleep 300 & wait' & trap "" TERM; echo ready; wait; exec sleep 300`,
			members: 4, grace: time.Hour,
			want: Exit{Code: -1, Signal: "SIGKILL"},
		},
		{
			// Ignored signals are inherited: nothing in the group reacts to
			// SIGTERM, so only SIGKILL after the grace period ends it.
			name:    "whole group ignores SIGTERM",
			script:  `trap "" TERM; sleep 300 & sh -c 'sleep 300 & wait' & echo ready; wait`,
			members: 4, grace: 300 * time.Millisecond,
			want: Exit{Code: -1, Signal: "SIGKILL"},
		},
		{
			// Fencing: no grace means no SIGTERM, so a handler (which could
			// start saving a checkpoint) never runs; the launcher would
			// exit 0 from its handler, so the exit tells which signal came.
			name:    "no grace kills without SIGTERM",
			script:  `trap "exit 0" TERM; sleep 300 & echo ready; wait`,
			members: 2, grace: 0,
			want: Exit{Code: -1, Signal: "SIGKILL"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, out := spawnShell(t, tt.script)
			// The launcher leads its own group, so signalling the group
			// never reaches the agent.
			pgid := p.Pid()
			require.Eventually(t, func() bool {
				return strings.Contains(out(), "ready") && len(groupMembers(pgid)) == tt.members
			}, waitTimeout, 10*time.Millisecond, "group %d never had %d members: %v", pgid, tt.members, groupMembers(pgid))

			require.NoError(t, p.Kill(tt.grace))
			require.Empty(t, groupMembers(pgid), "Kill returned with members left")
			require.Equal(t, tt.want, p.Wait())
			require.NoError(t, p.Kill(tt.grace), "killing a dead group again")
		})
	}
}

// TestExecProcessSweepsAfterLauncherExit is what the supervisor relies on
// after torchrun exits: workers it left in its group are still killed.
func TestExecProcessSweepsAfterLauncherExit(t *testing.T) {
	p, out := spawnShell(t, `sleep 300 & echo ready; exit 5`)
	require.Equal(t, Exit{Code: 5}, p.Wait())
	require.Contains(t, out(), "ready")
	pgid := p.Pid()
	require.Len(t, groupMembers(pgid), 1, "the orphaned sleep should still be in the group")

	require.NoError(t, p.Kill(0))
	require.Empty(t, groupMembers(pgid))
	require.Equal(t, Exit{Code: 5}, p.Wait(), "the launcher's exit is kept")
}

// TestExecProcessWaitWithPipeOutput: Wait promises to return when the
// launcher exits. With an Output that is not an *os.File, os/exec copies
// through a pipe and cmd.Wait also waits for every holder of the pipe's
// write end; WaitDelay bounds that, so a worker left in the group cannot
// delay Wait.
func TestExecProcessWaitWithPipeOutput(t *testing.T) {
	p, err := ExecSpawner{}.Spawn(ProcessSpec{Path: "/bin/sh", Args: []string{"-c", "sleep 300 & exit 5"}, Dir: t.TempDir(), Output: &syncBuffer{}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Kill(0)) })
	exited := make(chan Exit, 1)
	go func() { exited <- p.Wait() }()
	select {
	case e := <-exited:
		require.Equal(t, Exit{Code: 5}, e)
	case <-time.After(waitTimeout):
		require.FailNow(t, "Wait did not return after the launcher exited")
	}
}

func TestExecProcessExit(t *testing.T) {
	tests := []struct {
		script string
		want   Exit
	}{
		{"exit 0", Exit{}},
		{"exit 7", Exit{Code: 7}},
		{"exit 255", Exit{Code: 255}},
		{"kill -KILL $$", Exit{Code: -1, Signal: "SIGKILL"}},
		{"kill -TERM $$", Exit{Code: -1, Signal: "SIGTERM"}},
		{"kill -SEGV $$", Exit{Code: -1, Signal: "SIGSEGV"}},
	}
	for _, tt := range tests {
		t.Run(tt.script, func(t *testing.T) {
			p, _ := spawnShell(t, tt.script)
			require.Equal(t, tt.want, p.Wait())
		})
	}
}

func TestExecSpawnerRunsInDirWithEnv(t *testing.T) {
	dir := t.TempDir()
	out := &syncBuffer{}
	p, err := ExecSpawner{}.Spawn(ProcessSpec{
		Path: "/bin/sh", Args: []string{"-c", `echo "$PWD $ONLY_VAR ${HOME:-nohome}"; echo oops >&2`},
		Dir: dir, Env: []string{"ONLY_VAR=set"}, Output: out,
	})
	require.NoError(t, err)
	require.Equal(t, Exit{}, p.Wait())
	require.Equal(t, dir+" set nohome\noops\n", out.String(), "stdout and stderr both go to Output, env is exactly Env")
}

func TestExecSpawnerMissingBinary(t *testing.T) {
	_, err := ExecSpawner{}.Spawn(ProcessSpec{Path: "/nonexistent/torchrun", Dir: t.TempDir(), Output: &syncBuffer{}})
	require.ErrorContains(t, err, "/nonexistent/torchrun")
}

// TestExecProcessKillsWorkersInSessionsOfTheirOwn: torchrun (torch 2.x)
// starts each worker with start_new_session, outside the launcher's
// group. A stop, and a fence (no grace: the launcher SIGKILLed at once),
// must still end them, not leave them running under init.
func TestExecProcessKillsWorkersInSessionsOfTheirOwn(t *testing.T) {
	for _, grace := range []time.Duration{0, 500 * time.Millisecond} {
		t.Run(grace.String(), func(t *testing.T) {
			p, out := spawnShell(t, `setsid sleep 300 & echo "worker $!"; echo ready; wait`)
			// Until setsid(2) has run in the forked child, the worker is
			// still in the launcher's group.
			var worker int
			require.Eventually(t, func() bool {
				_, err := fmt.Sscanf(out(), "worker %d\n", &worker)
				return err == nil && strings.Contains(out(), "ready") && processLive(worker) && !slices.Contains(groupMembers(p.Pid()), worker)
			}, waitTimeout, 10*time.Millisecond, "the worker never started in a session of its own: %q", out())

			require.NoError(t, p.Kill(grace))
			require.False(t, processLive(worker), "worker %d outlived its launcher", worker)
		})
	}
}

// processLive reports whether pid runs (is neither gone nor a zombie).
func processLive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && len(s) > i+2 && s[i+2] != 'Z' && s[i+2] != 'X'
}
