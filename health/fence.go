package health

import "time"

// Fencing is two rules that must agree: the agent's, when to kill its own
// workers once it is cut off (SelfFence), and the controller's, by when a
// node it declared lost has certainly done so (FencedBy), before which it
// starts no generation without that node. Both are built from the same
// Heartbeat and the constants below.
const (
	// FenceCheckEvery is how often an agent asks whether it is cut off.
	FenceCheckEvery = 250 * time.Millisecond
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
	// Confirmed is whether peers report it unreachable.
	Confirmed bool
}

// FencedBy is the latest time by which a lost node's agent, if alive but
// cut off, has killed its own workers. It fences itself once it has not
// heard us for the heartbeat timeout (or, with peers vouching, for as long
// as we waited). Not heard since this controller took the lead, its
// fencing clock runs from the previous leader's last word, at the latest
// around the election: cut off from its peers as well it fences after the
// heartbeat timeout; otherwise only after the vouched timeout, which is
// the worst case when nobody reports on it.
func (h Heartbeat) FencedBy(l Loss) time.Time {
	by := later(l.At, l.LastSeen.Add(h.Timeout)).Add(FenceMargin)
	if !l.Heard {
		by = later(by, l.ElectedAt.Add(h.SelfFenceDeadline(l.Confirmed)))
	}
	return by
}
