package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The safety of in-memory checkpoints (docs/checkpoints.md): a generation
// resumes from memory only when every rank's shard of one step survives,
// and only from what the job's current lineage saved.

// memoryJob makes a fault job (faultJob) an in-memory checkpointing one on
// exactly two nodes: a save every 3 steps, each node's shards replicated
// to the other.
func memoryJob(spec map[string]any) {
	spec["nodes"] = map[string]any{"min": 2, "max": 2}
	spec["command"] = append(spec["command"].([]any), "--memory-every", "3")
	spec["checkpoint"].(map[string]any)["memory"] = map[string]any{"replicas": 1, "max_bytes": 64 << 20}
}

// resumeDurableMessage is the resume_durable event's message when there is
// a durable checkpoint.
var resumeDurableMessage = regexp.MustCompile(`resumes from durable checkpoint step (\d+): (.+)$`)

// resumeEvent is the resume_memory or resume_durable event of generation
// gen: its kind, the step and, from memory, the generation that saved it.
type resumeEvent struct {
	kind          string
	step, savedBy uint64
	message       string
}

func resumeOf(t *testing.T, events []eventJSON, gen uint64) resumeEvent {
	t.Helper()
	var found []resumeEvent
	for _, ev := range events {
		if ev.Generation != gen {
			continue
		}
		switch ev.Kind {
		case "resume_memory":
			m := resumeMemoryMessage.FindStringSubmatch(ev.Message)
			require.NotNil(t, m, "unexpected resume_memory message: %q", ev.Message)
			found = append(found, resumeEvent{kind: ev.Kind, step: uint64(atoi(t, m[1])), savedBy: uint64(atoi(t, m[2])), message: ev.Message})
		case "resume_durable":
			m := resumeDurableMessage.FindStringSubmatch(ev.Message)
			require.NotNil(t, m, "unexpected resume_durable message: %q", ev.Message)
			found = append(found, resumeEvent{kind: ev.Kind, step: uint64(atoi(t, m[1])), message: ev.Message})
		}
	}
	require.Len(t, found, 1, "generation %d: resume events %v; events: %v", gen, found, eventKinds(events))
	t.Logf("e2e: generation %d: %s: %s", gen, found[0].kind, found[0].message)
	return found[0]
}

// hostIndex is the agent host index of the node named name.
func (c *cluster) hostIndex(t *testing.T, name string) int {
	t.Helper()
	for i := range c.hosts {
		if c.agentHost(i).Name == name {
			return i
		}
	}
	t.Fatalf("no agent host named %s", name)
	return -1
}

// hostOfRank is the agent host of the job's node rank rank in j.
func (c *cluster) hostOfRank(t *testing.T, j jobJSON, rank int) int {
	t.Helper()
	for _, a := range j.Assignments {
		if a.NodeRank == rank {
			return c.hostIndex(t, a.Node)
		}
	}
	t.Fatalf("generation %d has no node rank %d: %+v", j.Generation, rank, j.Assignments)
	return -1
}

// taggedOfGeneration is every tag line of generation gen on every agent
// host, by rank; a rank's two lines fail the test.
func (c *cluster) taggedOfGeneration(t *testing.T, job string, gen uint64, tag string) map[string]map[string]string {
	t.Helper()
	byRank := map[string]map[string]string{}
	for i := range c.hosts {
		part := byGeneration(t, c.nodeLog(t, i, job))[gen]
		for _, f := range taggedLines(part, tag) {
			require.NotContains(t, byRank, f["rank"], "generation %d: two %s lines of rank %s", gen, tag, f["rank"])
			byRank[f["rank"]] = f
		}
	}
	return byRank
}

// requireResumedAt checks that every rank of generation gen said it resumed
// at step, from memory exactly when memory is set, and trained to the end.
func (c *cluster) requireResumedAt(t *testing.T, job string, gen, step uint64, memory bool) {
	t.Helper()
	resumed := c.taggedOfGeneration(t, job, gen, "RDZV_RESUMED")
	require.Len(t, resumed, 2*procsPerNode, "generation %d: RDZV_RESUMED lines: %v", gen, resumed)
	source := ""
	if memory {
		source = "memory"
	}
	for rank, f := range resumed {
		require.Equal(t, strconv.FormatUint(step, 10), f["step"], "generation %d rank %s resumed at another step: %v", gen, rank, f)
		require.Equal(t, source, f["source"], "generation %d rank %s resumed from another source: %v", gen, rank, f)
	}
	done := c.taggedOfGeneration(t, job, gen, "RDZV_DONE")
	require.Len(t, done, 2*procsPerNode, "generation %d: RDZV_DONE lines: %v", gen, done)
}

