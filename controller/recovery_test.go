package controller_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const recovering = rdzvv1.JobState_JOB_STATE_RECOVERING

// recoverable is a job for scripted agents that restarts on failure.
func (c *cluster) recoverable(name string, nodes, restarts uint32) *rdzvv1.JobSpec {
	spec := c.spec(name, nodes, nodes, "hang")
	spec.CheckpointDir = "/ckpt/" + name
	spec.RestartMaxRestarts = restarts
	spec.RestartBackoffInitial = durationpb.New(50 * time.Millisecond)
	spec.RestartBackoffMax = durationpb.New(time.Second)
	return spec
}

func (f *fakeAgent) checkpoint(a *rdzvv1.Assignment, step uint64, path string) {
	f.t.Helper()
	f.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Checkpoint{Checkpoint: &rdzvv1.CheckpointReport{
		Job: a.GetSpec().GetName(), Generation: a.GetGeneration(), Step: step, Path: path, Source: "helper",
	}}})
}

func (f *fakeAgent) step(a *rdzvv1.Assignment, step uint64) {
	f.t.Helper()
	f.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Progress{Progress: &rdzvv1.Progress{
		Job: a.GetSpec().GetName(), Generation: a.GetGeneration(), Step: step, At: timestamppb.Now(),
	}}})
}

// saved reports step as saved in memory, its shards of ranks held here.
func (f *fakeAgent) saved(a *rdzvv1.Assignment, step uint64, ranks ...uint32) {
	f.t.Helper()
	f.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Progress{Progress: &rdzvv1.Progress{
		Job: a.GetSpec().GetName(), Generation: a.GetGeneration(), Step: step, At: timestamppb.Now(),
		Memory: []*rdzvv1.MemoryHeld{{Generation: a.GetGeneration(), Step: step, Ranks: ranks}},
	}}})
}

// A worker failure fences the generation on every node and restarts the
// job from the newest complete checkpoint, never from a stale generation's.
func TestRecoveryResumesFromLatestCheckpoint(t *testing.T) {
	c := newCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	c.startJob(c.recoverable("train", 2, 3))
	a1, b1 := a.run(), b.run()
	require.Empty(t, a1.GetResumeFrom(), "the first generation starts from scratch")
	c.waitJob("train", func(j *rdzvv1.Job) bool {
		return j.GetAssignments()[1].GetState() == rdzvv1.WorkerState_WORKER_STATE_RUNNING
	})

	a.step(a1, 5)
	a.checkpoint(a1, 10, "/ckpt/train/step-10")
	a.checkpoint(a1, 20, "/ckpt/train/step-20")
	a.checkpoint(a1, 15, "/ckpt/train/step-15") // older than the latest: ignored
	c.waitJob("train", func(j *rdzvv1.Job) bool { return j.GetLatestCheckpoint().GetStep() == 20 })
	require.Len(t, c.etcdKeys("/rdzv/v1/checkpoints/train/"), 2, "the catalog holds the two complete checkpoints")

	a.report(a1, rdzvv1.WorkerState_WORKER_STATE_FAILED, 1)
	j := c.waitJobState("train", recovering)
	require.Contains(t, j.GetReason(), "node node-a (rank 0): workers exited with code 1")
	require.Contains(t, j.GetReason(), "restart 1 of 3 from checkpoint step 20")
	// A failed generation's survivors get a short grace: their collectives
	// are broken, and the restart waits for them.
	require.Equal(t, time.Second, b.expectStop(b1).GetGrace().AsDuration())

	a2, b2 := a.run(), b.run()
	require.Equal(t, uint64(2), a2.GetGeneration())
	require.Equal(t, "/ckpt/train/step-20", a2.GetResumeFrom())
	require.Equal(t, "/ckpt/train/step-20", b2.GetResumeFrom())
	require.EqualValues(t, 20, a2.GetResumeStep(), "the resumed checkpoint's step: the scan reports nothing older")

	// The fenced generation may not move the catalog any more.
	a.checkpoint(a1, 30, "/ckpt/train/step-30")
	a.report(a2, rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED, 0)
	b.report(b2, rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED, 0)
	j = c.waitJobState("train", succeeded)
	require.Equal(t, uint64(20), j.GetLatestCheckpoint().GetStep())
	require.Equal(t, uint32(1), j.GetRestarts())
	require.Positive(t, j.GetRecoveryTime().AsDuration())
	require.Positive(t, j.GetTrainingTime().AsDuration())

	kinds := eventKinds(c.events("train"))
	require.Contains(t, kinds, "attempt_failed")
	require.Contains(t, kinds, "checkpoint_recorded")
	for _, e := range c.events("train") {
		if e.GetKind() == "attempt_failed" {
			require.NotNil(t, e.GetDetectionLatency(), "failures carry their detection latency")
			require.Less(t, e.GetDetectionLatency().AsDuration(), waitTimeout)
		}
	}
}

