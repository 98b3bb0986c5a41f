package e2e

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// The safety of in-memory checkpoints (docs/checkpoints.md): a generation
// resumes from memory only when every rank's shard of one step survives,
// and only from what the job's current lineage saved.

// memoryJob makes a fault job (faultJob) an in-memory checkpointing one on
// exactly two nodes: a save every 3 steps, each node's shards replicated
// to the other.
func memoryJob(spec map[string]any) { memoryJobEvery(3)(spec) }

// memoryJobEvery is memoryJob with a save every steps steps.
func memoryJobEvery(steps int) func(spec map[string]any) {
	return func(spec map[string]any) {
		spec["nodes"] = map[string]any{"min": 2, "max": 2}
		spec["command"] = append(spec["command"].([]any), "--memory-every", strconv.Itoa(steps))
		spec["checkpoint"].(map[string]any)["memory"] = map[string]any{"replicas": 1, "max_bytes": 64 << 20}
	}
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
// at step from source (train.py's: "memory", "persisted", or "" for its own
// durable checkpoint), and trained to the end.
func (c *cluster) requireResumedAt(t *testing.T, job string, gen, step uint64, source string) {
	t.Helper()
	resumed := c.taggedOfGeneration(t, job, gen, "RDZV_RESUMED")
	require.Len(t, resumed, 2*procsPerNode, "generation %d: RDZV_RESUMED lines: %v", gen, resumed)
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
	c.requireResumedAt(t, job.Name, 2, durable, "")
}

// A node of a three-node job whose state is replicated
// (checkpoint.memory.replicated: DDP's) dies and no idle node takes its
// place: the world shrinks from six ranks to four, and generation 2
// resumes from the newest in-memory step all the same. The step is whole
// in the world that saved it (the lost node's shards survive on its
// replica peer); every rank of generation 2 reads its shard of it back, at
// a step newer than the newest durable checkpoint.
func TestFaultKillNodeMemoryShrinks(t *testing.T) {
	c := newFaultCluster(t)
	job := faultJob(t, c, "fault-memory-shrink", func(spec map[string]any) {
		memoryJob(spec)
		spec["nodes"] = map[string]any{"min": 2, "max": agentHosts}
		spec["checkpoint"].(map[string]any)["memory"].(map[string]any)["replicated"] = true
	})
	before := c.waitCheckpoint(t, job.Name, checkpointEvery)
	gen1 := c.waitJob(t, job.Name, "a few steps past the checkpoint on every node", func(j jobJSON) bool {
		return len(j.Assignments) == agentHosts && j.Step >= before.LatestCheckpoint.Step+checkpointEvery/2
	})
	victim := c.hostOfRank(t, gen1, 1)
	c.killHost(t, victim)
	t.Logf("e2e: SIGKILLed everything on %s at step %d (latest durable checkpoint then: step %d)",
		c.agentHost(victim).Name, gen1.Step, before.LatestCheckpoint.Step)
	c.waitNodeState(t, victim, "NODE_STATE_LOST")

	j := c.waitJob(t, job.Name, "finished", func(j jobJSON) bool { return finished(j.State) })
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	require.EqualValues(t, 2, j.Generation, "one restart")
	events := c.jobEvents(t, job.Name)
	durable := newestDurable(t, events, 1)

	res := resumeOf(t, events, 2)
	require.Equal(t, "resume_memory", res.kind, "generation 2 must resume from memory though the world shrank")
	require.EqualValues(t, 1, res.savedBy)
	require.Greater(t, res.step, durable, "the in-memory step must be newer than generation 1's newest durable checkpoint")
	require.Contains(t, res.message, fmt.Sprintf("saved by %d ranks", agentHosts*procsPerNode), "the saving world")
	r2 := parseRounds(t, events)[2]
	require.True(t, r2.memory, "generation 2 committed to a durable checkpoint")
	require.Len(t, r2.nodes, agentHosts-1, "generation 2 shrank")
	require.NotContains(t, r2.nodes, c.agentHost(victim).Name, "generation 2 on the dead node")
	c.requireResumedAt(t, job.Name, 2, res.step, "memory")
}

// TestFaultKillReplicaPairPersisted is TestFaultKillReplicaPairMemoryCheckpoint
// for a job whose only durable checkpoints are in-memory steps persisted to
// checkpoint.dir (checkpoint.memory.persist_every; train.py saves none of
// its own): the pair's shards die with it, and generation 2 resumes from
// the newest persisted step, every rank reading its own shard of it back
// with rdzv.checkpoint.load().
func TestFaultKillReplicaPairPersisted(t *testing.T) {
	const persistEvery = 6
	c := newFaultClusterSized(t, 4)
	job := faultJob(t, c, "fault-memory-persisted", func(spec map[string]any) {
		memoryJob(spec)
		cmd := spec["command"].([]any)
		for i, arg := range cmd {
			if arg == "--checkpoint-every" {
				cmd[i+1] = "100000"
			}
		}
		spec["checkpoint"].(map[string]any)["memory"].(map[string]any)["persist_every"] = persistEvery
	})
	persisted := regexp.MustCompile(`/memory-step-(\d+)$`)
	before := c.waitCheckpoint(t, job.Name, persistEvery)
	require.Regexp(t, persisted, before.LatestCheckpoint.Path, "a durable checkpoint the job did not save")
	gen1 := c.waitJob(t, job.Name, "a few steps past a persisted step", func(j jobJSON) bool {
		return j.LatestCheckpoint != nil && j.Step >= j.LatestCheckpoint.Step+persistEvery/2
	})
	victims := []int{c.hostOfRank(t, gen1, 0), c.hostOfRank(t, gen1, 1)}
	c.killHosts(t, victims...)
	t.Logf("e2e: SIGKILLed everything on %s and %s at step %d (latest persisted step then: %d)",
		c.agentHost(victims[0]).Name, c.agentHost(victims[1]).Name, gen1.Step, gen1.LatestCheckpoint.Step)

	j := c.waitJob(t, job.Name, "finished", func(j jobJSON) bool { return finished(j.State) })
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	require.EqualValues(t, 2, j.Generation, "one restart")
	events := c.jobEvents(t, job.Name)
	durable := newestDurable(t, events, 1)
	require.GreaterOrEqual(t, durable, gen1.LatestCheckpoint.Step)
	require.Zero(t, durable%persistEvery, "step %d was not due to be persisted", durable)

	res := resumeOf(t, events, 2)
	require.Equal(t, "resume_durable", res.kind)
	require.Equal(t, durable, res.step, "generation 2 must resume from the newest persisted step")
	var path string
	for _, ev := range events {
		if m := checkpointMessage.FindStringSubmatch(ev.Message); ev.Kind == "checkpoint_recorded" && m != nil && atoi(t, m[1]) == int(durable) {
			path = m[2]
		}
	}
	require.Regexp(t, persisted, path, "checkpoint step %d", durable)
	c.requireResumedAt(t, job.Name, 2, durable, "persisted")
	// Pruning never took the step generation 2 resumed from.
	_, err := os.Stat(filepath.Join(path, "COMPLETE"))
	require.NoError(t, err, "persisted step %d", durable)
}

// A node of an in-memory checkpointing job stalls: its agent and its
// workers' shims are SIGSTOPped, its workers train on. Each of their saves
// now reports to an agent that does not answer: the report times out in
// the worker but stays queued in the agent's listening socket. The node is
// fenced when its heartbeats stop, and the job goes on as generation 2 on
// the other node and the idle one, resuming from the newest in-memory step
// complete at the fence. Then the node resumes: its agent takes the queued
// reports of generation 1 (steps newer than the one generation 2 resumed
// from, never complete before the fence) before it learns it was fenced,
// and replicates them to its peer, which trains on in generation 2 and
// reports what it holds. Generation 2 saves nothing in memory
// (--memory-generations 1), so when a worker of it is killed, generation 3
// resumes from generation 1's steps: it must resume from the very step
// generation 2 did, never from a step only the late reports completed,
// every rank at it, and the job succeeds with nothing of generation 1 left.
// Before the controller sealed each generation's holdings at the next
// commit (TestMemorySealedAtCommit) and let a registration from outside the
// running generation only narrow a node's holdings (TestRegisterMemory),
// generation 3 resumed from such a step.
func TestFaultStallMemoryCheckpoint(t *testing.T) {
	c := newFaultCluster(t)
	job := faultJob(t, c, "fault-memory-stall", func(spec map[string]any) {
		// Durable checkpoints further apart: one of generation 2 would be
		// newer than generation 1's in-memory steps, and generation 3 would
		// rightly resume from it.
		spec["command"] = []any{"train.py", "--steps", strconv.Itoa(faultSteps), "--step-time", faultStepTime,
			"--checkpoint-every", strconv.Itoa(stallDurableEvery), "--tick", "--memory-generations", "1"}
		// A save every step: whatever step the stall comes in, the
		// stalled node's workers save the next one, which its agent never
		// took before the fence, before they notice anything.
		memoryJobEvery(1)(spec)
	})
	before := c.waitCheckpoint(t, job.Name, stallDurableEvery)
	gen1 := c.waitJob(t, job.Name, "a few steps past the checkpoint", func(j jobJSON) bool {
		return j.Step >= before.LatestCheckpoint.Step+4
	})
	stalled := c.hostOfRank(t, gen1, 1)
	h := c.agentHost(stalled)
	pids := c.stallNode(t, stalled)
	resumed := false
	resume := func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT) // it may have exited since
		}
		resumed = true
	}
	t.Cleanup(func() {
		if !resumed {
			resume()
		}
	})
	t.Logf("e2e: SIGSTOPped the agent and %d shims on %s at step %d", len(pids)-1, h.Name, gen1.Step)
	c.waitNodeState(t, stalled, "NODE_STATE_LOST")
	gen2 := c.waitJob(t, job.Name, "ran generation 2", func(j jobJSON) bool { return j.Generation >= 2 && j.State == "JOB_STATE_RUNNING" })
	require.EqualValues(t, 2, gen2.Generation)
	for _, a := range gen2.Assignments {
		require.NotEqual(t, h.Name, a.Node, "generation 2 on the stalled node")
	}
	res2 := resumeOf(t, c.jobEvents(t, job.Name), 2)
	require.Equal(t, "resume_memory", res2.kind, "generation 2 resumes from memory: the other node holds the stalled one's replicas")
	require.EqualValues(t, 1, res2.savedBy)
	// What the stalled node's workers saved past that step, reported only
	// to their stalled agent: what the test is about.
	late := lateShards(t, h.Name, job.Name, res2.step)
	require.NotEmpty(t, late, "the stalled node's workers saved nothing after step %d: nothing to report late", res2.step)
	t.Logf("e2e: %d shards of generation 1 newer than step %d on %s, reported only to its stalled agent: %v", len(late), res2.step, h.Name, late)

	resume()
	c.waitNodeState(t, stalled, "NODE_STATE_READY")
	// Time for the late reports to reach the peer and its holdings the
	// controller, which takes them with generation 2's step reports.
	gen2 = c.waitJob(t, job.Name, "generation 2 trained on", func(j jobJSON) bool {
		require.EqualValues(t, 2, j.Generation, "the resumed node disturbed the job: %s", j.Reason)
		return j.Step >= res2.step+10
	})
	require.Less(t, gen2.Step, uint64(2*stallDurableEvery), "generation 2 recorded a durable checkpoint before its worker could be killed")
	killed := c.killWorker(t, c.hostOfRank(t, gen2, 1))
	t.Logf("e2e: resumed %s; SIGKILLed %s at step %d", h.Name, killed, gen2.Step)

	j := c.waitJob(t, job.Name, "finished", func(j jobJSON) bool { return finished(j.State) })
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	require.EqualValues(t, 3, j.Generation, "one restart for the stalled node, one for the killed worker")
	events := c.jobEvents(t, job.Name)
	res3 := resumeOf(t, events, 3)
	require.Equal(t, "resume_memory", res3.kind, "generation 1's step that generation 2 resumed from is still held")
	require.EqualValues(t, 1, res3.savedBy)
	require.Equal(t, res2.step, res3.step, "generation 3 must resume from the step generation 2 did: a newer step of generation 1 was completed only by reports after its fence")
	r3 := parseRounds(t, events)[3]
	require.True(t, r3.memory)
	require.Equal(t, res3.step, r3.resume)
	c.requireResumedAt(t, job.Name, 3, res3.step, "memory")
	logTimeline(t, events)
	c.waitStandbysGone(t, job)
	requireOnlyAgents(t, c, nil)
}

