package controller

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// A registering node is given a few seeds: connected, live nodes with a
// gossip address, never itself; however many nodes there are, and however
// few of them run gossip, when those registered lately.
func TestGossipSeeds(t *testing.T) {
	tests := []struct {
		name      string
		connected int
		// noGossip nodes without gossip; registered: the connected ones
		// registered after them (seedRing); otherwise they registered long
		// ago, and nodes gone since have filled the ring.
		noGossip   int
		registered bool
		want       int
	}{
		{name: "alone"},
		{name: "fewer nodes than seeds", connected: 3, want: 3},
		{name: "many nodes", connected: 10000, want: maxGossipSeeds},
		{name: "many nodes, registered", connected: 10000, registered: true, want: maxGossipSeeds},
		{name: "a few among many without gossip, registered lately", connected: 3, noGossip: 10000, registered: true, want: 3},
		{name: "a few among many without gossip, registered long ago", connected: 3, noGossip: 100, want: 3},
		{name: "none with gossip among many", noGossip: 10000, registered: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Insecure = true
			c, err := New(cfg, zaptest.NewLogger(t))
			require.NoError(t, err)
			node := func(name, gossip string, state rdzvv1.NodeState, connected bool) {
				ns := testNode(t, &rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: name, GossipAddr: gossip}, State: state})
				if connected {
					ns.session = &session{node: name}
				}
				c.nodes[name] = ns
			}
			node("self", "10.0.0.1:7946", rdzvv1.NodeState_NODE_STATE_READY, true)
			node("lost", "10.0.0.2:7946", rdzvv1.NodeState_NODE_STATE_LOST, true)
			node("gone", "10.0.0.3:7946", rdzvv1.NodeState_NODE_STATE_READY, false)
			node("no-gossip", "", rdzvv1.NodeState_NODE_STATE_READY, true)
			for i := range tt.noGossip {
				node(fmt.Sprintf("plain%d", i), "", rdzvv1.NodeState_NODE_STATE_READY, true)
			}
			if !tt.registered {
				for range seedCandidates + 1 {
					c.seeds.add("gone")
				}
			}
			good := map[string]bool{}
			for i := range tt.connected {
				addr := fmt.Sprintf("10.1.%d.%d:7946", i/256, i%256)
				node(fmt.Sprintf("n%d", i), addr, rdzvv1.NodeState_NODE_STATE_READY, true)
				good[addr] = true
				if tt.registered {
					c.seeds.add(fmt.Sprintf("n%d", i))
				}
			}
			for range 20 {
				seeds := c.nodes.gossipSeeds(&c.seeds, "self")
				require.Len(t, seeds, tt.want)
				for _, s := range seeds {
					require.True(t, good[s], "seed %s is not a connected live node with gossip", s)
				}
			}
		})
	}
}
