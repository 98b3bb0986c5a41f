package controller_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/controller"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// lastIncident is the job's newest incident.
func (c *cluster) lastIncident(job string) *rdzvv1.Incident {
	c.t.Helper()
	incs := c.getJob(job).GetIncidents()
	require.NotEmpty(c.t, incs, "job %s has no incident", job)
	return incs[len(incs)-1]
}

// The timeline of a failure fills in phase by phase, each at the moment
// the controller sees it reached, and the closing event carries it.
func TestIncidentTimeline(t *testing.T) {
	c := newFakeClockCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	c.startJob(c.recoverable("train", 2, 3))
	a1, b1 := a.run(), b.run()
	c.waitJob("train", func(j *rdzvv1.Job) bool { return allWorkers(j, rdzvv1.WorkerState_WORKER_STATE_RUNNING) })
	a.step(a1, 5)
	c.waitJob("train", func(j *rdzvv1.Job) bool { return j.GetStep() == 5 })
	require.Empty(t, c.getJob("train").GetIncidents(), "no incident before a failure")

	a.report(a1, rdzvv1.WorkerState_WORKER_STATE_FAILED, 1)
	c.waitJobState("train", recovering)
	inc := c.lastIncident("train")
	require.Equal(t, uint64(1), inc.GetGeneration())
	require.Contains(t, inc.GetReason(), "node node-a (rank 0): workers exited with code 1")
	require.NotNil(t, inc.GetDetectedAt())
	require.False(t, inc.GetFaultAt().AsTime().After(inc.GetDetectedAt().AsTime()), "the fault comes before its detection")
	require.Nil(t, inc.GetFencedAt(), "node-b's workers may still run")
	require.Nil(t, inc.GetCommittedAt())

	c.advance(heartbeatTimeout, "node-a", "node-b")
	b.expectStop(b1)
	// The attempt trained, so it restarts without a backoff: once fenced,
	// the next round commits.
	ma, mb := a.next().GetAssignment(), b.next().GetAssignment()
	require.Equal(t, uint64(2), ma.GetGeneration())
	inc = c.lastIncident("train")
	require.NotNil(t, inc.GetFencedAt())
	require.True(t, inc.GetFencedAt().AsTime().After(inc.GetDetectedAt().AsTime()), "fenced at node-b's stop report, after the clock moved")
	require.Equal(t, uint64(2), inc.GetNextGeneration())
	require.False(t, inc.GetCommittedAt().AsTime().Before(inc.GetFencedAt().AsTime()), "committed once fenced")
	require.Nil(t, inc.GetStartedAt())

	c.advance(heartbeatTimeout, "node-a", "node-b")
	a.reportRunning(ma)
	b.reportRunning(mb)
	c.waitJob("train", func(j *rdzvv1.Job) bool { return lastOf(j).GetStartedAt() != nil })
	inc = c.lastIncident("train")
	require.True(t, inc.GetStartedAt().AsTime().After(inc.GetCommittedAt().AsTime()))
	require.Nil(t, inc.GetFirstStepAt(), "no step yet")

	c.advance(heartbeatTimeout, "node-a", "node-b")
	a.step(ma, 1)
	ev := c.waitEvent("train", controller.EventRecovered)
	inc = c.lastIncident("train")
	require.True(t, inc.GetFirstStepAt().AsTime().After(inc.GetStartedAt().AsTime()))
	require.Equal(t, inc.GetFirstStepAt().AsTime(), ev.GetIncident().GetFirstStepAt().AsTime(), "the event carries the timeline")
	require.Contains(t, ev.GetMessage(), "recovered from the failure of generation 1")

	// The timeline is in the job record: a controller restart keeps it.
	c.stopController()
	c.startController()
	require.Equal(t, inc.GetFirstStepAt().AsTime(), c.lastIncident("train").GetFirstStepAt().AsTime())
}

// A job that fails for good records its last failure too, detected and
// never recovered.
func TestIncidentOfAFinalFailure(t *testing.T) {
	c := newCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	c.startJob(c.recoverable("once", 1, 0))
	a1 := a.run()
	a.report(a1, rdzvv1.WorkerState_WORKER_STATE_FAILED, 3)
	j := c.waitJobState("once", rdzvv1.JobState_JOB_STATE_FAILED)
	require.Len(t, j.GetIncidents(), 1)
	require.NotNil(t, j.GetIncidents()[0].GetDetectedAt())
	require.Nil(t, j.GetIncidents()[0].GetCommittedAt())
}

func lastOf(j *rdzvv1.Job) *rdzvv1.Incident {
	if n := len(j.GetIncidents()); n > 0 {
		return j.GetIncidents()[n-1]
	}
	return nil
}

func allWorkers(j *rdzvv1.Job, state rdzvv1.WorkerState) bool {
	for _, a := range j.GetAssignments() {
		if a.GetState() != state {
			return false
		}
	}
	return len(j.GetAssignments()) > 0
}

// reportRunning reports an assignment's workers running.
func (f *fakeAgent) reportRunning(a *rdzvv1.Assignment) {
	f.t.Helper()
	f.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_WorkerStatus{WorkerStatus: &rdzvv1.WorkerStatus{
		Job: a.GetSpec().GetName(), Generation: a.GetGeneration(), State: rdzvv1.WorkerState_WORKER_STATE_RUNNING,
	}}})
}

// A lost node's incident starts at its last heartbeat, and is fenced only
// once the node's agent, if merely cut off, has surely killed its workers.
func TestIncidentOfALostNode(t *testing.T) {
	c := newFakeClockCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	c.startJob(c.recoverable("train", 2, 3))
	a1 := a.run()
	b.run()
	// The node that takes node-b's place, idle until then.
	spare := c.connectFake("node-c")
	spare.keepAlive()

	b.crash()
	c.advance(2*heartbeatTimeout, "node-a", "node-c")
	c.waitJobState("train", recovering)
	inc := c.lastIncident("train")
	require.True(t, inc.GetFaultAt().AsTime().Before(inc.GetDetectedAt().AsTime()), "the fault is node-b's last heartbeat, before the loss was decided")
	require.Nil(t, inc.GetFencedAt(), "node-b's workers may still run")
	a.expectStop(a1)

	for i := 0; c.lastIncident("train").GetFencedAt() == nil; i++ {
		require.Less(t, i, 100, "never fenced")
		c.advance(heartbeatTimeout/2, "node-a", "node-c")
	}
	inc = c.lastIncident("train")
	require.True(t, inc.GetFencedAt().AsTime().After(inc.GetDetectedAt().AsTime()), "fenced at node-b's self-fencing deadline")
	c.waitJob("train", func(j *rdzvv1.Job) bool { return lastOf(j).GetCommittedAt() != nil })
	inc = c.lastIncident("train")
	require.Equal(t, uint64(2), inc.GetNextGeneration())
	require.False(t, inc.GetCommittedAt().AsTime().Before(inc.GetFencedAt().AsTime()), "never committed before fenced")
}