// stallDurableEvery is TestFaultStallMemoryCheckpoint's durable checkpoint
// interval.
const stallDurableEvery = 50

// stallNode SIGSTOPs the agent on agent host i and its workers' shims,
// which would otherwise stop the workers when the agent's lease lapses,
// and returns them, the agent first. The workers run on.
func (c *cluster) stallNode(t *testing.T, i int) []int {
	t.Helper()
	agent := c.agents[i].Pid()
	require.NoError(t, syscall.Kill(agent, syscall.SIGSTOP))
	pids := []int{agent}
	for _, pid := range netnsPids(t, c.agentHost(i)) {
		if pid != agent && strings.Contains(strings.Join(procCmdline(pid), " "), "rdzv-agent shim") {
			require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
			pids = append(pids, pid)
		}
	}
	require.Greater(t, len(pids), 1, "no shim on %s", c.agentHost(i).Name)
	return pids
}

// lateShards lists the shard files of generation 1 of job on node newer
// than step, in the agent's default in-memory checkpoint directory.
func lateShards(t *testing.T, node, job string, step uint64) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join("/dev/shm/rdzv-memckpt", node, job, "g1"))
	if err != nil {
		t.Logf("e2e: %v", err)
		return nil
	}
	var late []string
	for _, e := range entries {
		m := shardFile.FindStringSubmatch(e.Name())
		if m != nil && uint64(atoi(t, m[1])) > step {
			late = append(late, e.Name())
		}
	}
	return late
}