// A job whose attempts keep failing without any progress stops restarting
// long before its restart budget is spent.
func TestCrashLoopFailsFast(t *testing.T) {
	c := newCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	c.startJob(c.recoverable("loop", 1, 10))
	a1 := a.run()
	a.report(a1, rdzvv1.WorkerState_WORKER_STATE_FAILED, 1)
	a2 := a.run()
	require.Equal(t, uint64(2), a2.GetGeneration())
	a.report(a2, rdzvv1.WorkerState_WORKER_STATE_FAILED, 1)
	j := c.waitJobState("loop", failed)
	require.Contains(t, j.GetReason(), "crash loop: 2 attempts in a row failed without training progress")
	require.Equal(t, uint32(1), j.GetRestarts())
}

// Progress between failures resets the crash-loop count, and the restart
// budget still bounds the total.
func TestRestartBudget(t *testing.T) {
	c := newCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	c.startJob(c.recoverable("budget", 1, 2))
	for gen := uint64(1); gen <= 3; gen++ {
		asg := a.run()
		require.Equal(t, gen, asg.GetGeneration())
		a.step(asg, gen*100)
		c.waitJob("budget", func(j *rdzvv1.Job) bool { return j.GetStep() == gen*100 })
		a.report(asg, rdzvv1.WorkerState_WORKER_STATE_FAILED, 2)
	}
	j := c.waitJobState("budget", failed)
	require.Contains(t, j.GetReason(), "no restarts left (max_restarts 2)")
	require.Equal(t, uint32(2), j.GetRestarts())
}

// A job whose reported steps stop advancing is restarted as hung.
func TestHangDetected(t *testing.T) {
	c := newCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	spec := c.recoverable("stuck", 1, 1)
	spec.HealthProgressTimeout = durationpb.New(500 * time.Millisecond)
	c.startJob(spec)
	a1 := a.run()
	a.step(a1, 1)
	j := c.waitJobState("stuck", recovering)
	require.Contains(t, j.GetReason(), "hang: no training progress")
	require.Contains(t, j.GetReason(), "last step 1")
	a.expectStop(a1)
	require.Equal(t, uint64(2), a.run().GetGeneration())
}

// Hang detection stays off for a job that never reports a step.
func TestNoReportsNoHangDetection(t *testing.T) {
	c := newFakeClockCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	spec := c.recoverable("quiet", 1, 1)
	spec.HealthProgressTimeout = durationpb.New(200 * time.Millisecond)
	c.startJob(spec)
	a.run()
	c.advance(5*spec.GetHealthProgressTimeout().AsDuration(), "node-a") // several timeouts' worth of silence
	require.Equal(t, running, c.getJob("quiet").GetState())
}

// threeRunning is a job running generation 1 on three scripted agents.
type threeRunning struct {
	agents [3]*fakeAgent
	gen1   [3]*rdzvv1.Assignment
}

