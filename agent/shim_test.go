package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
)

// handOver stops h as a restarting agent does, with announced reporting
// whether the controller was told, and returns the hold it asked for.
func handOver(t *testing.T, h *supHarness, announced bool) time.Duration {
	t.Helper()
	var hold time.Duration
	h.sup.OnHandover(func(d time.Duration) bool { hold = d; return announced })
	h.stop()
	return hold
}

func withRestartGrace(d time.Duration) func(*Config) {
	return func(c *Config) { c.RestartGrace.Duration = d }
}

func TestAgentRestartLeavesWorkersToTheNextAgent(t *testing.T) {
	h := newSupervisor(t, withRestartGrace(time.Minute))
	h.sup.Assign(h.assignment("train", 4, "hang"))
	h.expect("train", 4, wRunning)
	pid := h.record("train", 4).PID

	require.Equal(t, time.Minute, handOver(t, h, true), "the controller is told how long the workers run on")
	require.NotEmpty(t, groupMembers(pid), "workers keep running while no agent is there")

	next := h.successor()
	require.True(t, next.sup.Running("train"))
	statuses := next.sup.Statuses()
	require.Len(t, statuses, 1)
	require.Equal(t, "train", statuses[0].GetJob())
	require.Equal(t, uint64(4), statuses[0].GetGeneration())
	require.Equal(t, wRunning, statuses[0].GetState(), "the registration reports the adopted workers")
	require.NotEmpty(t, groupMembers(pid), "adopting does not disturb the workers")

	// The adopted generation is the node's latest: a late assignment of an
	// older one is refused, and a stop reaches the workers.
	next.sup.Assign(next.assignment("train", 3, "ok"))
	next.sup.Stop("train", 4, "job stopped")
	st := next.expect("train", 4, wStopped)
	require.Equal(t, "job stopped", st.GetMessage())
	require.Empty(t, groupMembers(pid))
	_, err := os.Stat(filepath.Join(h.stateDir, "workers", "train.4"))
	require.ErrorIs(t, err, os.ErrNotExist, "the shim's files are removed once its exit is recorded")
}

func TestOrphanedWorkersAreFenced(t *testing.T) {
	tests := []struct {
		name      string
		announced bool
	}{
		// The controller was not told, so it goes by heartbeats: the
		// workers must be gone within the orphan timeout, not the grace.
		{"controller not told", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newSupervisor(t, withRestartGrace(time.Minute))
			h.sup.SetOrphanTimeout(300 * time.Millisecond)
			h.sup.Assign(h.assignment("train", 2, "hang"))
			h.expect("train", 2, wRunning)
			pid := h.record("train", 2).PID
			handOver(t, h, tt.announced)
			require.Eventually(t, func() bool { return len(groupMembers(pid)) == 0 }, waitTimeout, 20*time.Millisecond,
				"no agent adopted the workers, so their shim kills them")

			// The next agent learns how they ended.
			next := h.successor()
			st := next.expect("train", 2, wFailed)
			require.Equal(t, "SIGKILL", st.GetSignal())
			require.Contains(t, st.GetMessage(), "fenced")
		})
	}
}

func TestNextAgentLearnsExitThatHappenedWhileAway(t *testing.T) {
	needPython(t)
	h := newSupervisor(t, withRestartGrace(time.Minute))
	h.sup.Assign(h.assignment("train", 1, "py", "-c", "import sys, time; time.sleep(0.5); sys.exit(3)"))
	h.expect("train", 1, wRunning)
	pid := h.record("train", 1).PID
	handOver(t, h, true)
	require.Eventually(t, func() bool { return len(groupMembers(pid)) == 0 }, waitTimeout, 20*time.Millisecond)

	next := h.successor()
	st := next.expect("train", 1, wFailed)
	require.Equal(t, int32(3), st.GetExitCode())
	require.False(t, next.sup.Running("train"))
}

func TestAgentStopsWorkersWithoutRestartGrace(t *testing.T) {
	h := newSupervisor(t) // restart_grace 0
	h.sup.Assign(h.assignment("train", 1, "hang"))
	h.expect("train", 1, wRunning)
	pid := h.record("train", 1).PID
	handOver(t, h, true)
	require.Empty(t, groupMembers(pid), "without a restart grace the agent takes its workers with it")
	found, err := h.spawner.Adopt()
	require.NoError(t, err)
	require.Empty(t, found, "nothing is left for a next agent")
}

