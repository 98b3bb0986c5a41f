package controller_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/health"
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
// declared lost once a heartbeat is overdue by a quarter interval, without
// waiting out the full timeout.
func TestPeersConfirmLostNodeFast(t *testing.T) {
	c := newFakeClockCluster(t, func(cfg *controller.Config) { cfg.Heartbeat.Timeout.Duration = time.Minute })
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	c.connectFake("node-z") // registers, then never heartbeats
	a.view(2, "node-z")
	b.view(2, "node-z")
	// advance waits for node-a and node-b to be heard after their views,
	// so its passes count their votes.
	c.advance(heartbeatInterval+heartbeatInterval/4-time.Millisecond, "node-a", "node-b")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodeState(c, "node-z"), "not before a heartbeat is overdue")
	c.advance(time.Millisecond, "node-a", "node-b")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_LOST, nodeState(c, "node-z"), "lost long before the one-minute heartbeat timeout")
	var lost *rdzvv1.Event
	for _, e := range c.events("") {
		if e.GetKind() == "node_lost" && e.GetNode() == "node-z" {
			lost = e
		}
	}
	require.NotNil(t, lost)
	require.Contains(t, lost.GetMessage(), "2 peers cannot reach it")
}

// A starved node (CPU saturated) sends its heartbeats late and misses its
// peers' probes too, so their word is no proof of death while its silence
// is within its usual lateness: it counts past twice that lateness
// (make bench-soak declared such a node lost again and again).
func TestPeersWordWaitsOutALateNodesLateness(t *testing.T) {
	c := newFakeClockCluster(t, func(cfg *controller.Config) { cfg.Heartbeat.Timeout.Duration = time.Minute })
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	z := c.connectFake("node-z")
	late := heartbeatInterval / 2
	z.heartbeat(1)
	for seq := uint64(2); seq <= 3; seq++ {
		c.advance(heartbeatInterval+late, "node-a", "node-b")
		z.heartbeat(seq)
	}
	a.view(2, "node-z")
	b.view(2, "node-z")
	c.advance(heartbeatInterval+heartbeatInterval/4, "node-a", "node-b")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodeState(c, "node-z"), "a quarter interval overdue is within its lateness")
	c.advance(2*late-heartbeatInterval/4-time.Millisecond, "node-a", "node-b")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodeState(c, "node-z"), "not before twice its lateness")
	c.advance(time.Millisecond, "node-a", "node-b")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_LOST, nodeState(c, "node-z"), "lost past twice its lateness, long before the timeout")
}

// Peers that called a node unreachable and then reached it again were
// wrong about it (a starved node misses their probes and comes back): for
// a while their word declares nothing, and only the heartbeat timeout
// declares the node lost.
func TestPeersWhoTookTheirWordBackAreDoubted(t *testing.T) {
	c := newFakeClockCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	z := c.connectFake("node-z")
	z.heartbeat(1)
	a.view(2, "node-z")
	b.view(2, "node-z")
	c.advance(heartbeatInterval/2, "node-a", "node-b")
	a.view(2)
	b.view(2)
	z.heartbeat(2)
	c.advance(heartbeatInterval/2, "node-a", "node-b")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodeState(c, "node-z"))
	a.view(2, "node-z")
	b.view(2, "node-z")
	c.advance(2*heartbeatInterval, "node-a", "node-b")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodeState(c, "node-z"), "overdue, but its peers were wrong about it before")
	c.advance(heartbeatTimeout, "node-a", "node-b")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_LOST, nodeState(c, "node-z"), "lost at the heartbeat timeout")
}

// A node the controller cannot hear but its peers still reach is spared
// for a while: the trouble may be the controller's alone. It is declared
// lost once that grace (the vouched timeout) is over.
func TestPeersVouchForNodeSilentToController(t *testing.T) {
	c := newFakeClockCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	// The clock stands still until advanced: node-z is last heard now,
	// past its registration.
	c.connectFake("node-z").heartbeat(1)
	a.view(3)
	b.view(3)
	// advance waits for node-a and node-b to be heard after their views,
	// so its passes count them as vouching.
	past := heartbeatTimeout + heartbeatTimeout/2
	c.advance(past, "node-a", "node-b")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodeState(c, "node-z"), "peers vouch for it past the heartbeat timeout")
	c.advance(vouchedTimeout-past, "node-a", "node-b")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodeState(c, "node-z"), "spared for the whole vouched timeout")
	c.advance(time.Millisecond, "node-a", "node-b")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_LOST, nodeState(c, "node-z"), "lost once the vouched timeout is over")
}