// shardFile is an in-memory checkpoint shard's file name.
var shardFile = regexp.MustCompile(`^step-(\d+)-rank-\d+\.pt$`)

// logTimeline logs a job's events, from its submission: a figure of where
// its time went.
func logTimeline(t *testing.T, events []eventJSON) {
	t.Helper()
	var b strings.Builder
	for _, ev := range events {
		fmt.Fprintf(&b, "\n  %+8.3fs gen %d %-20s %-3s %s", ev.Time.Sub(events[0].Time).Seconds(), ev.Generation, ev.Kind, ev.Node, ev.Message)
	}
	t.Logf("e2e: events:%s", b.String())
}

// A worker of a job that saves in memory every step is killed: generation
// 2 resumes from the newest step every rank had saved, to within the save
// in flight, not from what the nodes' last heartbeats said they held (up
// to a heartbeat interval's worth of steps older). The agents' exit
// reports carry their holdings (WorkerStatus.memory; TestExitMemory has
// the controller's rule).
func TestFaultKillWorkerMemoryCheckpoint(t *testing.T) {
	// Two hosts, both the job's: every host's log has both generations.
	// Heartbeats every 2 s (steps take 0.1 s): what they carry may be many
	// steps behind.
	c := newFaultClusterSized(t, 2, func(c *cluster) { c.heartbeatInterval, c.heartbeatTimeout = "2s", "6s" })
	// The default launcher (warm): a worker's exit is reported within
	// moments, well inside a heartbeat interval (torchrun's monitor takes
	// longer than one, and a heartbeat would carry the holdings first).
	job := faultJob(t, c, "fault-memory-worker", func(spec map[string]any) {
		memoryJobEvery(1)(spec)
		defaultLauncher(spec)
	})
	before := c.waitCheckpoint(t, job.Name, checkpointEvery)
	gen1 := c.waitJob(t, job.Name, "a few steps past the checkpoint", func(j jobJSON) bool {
		return j.Step >= before.LatestCheckpoint.Step+checkpointEvery/2
	})
	victim := c.hostOfRank(t, gen1, 1)
	killed := c.killWorker(t, victim)
	t.Logf("e2e: SIGKILLed %s", killed)

	j := c.waitJob(t, job.Name, "finished", func(j jobJSON) bool { return finished(j.State) })
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	res := resumeOf(t, c.jobEvents(t, job.Name), 2)
	require.Equal(t, "resume_memory", res.kind)
	require.EqualValues(t, 1, res.savedBy)

	// The newest step every rank of generation 1 finished. A rank saves a
	// step after its tick, and a save waits for the one before it to be
	// reported, so every rank had reported last-2 at least.
	newest := map[int]int{}
	for i := range c.hosts {
		part := byGeneration(t, c.nodeLog(t, i, job.Name))[1]
		for _, tk := range parseTicks(t, c.agentHost(i).Name, part) {
			newest[tk.rank] = max(newest[tk.rank], tk.step)
		}
	}
	require.Len(t, newest, 2*procsPerNode, "ticks of generation 1 by rank: %v", newest)
	last := slices.Min(slices.Collect(maps.Values(newest)))
	t.Logf("e2e: generation 1 finished step %d on every rank; generation 2 resumed from in-memory step %d (%d steps recomputed)",
		last, res.step, uint64(last)-min(res.step, uint64(last)))
	require.GreaterOrEqual(t, res.step+2, uint64(last), "generation 2 resumed from an older step than every rank had saved")
	c.requireResumedAt(t, job.Name, 2, res.step, "memory")
}
