package e2e

import (
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An agent stops being scheduled (SIGSTOP: what a cgroup freeze, a
// page-fault storm or a long scheduling stall look like) while its workers
// train on. It neither fences itself nor dies, so its shims never see their
// stdin close: only the lease it renews to each shim (docs/fencing.md)
// stops them. The controller declares the node lost and commits the next
// generation on the other two; by that commit no process of the old
// generation may be alive on the stalled node, nor its warm standby (their
// shims, which run nothing of the job's and exit once their group is gone,
// are only required gone once the node is back). Once
// resumed, the node rejoins idle, keeps nothing of generation 1 (at most
// a fresh idle node's standby), and the job ends with nothing of it left
// anywhere.
func TestFaultAgentStall(t *testing.T) {
	for _, kind := range launcherKinds {
		t.Run(kind.name, func(t *testing.T) { testFaultAgentStall(t, kind.edit) })
	}
}

// stallSample is how often the stalled node's processes are sampled.
const stallSample = 20 * time.Millisecond

func testFaultAgentStall(t *testing.T, edit func(spec map[string]any)) {
	c := newFaultCluster(t)
	job := faultJob(t, c, "fault-agent-stall", edit)
	before := c.waitCheckpoint(t, job.Name, checkpointEvery)
	timeout, err := time.ParseDuration(faultHeartbeatTimeout)
	require.NoError(t, err)

	// Everything of the job on h3: its shims, launcher, workers and, under
	// warm, its standby for the next generation.
	agent := c.agents[2].Pid()
	old := map[int]string{}
	for _, pid := range netnsPids(t, c.agentHost(2)) {
		if pid != agent {
			old[pid] = strings.Join(procCmdline(pid), " ")
		}
	}
	require.NotEmpty(t, old)
	if job.warm {
		require.True(t, func() bool {
			for _, cmd := range old {
				if strings.Contains(cmd, "rdzv_zygote.py") {
					return true
				}
			}
			return false
		}(), "no warm standby on h3 before the fault: %v", old)
	}

	fault := time.Now()
	require.NoError(t, syscall.Kill(agent, syscall.SIGSTOP))
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			require.NoError(t, syscall.Kill(agent, syscall.SIGCONT))
		}
	}
	t.Cleanup(func() {
		if !resumed {
			_ = syscall.Kill(agent, syscall.SIGCONT)
		}
	})
	t.Logf("e2e: SIGSTOPped the agent on h3 (pid %d), leaving %d processes of the job there", agent, len(old))

	// Stalled for twice the heartbeat timeout: lost, and the job moved on.
	lastAlive := map[int]time.Time{}
	for time.Since(fault) < 2*timeout {
		now := time.Now()
		for pid := range old {
			if state := procStatus(pid, "State"); state != "" && !strings.HasPrefix(state, "Z") {
				lastAlive[pid] = now
			}
		}
		time.Sleep(stallSample)
	}
	var committed time.Time
	for _, ev := range c.jobEvents(t, job.Name) {
		if ev.Kind == "rendezvous_committed" && ev.Generation == 2 {
			committed = ev.Time
		}
	}
	require.False(t, committed.IsZero(), "generation 2 not committed %s into the stall", 2*timeout)
	resume()
	t.Logf("e2e: resumed the agent on h3 %s after the stall began; generation 2 committed at +%.3fs",
		time.Since(fault).Round(time.Millisecond), committed.Sub(fault).Seconds())

	// Figure and check: how long after the commit the old generation's
	// processes on h3 lived on (negative: how long before it the last
	// one was gone).
	var late []string
	worst := -time.Since(fault)
	for pid, at := range lastAlive {
		if strings.Contains(old[pid], "rdzv-agent shim") {
			continue
		}
		d := at.Sub(committed)
		worst = max(worst, d)
		if d > 0 {
			late = append(late, fmt.Sprintf("pid %d alive +%.3fs after the commit: %s", pid, d.Seconds(), old[pid]))
		}
	}
	sort.Strings(late)
	t.Logf("e2e: figure: %d of the old generation's processes on h3 outlived the commit of generation 2; the last one seen alive %+.3fs from the commit (sampled every %s)",
		len(late), worst.Seconds(), stallSample)
	require.Empty(t, late, "processes of generation 1 on the stalled node alive after generation 2 was committed")

	// Back, the node rejoins idle: nothing of generation 1 there. An idle
	// node that matches a running warm job may be told to keep a fresh
	// standby of it (docs/jobs.md, standbys on idle nodes): that is a new
	// process outside any generation, never one of the old ones.
	c.waitNodeState(t, 2, "NODE_STATE_READY")
	idleStandby := c.lingeringStandby(job)
	for _, pid := range netnsPids(t, c.agentHost(2)) {
		if pid == agent {
			continue
		}
		cmd := strings.Join(procCmdline(pid), " ")
		_, wasOld := old[pid]
		require.False(t, wasOld, "a process of generation 1 on h3 after it came back: %s", cmd)
		require.True(t, idleStandby != nil && idleStandby(pid), "a process on h3 after it came back that is not an idle node's standby: %s", cmd)
	}

	run := requireRecovered(t, c, job, fault, before)
	require.Equal(t, agentNames(c)[:2], run.rounds[2].nodes, "generation 2 runs on the nodes not stalled")
	require.EqualValues(t, 2, run.status.Generation, "the node coming back does not disturb the job")
	c.waitStandbysGone(t, job)
	requireOnlyAgents(t, c, nil)
}
