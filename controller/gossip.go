package controller

import (
	"math/rand/v2"
	"time"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const (
	// maxGossipSeeds bounds the seeds handed to a registering agent; any one
	// live member is enough to join.
	maxGossipSeeds = 5
	// maxViewSize bounds one agent's reported view, keeping the controller's
	// memory per node bounded.
	maxViewSize = 1024
)

// gossipView is one agent's latest report of the peers its gossip cannot
// reach.
type gossipView struct {
	unreachable map[string]bool
	alive       uint32
}

// liveness is the outcome of looking at one node's silence.
type liveness int

const (
	alive liveness = iota
	// peersConfirm: silent for a few heartbeats and peers cannot reach it
	// either, so it is gone; no need to wait out the full timeout.
	peersConfirm
	// timedOut: silent past the heartbeat timeout with no peer vouching.
	timedOut
	// peersVouch: silent past the timeout, but peers still reach it: the
	// trouble is between it and the controller, which alone must not
	// condemn a healthy node (up to heartbeat.vouched_timeout).
	peersVouch
)

// verdict decides a node's liveness from its silence and its peers' views:
// deadVotes peers report it unreachable, vouchers gossip and do not.
// vouched is how long peers' word keeps a silent node (the agent fences
// itself after as long without the controller).
func verdict(silent, interval, timeout, vouched time.Duration, deadVotes, vouchers int) liveness {
	switch {
	case deadVotes > 0 && silent > 2*interval:
		return peersConfirm
	case silent <= timeout:
		return alive
	case vouchers > 0 && silent <= vouched:
		return peersVouch
	}
	return timedOut
}

// gossipView records an agent's view.
func (c *Controller) gossipView(node string, v *rdzvv1.GossipView) {
	view := &gossipView{unreachable: map[string]bool{}, alive: v.GetAliveMembers()}
	for i, name := range v.GetUnreachable() {
		if i == maxViewSize {
			break
		}
		view.unreachable[name] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ns := c.nodes[node]; ns != nil {
		ns.view = view
	}
}

// gossipVotes counts, over the connected nodes whose gossip has peers, how
// many report each node unreachable, and how many such reporters there are.
// Callers hold c.mu.
func (c *Controller) gossipVotes() (votes map[string]int, reporters int) {
	votes = map[string]int{}
	for _, ns := range c.nodes {
		if !ns.reporting() {
			continue
		}
		reporters++
		for name := range ns.view.unreachable {
			votes[name]++
		}
	}
	return votes, reporters
}

// reporting is whether the node's view counts: it is connected and its
// gossip sees at least one other member.
func (ns *nodeState) reporting() bool {
	return ns.session != nil && ns.view != nil && ns.view.alive > 1 && ns.rec.GetState() != rdzvv1.NodeState_NODE_STATE_LOST
}

// selfReporter is 1 when the node is itself among the reporters, so it is
// not counted as vouching for itself.
func (ns *nodeState) selfReporter() int {
	if ns.reporting() {
		return 1
	}
	return 0
}

// gossipSeeds picks a few connected nodes' gossip addresses for node to
// join through. Callers hold c.mu.
func (c *Controller) gossipSeeds(node string) []string {
	var seeds []string
	seen := 0
	for name, ns := range c.nodes {
		addr := ns.rec.GetInfo().GetGossipAddr()
		if name == node || addr == "" || ns.session == nil || ns.rec.GetState() == rdzvv1.NodeState_NODE_STATE_LOST {
			continue
		}
		// Reservoir sampling: a uniform pick without collecting every node.
		seen++
		if len(seeds) < maxGossipSeeds {
			seeds = append(seeds, addr)
		} else if j := rand.IntN(seen); j < maxGossipSeeds {
			seeds[j] = addr
		}
	}
	return seeds
}
