package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var growingMessage = regexp.MustCompile(`^generation 2 stops to grow the job from 2 to 3 nodes \(nodes.max 3\); it resumes from checkpoint step (\d+)$`)

// A node cut off mid-run shrinks the job to two nodes; once its link is
// back the job, with the default nodes.grow, grows back to three right
// after its next checkpoint once h3 keeps a ready standby of the job:
// generation 3 runs on all three, h3's ranks from that standby, resumes
// from that checkpoint (nothing recomputed but the steps trained while the
// stop order travelled), and the grow is no failure. The job succeeds.
func TestFaultGrowBack(t *testing.T) {
	c := newFaultCluster(t)
	job := faultJob(t, c, "fault-grow-back", func(spec map[string]any) {
		delete(spec, "launcher") // the default launcher
		spec["nodes"] = map[string]any{"min": 2, "max": agentHosts}
	})
	c.waitCheckpoint(t, job.Name, checkpointEvery)

	require.NoError(t, c.net.CutLink(3)) // h3, agent host 2
	c.waitNodeState(t, 2, "NODE_STATE_LOST")
	c.waitJob(t, job.Name, "ran generation 2", func(j jobJSON) bool { return j.Generation == 2 && j.State == "JOB_STATE_RUNNING" })
	require.NoError(t, c.net.RestoreLink(3))
	c.waitNodeState(t, 2, "NODE_STATE_READY")
	back := time.Now()

	// When the standby that runs generation 3 on h3 started: it must be
	// the idle node's, ready before the grow, not a cold one started by it.
	var h3Standby time.Duration
	j := c.waitJob(t, job.Name, "finished", func(j jobJSON) bool {
		if started, ok := c.standbyStarts(t, "3")[c.agentHost(2).Name]; ok && (h3Standby == 0 || started < h3Standby) {
			h3Standby = started
		}
		return finished(j.State)
	})
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	require.EqualValues(t, 3, j.Generation, "one restart for the cut, one for the grow")
	require.EqualValues(t, 1, j.Restarts, "a grow is no failure")
	events := c.jobEvents(t, job.Name)
	requireAttemptsFailed(t, events, 1)

	var grewAt uint64
	var growing time.Time
	for _, ev := range events {
		if ev.Kind == "job_growing" {
			m := growingMessage.FindStringSubmatch(ev.Message)
			require.NotNil(t, m, "unexpected job_growing message: %q", ev.Message)
			n, err := strconv.ParseUint(m[1], 10, 64)
			require.NoError(t, err)
			grewAt, growing = n, ev.Time
		}
	}
	require.NotZero(t, grewAt, "no job_growing event: %v", kinds(events))
	require.NotZero(t, h3Standby, "generation 3 on h3 not seen running from a warm standby")
	growingSinceBoot := sinceBoot() - time.Since(growing)
	require.Less(t, h3Standby, growingSinceBoot, "h3's standby started %.3fs after job_growing: the grow did not wait for the idle node's standby",
		(h3Standby - growingSinceBoot).Seconds())
	rounds := parseRounds(t, events)
	require.Equal(t, agentNames(c)[:2], rounds[2].nodes)
	require.Equal(t, agentNames(c), rounds[3].nodes, "generation 3 runs on all three nodes")
	require.Equal(t, grewAt, rounds[3].resume, "generation 3 resumes from the checkpoint the grow followed")

	// Generation 3 starts on every node at the step after that checkpoint.
	first := map[string]int{}
	var firstAt, lastAt time.Time // generation 3's first step, generation 2's last
	var lastStep int
	for i := range agentHosts {
		node := c.agentHost(i).Name
		for _, tk := range parseTicks(t, node, c.nodeLog(t, i, job.Name)) {
			if _, seen := first[node]; tk.generation == 3 && !seen {
				first[node] = tk.step
				if firstAt.IsZero() || tk.at.Before(firstAt) {
					firstAt = tk.at
				}
			}
			if tk.generation == 2 && tk.at.After(lastAt) {
				lastAt, lastStep = tk.at, tk.step
			}
		}
		require.Equal(t, int(grewAt)+1, first[node], "%s's first step of generation 3", node)
	}
	var committed time.Time
	for _, ev := range events {
		if ev.Kind == "rendezvous_committed" && ev.Generation == 3 {
			committed = ev.Time
		}
	}
	t.Logf("e2e: figures: h3 READY to job_growing %.3fs; grew at checkpoint step %d, generation 2 reached step %d; "+
		"job_growing to generation 3's commit %.3fs, to its first step %.3fs; generation 2's last step to generation 3's first %.3fs",
		growing.Sub(back).Seconds(), grewAt, lastStep, committed.Sub(growing).Seconds(), firstAt.Sub(growing).Seconds(), firstAt.Sub(lastAt).Seconds())
	c.waitStandbysGone(t, job)
	requireOnlyAgents(t, c, nil)
}