// A peer's word that a silent node is unreachable is acted on when it
// comes, not at the controller's next liveness tick: on a fake clock that
// stands still, no tick comes at all.
func TestPeersWordIsJudgedAtOnce(t *testing.T) {
	c := newFakeClockCluster(t, func(cfg *controller.Config) { cfg.Heartbeat.Timeout.Duration = time.Minute })
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	c.connectFake("node-z") // registers, then never heartbeats
	c.advance(2*heartbeatInterval, "node-a", "node-b")
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodeState(c, "node-z"), "silent, but nobody says it is gone")
	a.view(2, "node-z")
	c.waitNode("node-z", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST })
}

// watching reports, as node f's gossip does, that the peers it watches for
// assignment a (its ring neighbours) fail its own probes.
func (f *fakeAgent) watching(a *rdzvv1.Assignment, down ...string) {
	f.t.Helper()
	f.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_GossipView{GossipView: &rdzvv1.GossipView{
		Unreachable: down, AliveMembers: 2, WatchJob: a.GetSpec().GetName(), WatchGeneration: a.GetGeneration(), WatchedUnreachable: down,
	}}})
}

// A lost node whose watchers (its ring neighbours in the job, which it
// watches in turn) all say from their own probes that it does not answer
// cannot reach them either, so it fences itself by the quick rule: the
// next generation waits for that bound, not for its heartbeat timeout,
// also when the second watcher's word comes after the first one's
// declared the node lost. The word of peers that do not watch it does not
// shorten the wait.
func TestWatchersShortenTheFencingWait(t *testing.T) {
	const timeout = 5 * time.Second
	for _, tt := range []struct {
		name string
		// report has node-a and node-b say what they see of node-z.
		report func(c *cluster, a, b *fakeAgent, a1, b1 *rdzvv1.Assignment)
		quick  bool
	}{
		{name: "its watchers", quick: true, report: func(_ *cluster, a, b *fakeAgent, a1, b1 *rdzvv1.Assignment) {
			a.watching(a1, "node-z")
			b.watching(b1, "node-z")
		}},
		{name: "its second watcher after the first declared it lost", quick: true, report: func(c *cluster, a, b *fakeAgent, a1, b1 *rdzvv1.Assignment) {
			a.watching(a1, "node-z")
			poll(t, func() bool {
				c.advance(100*time.Millisecond, "node-a", "node-b")
				return nodeState(c, "node-z") == rdzvv1.NodeState_NODE_STATE_LOST
			}, func() string { return "node-z never declared lost" })
			b.watching(b1, "node-z")
		}},
		{name: "gossip only", report: func(_ *cluster, a, b *fakeAgent, _, _ *rdzvv1.Assignment) {
			a.view(2, "node-z")
			b.view(2, "node-z")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := newFakeClockCluster(t, func(cfg *controller.Config) { cfg.Heartbeat.Timeout.Duration = timeout })
			c.gossip = true
			three := c.threeNodes("elastic")
			a, b, z, a1, b1, z1 := three.agents[0], three.agents[1], three.agents[2], three.gen1[0], three.gen1[1], three.gen1[2]
			require.ElementsMatch(t, []string{"node-a", "node-b"}, peerNames(z1.GetWatch()), "a ring of three: each watches the other two")
			a.step(a1, 3)
			c.waitJob("elastic", func(j *rdzvv1.Job) bool { return j.GetStep() == 3 })

			z.crash()
			tt.report(c, a, b, a1, b1)
			reported := c.clock.Now()
			poll(t, func() bool {
				c.advance(100*time.Millisecond, "node-a", "node-b")
				return c.getJob("elastic").GetState() == recovering
			}, func() string { return "node-z never declared lost" })
			a.expectStop(a1)
			b.expectStop(b1)
			waited := c.advanceToCommit("elastic", 2, "node-a", "node-b").Sub(reported)
			if tt.quick {
				require.GreaterOrEqual(t, waited, health.IsolationLag+health.FenceMargin, "not before it has certainly fenced itself")
				require.Less(t, waited, timeout, "long before its heartbeat timeout")
			} else {
				require.GreaterOrEqual(t, waited, timeout, "its heartbeat timeout from its last heartbeat, no sooner")
			}
			require.Equal(t, uint32(2), a.run().GetNnodes())
		})
	}
}

func peerNames(peers []*rdzvv1.WatchedPeer) []string {
	var names []string
	for _, p := range peers {
		names = append(names, p.GetNode())
	}
	return names
}