// Until the agent that started it attaches, a shim watches it through its
// stdin: slow to attach, it is waited for; gone (its end of stdin closed,
// as when it dies), the workers are orphans and fenced after the orphan
// timeout.
func TestShimWatchesItsSpawnerUntilAttached(t *testing.T) {
	dir := t.TempDir()
	const orphanTimeout = time.Second
	require.NoError(t, writeJSON(filepath.Join(dir, shimSpecFile), shimSpec{
		Path: "/bin/sleep", Args: []string{"60"}, Dir: dir, LogPath: filepath.Join(dir, "job.log"), OrphanTimeout: orphanTimeout,
	}))
	readyR, readyW, err := os.Pipe()
	require.NoError(t, err)
	defer readyR.Close()
	spawnerR, spawnerW := io.Pipe()
	clock := clockwork.NewFakeClock()
	done := make(chan error, 1)
	go func() {
		done <- Shim{Dir: dir, Ready: readyW, Spawner: spawnerR, Log: zaptest.NewLogger(t), Clock: clock}.Run(context.Background())
	}()
	line, err := bufio.NewReader(readyR).ReadString('\n')
	require.NoError(t, err)
	var pid int
	_, err = fmt.Sscanf(line, shimReady+" %d", &pid)
	require.NoError(t, err, "ready line %q", line)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	require.Error(t, clock.BlockUntilContext(ctx, 1), "no orphan timeout runs while the agent that started the shim lives")
	require.NotEmpty(t, groupMembers(pid))

	require.NoError(t, spawnerW.Close())
	ctx, cancel = context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	require.NoError(t, clock.BlockUntilContext(ctx, 1), "its end starts the orphan timeout")
	clock.Advance(orphanTimeout)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(waitTimeout):
		t.Fatal("the shim did not fence its orphaned launcher")
	}
	require.Empty(t, groupMembers(pid))
	var st shimStatus
	require.NoError(t, readJSON(filepath.Join(dir, shimExitFile), &st))
	require.Contains(t, st.Reason, "fenced")
}

// A shim whose launcher ends as an agent attaches may send its exit status
// and close before reading the attach request, which then fails to write:
// the status sent is still how the workers ended.
func TestAttachTakesAnExitSentBeforeTheRequest(t *testing.T) {
	for i := range 50 {
		dir := t.TempDir()
		var ln net.Listener
		require.NoError(t, viaDirFD(dir, shimSocket, func(path string) (err error) {
			ln, err = net.Listen("unix", path)
			return err
		}))
		served := make(chan error, 1)
		go func() {
			conn, err := ln.Accept()
			if err == nil {
				b, _ := json.Marshal(shimStatus{Pid: 42, Exited: true, Exit: Exit{Code: 3}})
				_, err = conn.Write(append(b, '\n'))
				conn.Close()
			}
			served <- err
		}()
		p, err := attachShim(dir, nil, nil, zaptest.NewLogger(t))
		require.NoError(t, err)
		require.NoError(t, <-served)
		require.Equal(t, 3, p.Wait().Code, "attempt %d", i)
		require.Equal(t, 42, p.Pid(), "attempt %d: the pid of the exit that answered attach", i)
		ln.Close()
	}
}

