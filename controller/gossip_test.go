package controller_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/controller"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func (f *fakeAgent) view(alive uint32, unreachable ...string) {
	f.t.Helper()
	f.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_GossipView{GossipView: &rdzvv1.GossipView{
		Unreachable: unreachable, AliveMembers: alive,
	}}})
}

func nodeState(c *cluster, name string) rdzvv1.NodeState { return c.listNodes()[name].GetState() }

// A node that falls silent and that its peers cannot reach either is
// declared lost after a few missed heartbeats, without waiting out the
// full timeout.
func TestPeersConfirmLostNodeFast(t *testing.T) {
	c := newCluster(t, func(cfg *controller.Config) { cfg.Heartbeat.Timeout.Duration = time.Minute })
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	c.connectFake("node-z") // registers, then never heartbeats
	started := time.Now()
	a.view(2, "node-z")
	b.view(2, "node-z")
	n := c.waitNode("node-z", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST })
	require.Less(t, time.Since(started), 30*time.Second, "long before the one-minute heartbeat timeout")
	var lost *rdzvv1.Event
	for _, e := range c.events("") {
		if e.GetKind() == "node_lost" && e.GetNode() == "node-z" {
			lost = e
		}
	}
	require.NotNil(t, lost)
	require.Contains(t, lost.GetMessage(), "2 peers cannot reach it")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_LOST, n.GetState())
}

// A node the controller cannot hear but its peers still reach is spared
// for a while: the trouble may be the controller's alone. It is declared
// lost once that grace (the vouched timeout) is over.
func TestPeersVouchForNodeSilentToController(t *testing.T) {
	c := newCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	// Taken before node-z registers, its last word: the controller counts
	// its silence from a later instant, never an earlier one.
	silentSince := time.Now()
	c.connectFake("node-z")
	a.view(3)
	b.view(3)
	time.Sleep(heartbeatTimeout + heartbeatTimeout/2)
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodeState(c, "node-z"), "peers vouch for it past the heartbeat timeout")
	c.waitNode("node-z", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST })
	require.GreaterOrEqual(t, time.Since(silentSince), vouchedTimeout, "spared for the vouched timeout")
}