// newestDurable is the newest durable checkpoint generation gen recorded.
func newestDurable(t *testing.T, events []eventJSON, gen uint64) uint64 {
	t.Helper()
	var newest uint64
	for _, ev := range events {
		if ev.Kind == "checkpoint_recorded" && ev.Generation == gen {
			m := checkpointMessage.FindStringSubmatch(ev.Message)
			require.NotNil(t, m, "unexpected checkpoint_recorded message: %q", ev.Message)
			newest = max(newest, uint64(atoi(t, m[1])))
		}
	}
	return newest
}

// Both nodes of a two-node job with in-memory checkpoints die together:
// each held the other's replica, so no rank's shard survives anywhere. Two
// idle hosts let the world stay the same, so the world does not rule memory
// out; the lost shards must. The controller falls back to the newest durable
// checkpoint (resume_durable, saying no in-memory step has every rank's
// shard), every rank of generation 2 resumes at that step and not from
// memory, and the job succeeds.
func TestFaultKillReplicaPairMemoryCheckpoint(t *testing.T) {
	c := newFaultClusterSized(t, 4)
	job := faultJob(t, c, "fault-memory-pair", memoryJob)
	before := c.waitCheckpoint(t, job.Name, checkpointEvery)
	// Some steps past the durable checkpoint: in-memory steps newer than
	// it exist, and only their loss can make the job fall back.
	gen1 := c.waitJob(t, job.Name, "a few steps past the checkpoint", func(j jobJSON) bool {
		return j.Step >= before.LatestCheckpoint.Step+checkpointEvery/2
	})
	victims := []int{c.hostOfRank(t, gen1, 0), c.hostOfRank(t, gen1, 1)}
	c.killHosts(t, victims...)
	t.Logf("e2e: SIGKILLed everything on %s and %s at step %d (latest durable checkpoint then: step %d)",
		c.agentHost(victims[0]).Name, c.agentHost(victims[1]).Name, gen1.Step, before.LatestCheckpoint.Step)
	for _, v := range victims {
		c.waitNodeState(t, v, "NODE_STATE_LOST")
	}

	j := c.waitJob(t, job.Name, "finished", func(j jobJSON) bool { return finished(j.State) })
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	require.EqualValues(t, 2, j.Generation, "one restart")
	events := c.jobEvents(t, job.Name)
	durable := newestDurable(t, events, 1)
	require.GreaterOrEqual(t, durable, before.LatestCheckpoint.Step)

	res := resumeOf(t, events, 2)
	require.Equal(t, "resume_durable", res.kind)
	require.Equal(t, durable, res.step, "generation 2 must resume from the newest durable checkpoint")
	require.Contains(t, res.message, "no in-memory step has every rank's shard", "the fallback's reason")
	r2 := parseRounds(t, events)[2]
	require.False(t, r2.memory, "generation 2 committed to an in-memory step")
	require.Equal(t, durable, r2.resume)
	for _, v := range victims {
		require.NotContains(t, r2.nodes, c.agentHost(v).Name, "generation 2 on a dead node")
	}
	c.requireResumedAt(t, job.Name, 2, durable, false)
}