// TestFaultGrowBackFromMemory is TestFaultGrowBack for a job whose state is
// replicated in memory (checkpoint.memory.replicated) and that saves no
// durable checkpoint of its own: the cut shrinks it from six ranks to four
// and generation 2 resumes from the newest in-memory step; once h3 is back
// the job grows at an in-memory step, not at a durable checkpoint, and
// generation 3 resumes from memory again, its six ranks reading the shards
// that generation 2's four saved (rank r that of rank r mod 4).
func TestFaultGrowBackFromMemory(t *testing.T) {
	c := newFaultCluster(t)
	job := faultJob(t, c, "fault-grow-memory", func(spec map[string]any) {
		memoryJob(spec)
		delete(spec, "launcher") // the default launcher
		spec["nodes"] = map[string]any{"min": 2, "max": agentHosts}
		spec["checkpoint"].(map[string]any)["memory"].(map[string]any)["replicated"] = true
		cmd := spec["command"].([]any)
		for i, arg := range cmd {
			if arg == "--checkpoint-every" {
				cmd[i+1] = "100000"
			}
		}
	})
	c.waitJob(t, job.Name, "training on every node", func(j jobJSON) bool { return len(j.Assignments) == agentHosts && j.Step >= 6 })

	require.NoError(t, c.net.CutLink(3)) // h3, agent host 2
	c.waitNodeState(t, 2, "NODE_STATE_LOST")
	c.waitJob(t, job.Name, "ran generation 2", func(j jobJSON) bool { return j.Generation == 2 && j.State == "JOB_STATE_RUNNING" })
	require.NoError(t, c.net.RestoreLink(3))
	c.waitNodeState(t, 2, "NODE_STATE_READY")

	j := c.waitJob(t, job.Name, "finished", func(j jobJSON) bool { return finished(j.State) })
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	require.EqualValues(t, 3, j.Generation, "one restart for the cut, one for the grow")
	require.EqualValues(t, 1, j.Restarts, "a grow is no failure")
	events := c.jobEvents(t, job.Name)
	require.Zero(t, newestDurable(t, events, 1)+newestDurable(t, events, 2), "a durable checkpoint: the grow could have followed it")

	shrunk := resumeOf(t, events, 2)
	require.Equal(t, "resume_memory", shrunk.kind, "generation 2 resumes from memory though the world shrank")
	require.EqualValues(t, 1, shrunk.savedBy)
	require.Contains(t, shrunk.message, fmt.Sprintf("saved by %d ranks", agentHosts*procsPerNode))
	var growing string
	for _, ev := range events {
		if ev.Kind == "job_growing" {
			growing = ev.Message
		}
	}
	require.Equal(t, "generation 2 stops to grow the job from 2 to 3 nodes (nodes.max 3); it resumes from the newest in-memory step", growing)
	grown := resumeOf(t, events, 3)
	require.Equal(t, "resume_memory", grown.kind, "generation 3 resumes from memory though the world grew")
	require.EqualValues(t, 2, grown.savedBy, "from a step generation 2 saved")
	require.Contains(t, grown.message, fmt.Sprintf("saved by %d ranks", (agentHosts-1)*procsPerNode))
	require.Greater(t, grown.step, shrunk.step)
	rounds := parseRounds(t, events)
	require.Len(t, rounds[2].nodes, agentHosts-1)
	require.Equal(t, agentNames(c), rounds[3].nodes, "generation 3 runs on all three nodes")

	resumed := c.taggedOfGeneration(t, job.Name, 3, "RDZV_RESUMED")
	require.Len(t, resumed, agentHosts*procsPerNode, "generation 3: RDZV_RESUMED lines: %v", resumed)
	for rank, f := range resumed {
		require.Equal(t, strconv.FormatUint(grown.step, 10), f["step"], "generation 3 rank %s resumed at another step: %v", rank, f)
		require.Equal(t, "memory", f["source"], "generation 3 rank %s resumed from another source: %v", rank, f)
	}
}
