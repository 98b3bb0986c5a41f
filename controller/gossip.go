package controller

import (
	"math/rand/v2"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const (
	// maxGossipSeeds bounds the seeds handed to a registering agent; any one
	// live member is enough to join.
	maxGossipSeeds = 5
	// maxViewSize bounds one agent's reported view, keeping the controller's
	// memory per node bounded.
	maxViewSize = 1024
	// maxWatched bounds the watched peers of a view: an agent watches its
	// two ring neighbours.
	maxWatched = 2
)

// gossipView is one agent's latest report of the peers its gossip cannot
// reach.
type gossipView struct {
	unreachable map[string]bool
	alive       uint32
	// watchJob's generation watchGen is the assignment whose peers the
	// agent watches; watchedDown maps those that fail its own probes to
	// when it began to say so, without a break since (see watchersCut).
	watchJob    string
	watchGen    uint64
	watchedDown map[string]time.Time
}

// gossipView records an agent's view.
func (c *Controller) gossipView(node string, v *rdzvv1.GossipView) {
	view := &gossipView{unreachable: map[string]bool{}, alive: v.GetAliveMembers(), watchJob: v.GetWatchJob(), watchGen: v.GetWatchGeneration()}
	for i, name := range v.GetUnreachable() {
		if i == maxViewSize {
			break
		}
		view.unreachable[name] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ns := c.nodes[node]
	if ns == nil {
		return
	}
	now := c.clock.Now()
	for i, name := range v.GetWatchedUnreachable() {
		if i == maxWatched {
			break
		}
		if view.watchedDown == nil {
			view.watchedDown = map[string]time.Time{}
		}
		view.watchedDown[name] = now
		if old := ns.view; old != nil && old.watchJob == view.watchJob && old.watchGen == view.watchGen {
			if since, ok := old.watchedDown[name]; ok {
				view.watchedDown[name] = since
			}
		}
	}
	news := false
	for name := range view.unreachable {
		if ns.view == nil || !ns.view.unreachable[name] {
			news = true
			break
		}
	}
	ns.view = view
	for name := range view.watchedDown {
		if by, ok := c.nodes.tightenFencing(c.jobs, name, c.cfg.Heartbeat.policy()); ok {
			c.log.Info("lost node's fencing deadline shortened by its watchers' word", zap.String("node", name), zap.Time("fenced_by", by))
			c.wake() // the recovery waits for it
		}
	}
	if news {
		// Judged now, not at the next liveness tick: a peer's word is what
		// declares a dead node lost early.
		select {
		case c.peersKick <- struct{}{}:
		default:
		}
	}
}

// gossipVotes counts, over the connected nodes whose gossip has peers, how
// many report each node unreachable, and how many such reporters there are.
func (nt nodeTable) gossipVotes() (votes map[string]int, reporters int) {
	votes = map[string]int{}
	for _, ns := range nt {
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

// unreachableTo reports whether any connected node's gossip lists node
// unreachable, however few peers it sees itself: the controller's evidence
// that node's agent, if alive, counts itself cut off (health.Loss).
func (nt nodeTable) unreachableTo(node string) bool {
	for name, ns := range nt {
		if name != node && ns.session != nil && ns.view != nil && ns.rec.GetState() != rdzvv1.NodeState_NODE_STATE_LOST && ns.view.unreachable[node] {
			return true
		}
	}
	return false
}

// watchersCut is when the last of the peers that watch node in
// generation of js (its ring neighbours in that round, which it watches in
// turn) began to report, from their own probes of that round's
// assignment, that it does not answer; zero unless every one of them does,
// so that node, if alive, is cut off from every peer it watches
// (health.Loss.WatchersCut), and while that round is the job's current
// one. js may be nil (no such job).
func (nt nodeTable) watchersCut(js *jobState, node string, generation uint64) time.Time {
	if js == nil || generation == 0 || js.members.Round().GetGeneration() != generation {
		return time.Time{}
	}
	a := js.members.Assignment(node)
	if a == nil {
		return time.Time{}
	}
	job := js.rec.GetSpec().GetName()
	var cut time.Time
	for _, p := range nt.watchedPeers(js.members.Round(), a) {
		w := nt[p.GetNode()]
		if w == nil || w.session == nil || w.rec.GetState() == rdzvv1.NodeState_NODE_STATE_LOST || w.view == nil ||
			w.view.watchJob != job || w.view.watchGen != generation {
			return time.Time{}
		}
		since, ok := w.view.watchedDown[node]
		if !ok {
			return time.Time{}
		}
		if since.After(cut) {
			cut = since
		}
	}
	return cut
}

// lostFencing is what a lost node's fencing deadline was computed from,
// kept while the word of its other watchers may still shorten it.
type lostFencing struct {
	loss       health.Loss
	job        string
	generation uint64
}

// tightenFencing applies the quick bound (health.Loss.WatchersCut) to a
// node declared lost before all of its watchers said they cannot reach
// it: the first one's word declares it once its heartbeat is overdue, and
// the others' comes a moment later. It returns the node's new fencing
// deadline, ok false when it did not move.
func (nt nodeTable) tightenFencing(jt jobTable, node string, policy health.Heartbeat) (by time.Time, ok bool) {
	ns := nt[node]
	if ns == nil || ns.lost == nil || ns.rec.GetState() != rdzvv1.NodeState_NODE_STATE_LOST {
		return time.Time{}, false
	}
	cut := nt.watchersCut(jt[ns.lost.job], node, ns.lost.generation)
	if cut.IsZero() {
		return time.Time{}, false
	}
	loss := ns.lost.loss
	loss.WatchersCut, ns.lost = cut, nil
	if by = policy.FencedBy(loss); !by.Before(ns.fencedBy) {
		return time.Time{}, false
	}
	ns.fencedBy = by
	return by, true
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

// seedCandidates bounds how many nodes gossipSeeds considers, and
// seedScan how many it looks at to find them: a pass over every node per
// registration would make a cold start O(N²), and so would looking until
// seedCandidates fit when few nodes do (without gossip, none does). So it
// looks first among the nodes that registered with gossip
// last (seedRing), which are almost always connected, and scans at most
// seedScan others only if they fall short. Map iteration starts at a
// random place, so those are a fair enough sample.
const (
	seedCandidates = 8 * maxGossipSeeds
	seedScan       = 4 * seedCandidates
)

// seedRing is the names of the last nodes that registered with gossip.
type seedRing struct {
	names [seedCandidates]string
	next  int
}

func (r *seedRing) add(name string) {
	r.names[r.next%len(r.names)] = name
	r.next++
}

// gossipSeeds picks a few connected nodes' gossip addresses for node to
// join through, first among ring's.
func (nt nodeTable) gossipSeeds(ring *seedRing, node string) []string {
	var seeds []string
	seen := 0
	consider := func(name string, ns *nodeState) {
		addr := ns.info.gossipAddr
		if name == node || addr == "" || ns.session == nil || ns.rec.GetState() == rdzvv1.NodeState_NODE_STATE_LOST || slices.Contains(seeds, addr) {
			return
		}
		// Reservoir sampling: a uniform pick without collecting every node.
		seen++
		if len(seeds) < maxGossipSeeds {
			seeds = append(seeds, addr)
		} else if j := rand.IntN(seen); j < maxGossipSeeds {
			seeds[j] = addr
		}
	}
	for _, name := range ring.names {
		if ns := nt[name]; ns != nil {
			consider(name, ns)
		}
	}
	// Until the ring wraps, it names every node that registered with
	// gossip since the controller started, among them every node whose
	// stream could make it a seed: a scan would find none it does not (a
	// cold start of agents without gossip spent 42% of its registrations
	// here).
	if len(seeds) == maxGossipSeeds || ring.next <= len(ring.names) {
		return seeds
	}
	scanned := 0
	for name, ns := range nt {
		if seen >= seedCandidates || scanned == seedScan {
			break
		}
		scanned++
		consider(name, ns)
	}
	return seeds
}
