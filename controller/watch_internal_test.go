package controller

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Each node of a round watches its neighbours in a ring by rank, so every
// node is watched by two peers (one in a round of two) at a constant cost
// per node; nodes without gossip are neither watched nor watching.
func TestWatchedPeers(t *testing.T) {
	tests := []struct {
		name     string
		nodes    int
		noGossip map[int]bool
		want     map[int][]int // rank to watched ranks
	}{
		{name: "alone", nodes: 1, want: map[int][]int{0: nil}},
		{name: "two watch each other once", nodes: 2, want: map[int][]int{0: {1}, 1: {0}}},
		{name: "three", nodes: 3, want: map[int][]int{0: {1, 2}, 1: {2, 0}, 2: {0, 1}}},
		{name: "five, a ring", nodes: 5, want: map[int][]int{0: {1, 4}, 2: {3, 1}, 4: {0, 3}}},
		{name: "a peer without gossip is left out", nodes: 3, noGossip: map[int]bool{2: true}, want: map[int][]int{0: {1}, 1: {0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Controller{nodes: map[string]*nodeState{}}
			round := &rdzvv1.Round{}
			for r := range tt.nodes {
				name := fmt.Sprintf("node-%d", r)
				info := &rdzvv1.NodeInfo{Name: name}
				if !tt.noGossip[r] {
					info.GossipAddr = fmt.Sprintf("10.0.0.%d:7946", r)
				}
				c.nodes[name] = testNode(t, &rdzvv1.Node{Info: info})
				round.Nodes = append(round.Nodes, &rdzvv1.NodeAssignment{Node: name, NodeRank: uint32(r)})
			}
			for r, want := range tt.want {
				var got []string
				for _, p := range c.nodes.watchedPeers(round, round.GetNodes()[r]) {
					require.Equal(t, c.nodes[p.GetNode()].info.gossipAddr, p.GetGossipAddr())
					got = append(got, p.GetNode())
				}
				var wantNames []string
				for _, w := range want {
					wantNames = append(wantNames, fmt.Sprintf("node-%d", w))
				}
				require.Equal(t, wantNames, got, "rank %d", r)
			}
		})
	}
}