// threeNodes runs job, elastic over 2-3 nodes (edits change its spec
// first), on scripted agents node-a, node-b and node-z that heartbeat on
// their own.
func (c *cluster) threeNodes(job string, edits ...func(*rdzvv1.JobSpec)) (three threeRunning) {
	c.t.Helper()
	for i, name := range []string{"node-a", "node-b", "node-z"} {
		three.agents[i] = c.connectFake(name)
		three.agents[i].keepAlive()
	}
	spec := c.recoverable(job, 2, 3)
	spec.NodesMax = 3
	for _, edit := range edits {
		edit(spec)
	}
	c.startJob(spec)
	for i, f := range three.agents {
		three.gen1[i] = f.run()
	}
	return three
}

// A lost node is fenced out: the job re-rendezvouses on the nodes left
// (within min..max) and resumes there.
func TestRecoveryOnFewerNodes(t *testing.T) {
	c := newCluster(t)
	three := c.threeNodes("elastic")
	a, b, z, a1, b1 := three.agents[0], three.agents[1], three.agents[2], three.gen1[0], three.gen1[1]
	require.Equal(t, uint32(3), a1.GetNnodes())
	a.checkpoint(a1, 7, "/ckpt/elastic/step-7")
	c.waitJob("elastic", func(j *rdzvv1.Job) bool { return j.GetLatestCheckpoint().GetStep() == 7 })

	z.crash() // node-z vanishes without a word
	j := c.waitJobState("elastic", recovering)
	require.Contains(t, j.GetReason(), "node-z")
	a.expectStop(a1)
	b.expectStop(b1)
	a2, b2 := a.run(), b.run()
	require.Equal(t, uint32(2), a2.GetNnodes())
	require.Equal(t, uint32(2), b2.GetNnodes())
	require.Equal(t, "/ckpt/elastic/step-7", a2.GetResumeFrom())
	require.Equal(t, running, c.waitJob("elastic", func(j *rdzvv1.Job) bool { return j.GetGeneration() == 2 }).GetState())
}

// The next round's master port is probed on the failed round's rank 0 as
// soon as its workers have stopped, while the recovery waits for the rest;
// the commit uses that answer instead of probing again.
func TestRecoveryProbesTheMasterAhead(t *testing.T) {
	c := newCluster(t)
	three := c.threeNodes("ahead")
	a, b, z, a1, b1 := three.agents[0], three.agents[1], three.agents[2], three.gen1[0], three.gen1[1]
	require.Equal(t, uint32(0), a1.GetNodeRank())
	require.Equal(t, int32(1), a.probes.Load(), "generation 1's commit probed node-a")

	z.crash()
	c.waitJobState("ahead", recovering)
	a.expectStop(a1)
	require.Eventually(t, func() bool { return a.probes.Load() == 2 }, waitTimeout, 10*time.Millisecond,
		"node-a is probed once its workers stopped, before node-b's have")
	b.expectStop(b1)
	a2, _ := a.run(), b.run()
	require.Equal(t, uint32(0), a2.GetNodeRank())
	require.Equal(t, int32(2), a.probes.Load(), "the commit took the answer probed ahead")
	require.Equal(t, a1.GetMasterPort(), a2.GetMasterPort())
}

// Fewer healthy nodes than min: the job waits, saying why, then fails when
// the rendezvous timeout passes.
func TestRecoveryWaitsForMinThenTimesOut(t *testing.T) {
	c := newCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	spec := c.recoverable("short", 2, 3)
	spec.RendezvousTimeout = durationpb.New(2 * time.Second)
	c.startJob(spec)
	a1, _ := a.run(), b.run()
	b.crash()
	c.waitJobState("short", recovering)
	a.expectStop(a1)
	j := c.waitJob("short", func(j *rdzvv1.Job) bool { return j.GetState() != recovering })
	require.Equal(t, failed, j.GetState())
	require.Contains(t, j.GetReason(), "rendezvous timed out")
}