// A launcher that dies on its own (torchrun OOM-killed) leaves its workers,
// each in a session of its own as torchrun 2.x starts them, to its shim,
// their subreaper: they are gone by the time the exit is reported, not
// training on under init. While the launcher runs, the shim reaps what is
// reparented to it and exits.
func TestShimKillsWhatALauncherThatDiedLeft(t *testing.T) {
	needPython(t)
	h := newSupervisor(t)
	dir := t.TempDir()
	workerPid, helperPid, die := filepath.Join(dir, "worker"), filepath.Join(dir, "helper"), filepath.Join(dir, "die")
	script := fmt.Sprintf(`
import os, signal, subprocess, time
w = subprocess.Popen(["sleep", "300"], start_new_session=True)
subprocess.run(["sh", "-c", "sleep 0.2 & echo $! > %[2]s.tmp; mv %[2]s.tmp %[2]s"], check=True)
with open(%[1]q + ".tmp", "w") as f:
    f.write(str(w.pid))
os.rename(%[1]q + ".tmp", %[1]q)
while not os.path.exists(%[3]q):
    time.sleep(0.02)
os.kill(os.getpid(), signal.SIGKILL)
`, workerPid, helperPid, die)
	h.sup.Assign(h.assignment("train", 1, "py", "-c", script))
	h.expect("train", 1, wRunning)

	readPid := func(path string) int {
		var pid int
		require.Eventually(t, func() bool {
			b, err := os.ReadFile(path)
			if err != nil {
				return false
			}
			_, err = fmt.Sscan(string(b), &pid)
			return err == nil
		}, waitTimeout, 10*time.Millisecond, "%s never written", path)
		return pid
	}
	worker, helper := readPid(workerPid), readPid(helperPid)
	t.Cleanup(func() { _ = syscall.Kill(worker, syscall.SIGKILL) }) // should the test fail
	require.True(t, processLive(worker))
	// The helper's parent, sh, exited at once: it came to the shim, which
	// reaps it when it exits. Unreaped, it would stay a zombie.
	require.Eventually(t, func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", helper))
		return os.IsNotExist(err)
	}, waitTimeout, 10*time.Millisecond, "the orphaned helper %d was never reaped", helper)

	require.NoError(t, os.WriteFile(die, nil, 0o644))
	st := h.expect("train", 1, wFailed)
	require.Equal(t, "SIGKILL", st.GetSignal())
	require.False(t, processLive(worker), "worker %d outlived its launcher", worker)
}

// newSessions finds the sessions started below the launcher (torchrun
// 2.x's workers, each a session leader), each once, and nothing outside.
func TestNewSessions(t *testing.T) {
	procs := []procStat{
		{pid: 100, ppid: 90, pgrp: 100, sid: 100},  // the launcher, in a session of its own
		{pid: 101, ppid: 100, pgrp: 101, sid: 101}, // a worker in a session of its own
		{pid: 102, ppid: 100, pgrp: 102, sid: 102}, // another
		{pid: 103, ppid: 101, pgrp: 101, sid: 101}, // a worker's data loader, in its session
		{pid: 104, ppid: 103, pgrp: 104, sid: 104}, // a helper below it that started one
		{pid: 200, ppid: 1, pgrp: 200, sid: 200},   // not the job's
		{pid: 105, ppid: 100, pgrp: 100, sid: 100}, // a child in the launcher's session
	}
	done := map[int]bool{}
	require.Equal(t, []int{101, 102, 104}, newSessions(procs, 100, done))
	require.Empty(t, newSessions(procs, 100, done), "each once")
	procs = append(procs, procStat{pid: 106, ppid: 100, pgrp: 106, sid: 106})
	require.Equal(t, []int{106}, newSessions(procs, 100, done))
}

// yieldCPU lowers the launcher, in a session of its own, and its session's
// autogroup, never the caller's: the shim that calls it enforces the lease
// and must not wait behind what it fences.
func TestYieldCPULeavesTheCaller(t *testing.T) {
	autogroup := func(pid string) (string, bool) {
		b, err := os.ReadFile("/proc/" + pid + "/autogroup")
		if errors.Is(err, os.ErrNotExist) {
			return "", false
		}
		require.NoError(t, err)
		return strings.TrimSpace(string(b)), true
	}
	mine, autogroups := autogroup("self")
	p, _ := spawnShell(t, "sleep 60")
	pid := p.Pid()
	require.Equal(t, pid, procStatField(t, pid, 3), "the launcher leads a session of its own")
	yieldCPU(pid, workerNice, zaptest.NewLogger(t))
	require.Equal(t, workerNice, procStatField(t, pid, 16))
	if !autogroups {
		t.Skip("no autogroups in this kernel: the nice value is checked, not the autogroup's")
	}
	theirs, _ := autogroup(strconv.Itoa(pid))
	require.True(t, strings.HasSuffix(theirs, fmt.Sprintf(" nice %d", workerNice)), theirs)
	after, _ := autogroup("self")
	require.Equal(t, mine, after, "the caller's autogroup is unchanged")
}
