package health

import "time"

// Fencing is two rules that must agree: the agent's, when to kill its own
// workers once it is cut off (SelfFence), and the controller's, by when a
// node it declared lost has certainly done so (FencedBy), before which it
// starts no generation without that node. Both are built from the same
// Heartbeat and the constants below; TestFencingAgrees checks, over a grid
// of configurations and every way a node is lost, that
//
//	last word + SelfFenceDeadline(isolated) <= FencedBy(loss)
//
// where the agent's last word from the controller is no later than the
// controller's LastSeen of it (its fencing clock runs from the sending of
// the latest heartbeat the controller acknowledged, which the controller
// received no earlier).
const (
	// FenceCheckEvery is how often an agent asks whether it is cut off.
	FenceCheckEvery = 100 * time.Millisecond
	// fenceKill bounds the time from deciding to fence to the workers'
	// process groups being gone: a SIGKILL, no grace.
	fenceKill = 750 * time.Millisecond
	// FenceMargin is what a self-fencing deadline adds to its rule's
	// threshold: one check interval and the kill.
	FenceMargin = FenceCheckEvery + fenceKill
)

// SelfFence is the agent's rule for a node with workers: fence when cut
// off from the controller for its heartbeat timeout and from the peers
// too, or from every controller for the vouched timeout (by then it has
// moved the job on, whatever our peers say). No controller at all
// (failover, etcd quorum lost) is survived for the vouched timeout while
// peers are reachable. silent is how long since the agent's last word from
// the controller; isolated is whether its gossip reaches fewer than half
// of its peers (always, without gossip). Without a timeout it never fences.
func (h Heartbeat) SelfFence(silent time.Duration, isolated bool) bool {
	if h.Timeout <= 0 || silent <= h.Timeout {
		return false
	}
	return isolated || silent > h.Vouched
}

// SelfFenceDeadline is how long after its last word from the controller an
// agent that stays cut off has certainly killed its workers.
func (h Heartbeat) SelfFenceDeadline(isolated bool) time.Duration {
	threshold := max(h.Timeout, h.Vouched)
	if isolated {
		threshold = h.Timeout
	}
	return threshold + FenceMargin
}

// OrphanTimeout is how long workers outlive an agent that vanished without
// a word (a crash, an OOM kill): their shims kill them then. The
// controller last heard the agent up to an interval before it crashed, and
// gives up on it a heartbeat timeout after that, so the workers must be
// gone an interval sooner.
func (h Heartbeat) OrphanTimeout() time.Duration {
	return max(h.Timeout-h.Interval, h.Interval)
}

// Loss is what the controller knows of a node when it declares it lost.
type Loss struct {
	// At is when it is declared lost.
	At time.Time
	// LastSeen is when its agent last sent anything, or when this leader
	// loaded the node if it has not heard the agent since.
	LastSeen time.Time
	// Heard is whether its agent registered with this leader.
	Heard bool
	// ElectedAt is when this leader took the lead.
	ElectedAt time.Time
	// HoldUntil ends the hold of an agent that said it was restarting and
	// has not registered since; zero if none.
	HoldUntil time.Time
	// Gossips is whether its agent runs gossip.
	Gossips bool
	// Unreachable is whether a connected node's gossip reports it
	// unreachable.
	Unreachable bool
}

// agentIsolated is whether the lost node's agent, if alive, counts itself
// isolated, as far as the controller can tell. Without gossip it always
// does. With gossip, a peer that cannot reach it is taken to mean that it
// cannot reach its peers either (memberlist declares a member dead only
// when neither its own probes nor those it asks others to make reach it).
// Otherwise its peers may all be as cut off from the controller as it is,
// and reachable to it: it fences only after the vouched timeout.
func (l Loss) agentIsolated() bool { return !l.Gossips || l.Unreachable }

// FencedBy is the latest time by which a lost node's agent, if alive but
// cut off, has killed its own workers.
//
// Its fencing clock runs from its last word from a controller: no later
// than LastSeen if it registered with this leader, else from the previous
// leader, which stopped leading about when this one took over (ElectedAt).
// An agent that came back from a restart hold without reaching a
// controller runs its adopted workers by Unregistered, alone in its gossip
// (it joins peers only through a controller), from no later than the end
// of the hold, when the shims it did not adopt in time kill their workers.
func (h Heartbeat) FencedBy(l Loss) time.Time {
	isolated := l.agentIsolated()
	by := later(l.At, l.LastSeen.Add(h.Timeout)).Add(FenceMargin)
	from := l.LastSeen
	if !l.Heard {
		from = l.ElectedAt
	}
	by = later(by, from.Add(h.SelfFenceDeadline(isolated)))
	if !l.HoldUntil.IsZero() {
		by = later(by, l.HoldUntil.Add(Unregistered.SelfFenceDeadline(true)))
	}
	return by
}