// The restart backoff and the time to stop the failed generation do not
// count against the rendezvous timeout: only waiting for nodes does.
func TestBackoffIsNotRendezvousWait(t *testing.T) {
	c := newCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	spec := c.recoverable("patient", 1, 2)
	spec.RestartBackoffInitial = durationpb.New(1500 * time.Millisecond)
	spec.RestartBackoffMax = durationpb.New(1500 * time.Millisecond)
	spec.RendezvousTimeout = durationpb.New(500 * time.Millisecond)
	c.startJob(spec)
	a.report(a.run(), rdzvv1.WorkerState_WORKER_STATE_FAILED, 1)
	a2 := a.run()
	require.Equal(t, uint64(2), a2.GetGeneration(), "restarted after the backoff, not timed out during it")
}

// Recovery lasts until the restarted generation trains again: its start-up
// counts as outage, not as training.
func TestRecoveryTimeRunsUntilTrainingResumes(t *testing.T) {
	c := newFakeClockCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	spec := c.recoverable("timed", 1, 2)
	c.startJob(spec)
	a1 := a.run()
	a.step(a1, 3)
	c.waitJob("timed", func(j *rdzvv1.Job) bool { return j.GetStep() == 3 })
	a.report(a1, rdzvv1.WorkerState_WORKER_STATE_FAILED, 1)
	// An attempt that trained restarts at once: no backoff to wait out.
	a2 := a.run()
	j := c.waitJob("timed", func(j *rdzvv1.Job) bool { return j.GetGeneration() == 2 && j.GetState() == running })
	require.NotNil(t, j.GetRecoveryStartedAt(), "running but not yet training: still recovering")
	c.advance(300*time.Millisecond, "node-a")
	a.step(a2, 4)
	j = c.waitJob("timed", func(j *rdzvv1.Job) bool { return j.GetRecoveryStartedAt() == nil })
	require.NotNil(t, j.GetTrainingSince())
	require.GreaterOrEqual(t, j.GetRecoveryTime().AsDuration(), 300*time.Millisecond, "start-up is part of the outage")
}

// A node that lacks the job's workdir fails the job at once with that
// reason: a restart would fail the same way, into a crash loop.
func TestConfigFailureIsNotRestarted(t *testing.T) {
	c := newCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	c.startJob(c.recoverable("nodir", 2, 5))
	a1, b1 := a.run(), b.run()
	require.NotNil(t, a1.GetJobCreatedAt(), "agents tell runs of a job name apart by it")
	require.True(t, proto.Equal(a1.GetJobCreatedAt(), b1.GetJobCreatedAt()))
	b.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_WorkerStatus{WorkerStatus: &rdzvv1.WorkerStatus{
		Job: "nodir", Generation: b1.GetGeneration(), State: rdzvv1.WorkerState_WORKER_STATE_FAILED, ExitCode: -1,
		Failure: "workdir_missing", Message: "workdir_missing: workdir /shared/nodir is not a directory on node node-b",
	}}})
	j := c.waitJobState("nodir", failed)
	require.Equal(t, "workdir_missing: node node-b (rank 1): workdir /shared/nodir is not a directory on node node-b; not restarted, as a restart would fail the same way: fix the job file or the node, then start the job again", j.GetReason())
	require.Zero(t, j.GetRestarts())
	a.expectStop(a1)
	require.NotContains(t, eventKinds(c.events("nodir")), "attempt_failed")
	require.Contains(t, eventKinds(c.events("nodir")), "job_failed")
}

