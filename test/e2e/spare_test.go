package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A warm job's spare keeps a standby of the job: when a node dies, the
// spare joins generation 2 through the standby it started before the
// fault (its workers are that process's children), and the job resumes
// from its newest checkpoint.
func TestFaultKillNodeWarmSpare(t *testing.T) {
	c := newFaultCluster(t)
	job := faultJob(t, c, "spare-standby", func(spec map[string]any) {
		warmLauncher(spec)
		spec["nodes"] = map[string]any{"min": 2, "max": 2, "spares": 1}
	})
	before := c.waitCheckpoint(t, job.Name, 2*checkpointEvery)
	// Rounds take nodes in name order: h3 is the spare.
	standby := c.waitStandby(t, 2)
	t.Logf("e2e: the spare %s keeps standby pid %d", c.agentHost(2).Name, standby)

	fault := time.Now()
	c.killHost(t, 1)
	t.Logf("e2e: SIGKILLed everything on h2 (latest checkpoint then: step %d)", before.LatestCheckpoint.Step)
	c.waitNodeState(t, 1, "NODE_STATE_LOST")

	// Generation 2's workers on the spare are forked by that standby.
	deadline := time.Now().Add(recoveryBound)
	for !slices.ContainsFunc(netnsPids(t, c.agentHost(2)), func(pid int) bool {
		return ppidOf(pid) == standby && c.generationOf(pid) == "2"
	}) {
		require.True(t, time.Now().Before(deadline), "no worker of generation 2 forked by the spare's standby %d", standby)
		time.Sleep(20 * time.Millisecond)
	}

	run := requireRecovered(t, c, job, fault, before)
	require.Equal(t, []string{c.agentHost(0).Name, c.agentHost(2).Name}, run.rounds[2].nodes, "generation 2 runs on h1 and the spare")
	require.Contains(t, c.nodeLog(t, 2, job.Name), "(2 workers from a warm standby)")
}

// waitStandby waits for the one warm standby on agent host i, which runs
// no job, and returns its pid.
func (c *cluster) waitStandby(t *testing.T, i int) int {
	t.Helper()
	deadline := time.Now().Add(recoveryBound)
	for {
		var found []int
		for _, pid := range netnsPids(t, c.agentHost(i)) {
			argv := procCmdline(pid)
			if len(argv) > 2 && strings.HasSuffix(argv[2], "rdzv_zygote.py") {
				found = append(found, pid)
			}
		}
		if len(found) == 1 {
			require.Empty(t, c.generationOf(found[0]), "the standby has no assignment yet")
			return found[0]
		}
		require.LessOrEqual(t, len(found), 1, "standbys on %s: %v", c.agentHost(i).Name, found)
		require.True(t, time.Now().Before(deadline), "no warm standby on %s", c.agentHost(i).Name)
		time.Sleep(20 * time.Millisecond)
	}
}