// A node of an in-memory checkpointing job freezes whole (SIGSTOP of its
// agent, its workers' shims and its workers: a frozen machine, with no
// process left to notice). It is fenced when its heartbeats stop, and the
// job goes on as generation 2 on the other node and the idle one. Then the
// node thaws: its generation-1 processes run again until they see they are
// fenced, and in that time may finish a save, report it and replicate it
// to their peer, which trains on in generation 2 and reports what it
// holds. A worker of generation 2 is killed once generation 2 has saved in
// memory: generation 3 must resume from a step of the current lineage,
// which generation 2 saved (its resume_memory names generation 2), or from
// the durable checkpoint, never from a step of generation 1, and every rank
// at that step. Nothing of generation 1 outlives the thaw, and the job
// succeeds. Whether the thawed node does write late depends on where it
// froze; TestMemorySealedAtCommit (controller) covers the late write itself.
func TestFaultFrozenNodeMemoryCheckpoint(t *testing.T) {
	c := newFaultCluster(t)
	job := faultJob(t, c, "fault-memory-frozen", memoryJob)
	before := c.waitCheckpoint(t, job.Name, checkpointEvery)
	gen1 := c.waitJob(t, job.Name, "a few steps past the checkpoint", func(j jobJSON) bool {
		return j.Step >= before.LatestCheckpoint.Step+checkpointEvery/2
	})
	frozen := c.hostOfRank(t, gen1, 1)
	h := c.agentHost(frozen)
	pids := c.freezeHost(t, frozen)
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			thaw(pids)
		}
	})
	t.Logf("e2e: froze %d processes on %s at step %d (latest durable checkpoint then: step %d)", len(pids), h.Name, gen1.Step, before.LatestCheckpoint.Step)
	c.waitNodeState(t, frozen, "NODE_STATE_LOST")
	gen2 := c.waitJob(t, job.Name, "ran generation 2", func(j jobJSON) bool { return j.Generation >= 2 && j.State == "JOB_STATE_RUNNING" })
	require.EqualValues(t, 2, gen2.Generation)
	for _, a := range gen2.Assignments {
		require.NotEqual(t, h.Name, a.Node, "generation 2 on the frozen node")
	}

	thaw(pids)
	thawed = true
	c.waitNodeState(t, frozen, "NODE_STATE_READY")
	t.Logf("e2e: thawed %s; it is back, idle", h.Name)
	r2 := parseRounds(t, c.jobEvents(t, job.Name))[2]
	// Two saves of generation 2 past where it resumed (one every 3 steps).
	gen2 = c.waitJob(t, job.Name, "generation 2 saved in memory", func(j jobJSON) bool {
		require.EqualValues(t, 2, j.Generation, "the thawed node disturbed the job: %s", j.Reason)
		return j.Step >= r2.resume+7
	})
	killed := c.killWorker(t, c.hostOfRank(t, gen2, 1))
	t.Logf("e2e: SIGKILLed %s at step %d", killed, gen2.Step)

	j := c.waitJob(t, job.Name, "finished", func(j jobJSON) bool { return finished(j.State) })
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	require.EqualValues(t, 3, j.Generation, "one restart for the frozen node, one for the killed worker")
	events := c.jobEvents(t, job.Name)
	rounds := parseRounds(t, events)

	res2 := resumeOf(t, events, 2)
	require.Equal(t, r2.resume, res2.step)
	res3 := resumeOf(t, events, 3)
	r3 := rounds[3]
	require.Equal(t, res3.step, r3.resume)
	switch res3.kind {
	case "resume_memory":
		require.EqualValues(t, 2, res3.savedBy, "generation 3 must resume from what generation 2 saved, not from generation 1")
		require.Greater(t, res3.step, r2.resume, "generation 2's step is one it trained")
		require.True(t, r3.memory)
	case "resume_durable":
		require.False(t, r3.memory)
	}
	c.requireResumedAt(t, job.Name, 3, res3.step, res3.kind == "resume_memory")
	c.waitStandbysGone(t, job)
	requireOnlyAgents(t, c, nil)
}

// freezeHost SIGSTOPs every process on agent host i, its agent first, until
// every one there is stopped, and returns them.
func (c *cluster) freezeHost(t *testing.T, i int) []int {
	t.Helper()
	h := c.agentHost(i)
	agent := c.agents[i].Pid()
	require.NoError(t, syscall.Kill(agent, syscall.SIGSTOP))
	stopped := []int{agent}
	deadline := time.Now().Add(stopTimeout)
	for {
		var running []string
		for _, pid := range netnsPids(t, h) {
			state := procStatus(pid, "State")
			if state == "" || strings.HasPrefix(state, "T") || strings.HasPrefix(state, "Z") {
				continue
			}
			running = append(running, fmt.Sprintf("%d (%s)", pid, state))
			if !slices.Contains(stopped, pid) {
				stopped = append(stopped, pid)
			}
			_ = syscall.Kill(pid, syscall.SIGSTOP) // it may have exited since
		}
		if len(running) == 0 {
			return stopped
		}
		require.True(t, time.Now().Before(deadline), "processes on %s still running %s after SIGSTOP: %v", h.Name, stopTimeout, running)
		time.Sleep(20 * time.Millisecond)
	}
}

// thaw SIGCONTs what freezeHost stopped, all at once, the agent first.
func thaw(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGCONT) // it may have exited since
	}
}
