package controller_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// A node that the previous leader declared lost (here the same controller
// before a restart) is fenced only by the self-fencing deadline counted
// from this leader's election: the previous leader kept its own deadline
// for the node in memory, and may have heard the node until it stopped.
// Without that, the next generation could start while the node, merely
// cut off, still ran the failed one.
func TestLostNodeStaysFencedAcrossRestart(t *testing.T) {
	c := newFakeClockCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	spec := c.recoverable("train", 2, 3)
	spec.NodesMin = 1
	c.startJob(spec)
	a1 := a.run()
	b.run()

	b.crash()
	c.advance(2*heartbeatTimeout, "node-a")
	c.waitJobState("train", recovering)
	a.expectStop(a1)
	c.settle()

	c.stopController()
	a.crash()
	c.startController()
	elected := c.clock.Now()
	a = c.connectFake("node-a", &rdzvv1.WorkerStatus{Job: "train", Generation: a1.GetGeneration(), State: rdzvv1.WorkerState_WORKER_STATE_STOPPED})
	a.keepAlive()
	// The fake agents run no gossip: node-b, if merely cut off, counts
	// itself isolated.
	policy := health.Heartbeat{Interval: c.cfg.Heartbeat.Interval.Duration, Timeout: c.cfg.Heartbeat.Timeout.Duration, Vouched: c.cfg.Heartbeat.VouchedTimeout.Duration}
	fencedBy := elected.Add(policy.SelfFenceDeadline(true))

	c.advance(fencedBy.Sub(c.clock.Now())-time.Millisecond, "node-a")
	j := c.getJob("train")
	require.Equal(t, recovering, j.GetState(), "node-b may still run generation %d: %s", a1.GetGeneration(), j.GetReason())
	require.Equal(t, a1.GetGeneration(), j.GetGeneration())

	c.advance(heartbeatTimeout, "node-a")
	a2 := a.run()
	require.Equal(t, a1.GetGeneration()+1, a2.GetGeneration())
	c.waitRunning("train")
}
