package controller_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// A running job holds nodes.spares healthy idle nodes that no other job
// gets; when it recovers, they (and its own freed nodes) are its, not a
// pending job's.
func TestSparesHeldForRunningJob(t *testing.T) {
	c := newCluster(t)
	fakes := map[string]*fakeAgent{}
	for _, n := range []string{"node-a", "node-b", "node-s", "node-t"} {
		fakes[n] = c.connectFake(n)
		fakes[n].keepAlive()
	}
	big := c.recoverable("big", 2, 3)
	big.NodesSpares = 1
	c.startJob(big)
	a1, b1 := fakes["node-a"].run(), fakes["node-b"].run()
	c.waitRunning("big")
	j := c.waitJob("big", func(j *rdzvv1.Job) bool { return len(j.GetSpares()) == 1 })
	require.Equal(t, []string{"node-s"}, j.GetSpares(), "spares go in rank order, like a round's nodes")

	c.startJob(c.spec("other", 2, 2, "ok"))
	o := c.waitJob("other", func(j *rdzvv1.Job) bool { return strings.Contains(j.GetReason(), "held as spares") })
	require.Equal(t, rdzvv1.JobState_JOB_STATE_PENDING, o.GetState())
	require.Contains(t, o.GetReason(), "1 of 3 nodes eligible, need 2 (2 busy or not ready); 1 idle node(s) held as spares for running jobs")

	// node-b's GPU goes bad: the job recovers on node-a and its spare at
	// once, and the pending job still gets neither.
	fakes["node-b"].health(1, &rdzvv1.HealthCheckResult{Name: "gpu", Critical: true, Message: "7 GPUs present, expected 8"})
	c.waitJobState("big", recovering)
	fakes["node-a"].expectStop(a1)
	fakes["node-b"].expectStop(b1)
	a2, s2 := fakes["node-a"].run(), fakes["node-s"].run()
	require.Equal(t, uint64(2), a2.GetGeneration())
	require.Equal(t, uint64(2), s2.GetGeneration())
	j = c.waitJob("big", func(j *rdzvv1.Job) bool {
		return j.GetState() == rdzvv1.JobState_JOB_STATE_RUNNING && len(j.GetSpares()) == 1 && j.GetSpares()[0] == "node-t"
	})
	require.Equal(t, uint64(2), j.GetGeneration())
	require.Equal(t, rdzvv1.JobState_JOB_STATE_PENDING, c.getJob("other").GetState())

	// Once the job ends, its spares are free for others.
	c.stopJob("big")
	fakes["node-a"].expectStop(a2)
	fakes["node-s"].expectStop(s2)
	c.waitJobState("big", rdzvv1.JobState_JOB_STATE_STOPPED)
	require.Empty(t, c.getJob("big").GetSpares())
	o = c.waitJobState("other", rdzvv1.JobState_JOB_STATE_RUNNING)
	for _, a := range o.GetAssignments() {
		require.NotEqual(t, "node-b", a.GetNode(), "node-b fails its gpu check")
	}
}
