package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
