package controller_test

import (
	"testing"
	"time"

	"github.com/rdzv/rdzv/controller"

	"github.com/stretchr/testify/require"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// silentUnderLag advances the fake clock by d in steps of a quarter of the
// heartbeat timeout while the controller measures lag for itself before
// every liveness pass, node-a heartbeating all along.
func silentUnderLag(c *cluster, lag, d time.Duration) {
	c.t.Helper()
	c.lag.Store(int64(lag))
	for step := heartbeatTimeout / 4; d > 0; d -= step {
		controller.NoteLag(c.ctl)
		c.advance(min(step, d), "node-a")
	}
}

// A controller behind its agents (a cold start's thousands of handshakes)
// does not declare lost a node whose heartbeats it has not processed yet:
// the node's silence is judged net of the controller's own lag, for as
// long as the heartbeats it held up may still be arriving.
func TestControllerLagSparesSilentNodes(t *testing.T) {
	c := newFakeClockCluster(t)
	c.connectFake("node-a").keepAlive()
	c.connectFake("node-z").heartbeat(1) // then is not heard again

	silentUnderLag(c, 2*heartbeatTimeout, 2*heartbeatTimeout+heartbeatTimeout/2)
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodeState(c, "node-z"), "silent past the timeout, but no more than the controller's lag")
	require.Positive(t, c.logs.FilterMessage("controller behind its agents: their silence is judged net of its lag").Len())

	// Caught up: the lag is credited for one more heartbeat timeout, then
	// the silence counts in full.
	silentUnderLag(c, 0, heartbeatTimeout+time.Millisecond)
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_LOST, nodeState(c, "node-z"))
}

// A controller that stays behind still moves on: the credit is bounded so
// that a node is lost by the vouched timeout at the latest.
func TestControllerLagCreditBounded(t *testing.T) {
	c := newFakeClockCluster(t)
	c.connectFake("node-a").keepAlive()
	c.connectFake("node-z").heartbeat(1)

	silentUnderLag(c, time.Hour, vouchedTimeout)
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodeState(c, "node-z"))
	silentUnderLag(c, time.Hour, heartbeatTimeout/4)
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_LOST, nodeState(c, "node-z"))
}

// A node heard only registering is given a second heartbeat timeout for
// its first heartbeat, which waits behind the other agents' registrations;
// once it heartbeats, the usual timeout applies.
func TestFirstHeartbeatAfterRegistering(t *testing.T) {
	c := newFakeClockCluster(t)
	c.connectFake("node-a").keepAlive()
	c.connectFake("node-z")
	c.connectFake("node-y").heartbeat(1)

	c.advance(2*heartbeatTimeout, "node-a")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodeState(c, "node-z"), "not yet heartbeating: a second timeout")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_LOST, nodeState(c, "node-y"), "heartbeated once: the usual timeout")
	c.advance(time.Millisecond, "node-a")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_LOST, nodeState(c, "node-z"))
}