// An attempt that trained restarts without a backoff: it is no crash loop,
// and any wait is outage. One that failed without progress still waits the
// backoff, so a crash loop does not spin.
func TestRestartBackoffOnlyWithoutProgress(t *testing.T) {
	tests := []struct {
		name     string
		progress bool
	}{
		{"after progress at once", true},
		{"without progress after the backoff", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newFakeClockCluster(t)
			a := c.connectFake("node-a")
			a.keepAlive()
			spec := c.recoverable("retry", 1, 3)
			// The clock stands still but when advanced: only an advance
			// ends the backoff.
			const backoff = 5 * time.Second
			spec.RestartBackoffInitial = durationpb.New(backoff)
			spec.RestartBackoffMax = durationpb.New(backoff)
			c.startJob(spec)
			a1 := a.run()
			if tt.progress {
				a.step(a1, 7)
				c.waitJob("retry", func(j *rdzvv1.Job) bool { return j.GetStep() == 7 })
			}
			a.report(a1, rdzvv1.WorkerState_WORKER_STATE_FAILED, 1)
			if tt.progress {
				// The clock stands still: only the lack of a backoff lets
				// the restart happen.
				require.Equal(t, uint64(2), a.run().GetGeneration())
				return
			}
			j := c.waitJobState("retry", recovering)
			failure := c.waitEvent("retry", "attempt_failed")
			require.Equal(t, failure.GetTime().AsTime().Add(backoff), j.GetRestartNotBefore().AsTime(), "the initial backoff")
			c.settle()
			c.advance(backoff-time.Millisecond, "node-a")
			require.Equal(t, uint64(1), c.getJob("retry").GetGeneration(), "not restarted during the backoff")
			poll(t, func() bool {
				c.advance(time.Millisecond, "node-a")
				return c.getJob("retry").GetGeneration() == 2
			}, func() string { return "not restarted after its backoff" })
		})
	}
}

// A restart on fewer nodes than before still gives more nodes their last
// call, but it runs from the failure, beside the fencing of the lost node:
// a second wait after the fencing would only lengthen the outage.
func TestRecoveryLastCallRunsFromTheFailure(t *testing.T) {
	c := newFakeClockCluster(t)
	// Longer than the lost node's fencing takes (its heartbeat timeout and
	// the fencing margin after its last heartbeat).
	const window = 3 * time.Second
	three := c.threeNodes("elastic", func(spec *rdzvv1.JobSpec) { spec.RendezvousLastCall = durationpb.New(window) })
	a, b, z, a1, b1 := three.agents[0], three.agents[1], three.agents[2], three.gen1[0], three.gen1[1]
	a.step(a1, 3)
	c.waitJob("elastic", func(j *rdzvv1.Job) bool { return j.GetStep() == 3 })

	z.crash()
	poll(t, func() bool {
		c.advance(100*time.Millisecond, "node-a", "node-b")
		return c.getJob("elastic").GetState() == recovering
	}, func() string { return "node-z never declared lost" })
	failedAt := c.waitEvent("elastic", "attempt_failed").GetTime().AsTime()
	a.expectStop(a1)
	b.expectStop(b1)
	waited := c.advanceToCommit("elastic", 2, "node-a", "node-b").Sub(failedAt)
	require.GreaterOrEqual(t, waited, window, "the last call is kept")
	require.Less(t, waited, window+500*time.Millisecond, "and not waited again after the fencing")
	require.Equal(t, uint32(2), a.run().GetNnodes())
}

// advanceToCommit moves the fake clock on, alive heartbeating, until job
// commits generation, and returns when it did.
func (c *cluster) advanceToCommit(job string, generation uint64, alive ...string) time.Time {
	c.t.Helper()
	poll(c.t, func() bool {
		c.advance(100*time.Millisecond, alive...)
		return c.getJob(job).GetGeneration() == generation
	}, func() string { return fmt.Sprintf("%s never committed generation %d", job, generation) })
	for _, e := range c.events(job) {
		if e.GetKind() == "rendezvous_committed" && e.GetGeneration() == generation {
			return e.GetTime().AsTime()
		}
	}
	require.FailNow(c.t, "no rendezvous_committed event", "%s generation %d", job, generation)
	return time.Time{}
}

// An operator's stop leaves the workers the agent's whole stop_grace to
// save their work; only a failed generation's get the short one.
func TestOperatorStopKeepsTheFullGrace(t *testing.T) {
	c := newCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	c.startJob(c.recoverable("kept", 1, 3))
	a1 := a.run()
	c.waitRunning("kept")
	require.Equal(t, rdzvv1.JobState_JOB_STATE_STOPPING, c.stopJob("kept").GetState())
	require.Nil(t, a.expectStop(a1).GetGrace(), "no grace given: the agent's stop_grace")
}
