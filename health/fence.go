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

	// WatchEvery is how often an agent probes the peers it watches (its
	// job's ring neighbours), all at once. memberlist's own probing picks
	// one random member per interval, so in a large cluster a dead node
	// waits long for its first probe, then out a suspicion timeout; a job's
	// peers cannot wait that long.
	WatchEvery = 150 * time.Millisecond
	// WatchTimeout is how long one probe waits for its answer.
	WatchTimeout = 250 * time.Millisecond
	// WatchFailures probes in a row must fail for a watched peer to count
	// as unreachable: one lost UDP packet is not a dead node.
	WatchFailures = 2
	// IsolationLag bounds how much later a node cut off from a peer that
	// watches it knows so than that peer does. Both run the same rounds of
	// probes (a round is a tick or, failing, ends WatchTimeout after it
	// began): the peer's first failing round begins at the earliest a
	// round trip before the cut, the node's at the latest a tick after it,
	// and the node's later rounds may each wait for the next tick. The
	// peer knows at the end of its WatchFailures-th failing round, the node
	// at the end of its own, at most two ticks and a probe's answer later.
	IsolationLag = 2*WatchEvery + WatchTimeout
)

// Cutoff is what an agent knows of its peers when it asks whether to
// fence.
type Cutoff struct {
	// Isolated: its gossip reaches fewer than half of its peers, or none
	// of those it watches (always, without gossip).
	Isolated bool
	// Unwatched: it watches peers and none of them has answered its
	// latest WatchFailures probes. Those peers watch it in turn, so the
	// controller hears of the cut from them (Loss.WatchersCut) and can
	// count on the quick rule.
	Unwatched bool
}

// SelfFence is the agent's rule for a node with workers: fence when cut
// off from the controller for its heartbeat timeout and from the peers
// too, or from every controller for the vouched timeout (by then it has
// moved the job on, whatever our peers say). No controller at all
// (failover, etcd quorum lost) is survived for the vouched timeout while
// peers are reachable. Cut off from every peer it watches, it fences
// sooner, once the controller is QuickSilence silent: its watchers have
// told the controller, which declares it lost as soon. silent is how long
// since the agent's last word from the controller. Without a timeout it
// never fences.
func (h Heartbeat) SelfFence(silent time.Duration, c Cutoff) bool {
	switch {
	case h.Timeout <= 0:
		return false
	case c.Unwatched && silent > h.QuickSilence():
		return true
	case silent <= h.Timeout:
		return false
	}
	return c.Isolated || silent > h.Vouched
}

// QuickSilence is the controller's silence after which an agent cut off
// from every peer it watches fences. Its watchers' word declares it lost
// once its heartbeat is a quarter interval overdue (ConfirmAt); the agent
// waits half an interval, which spares a node whose heartbeat was merely
// slow while its probes failed: a starved host is late with both.
func (h Heartbeat) QuickSilence() time.Duration {
	return min(h.Interval+h.Interval/2, h.Timeout)
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
// controller last heard the agent up to an interval before it crashed.
// Its gossip died with it, so its watchers soon report it unreachable, and
// the quick rule's bound comes as early as QuickSilence after that last
// word (FencedBy): the workers must be gone an interval sooner. That is
// half an interval, well before the heartbeat timeout's bound too; an
// agent restarted that fast could have adopted them, one that takes longer
// finds its node declared lost anyway.
func (h Heartbeat) OrphanTimeout() time.Duration {
	return h.QuickSilence() - h.Interval
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
	// WatchersCut is when the last of the peers that watch it (its ring
	// neighbours in its job's round, which it watches in turn) began
	// reporting it unreachable, each without a break since, as the
	// controller received their word; zero unless all of them do.
	WatchersCut time.Time
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
// When every peer that watches it reports it unreachable (WatchersCut), it
// is cut off from every peer it watches by IsolationLag after the last of
// them began to say so: a probe that cannot make the round trip one way
// cannot the other way either. Then the quick rule fences it QuickSilence
// after its last word, if that is later.
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
	if l.Gossips && l.Unreachable {
		// It counts itself isolated only once its own probes have failed
		// too, up to IsolationLag after its peers' word, which came no
		// later than the declaration.
		by = later(by, l.At.Add(IsolationLag+FenceMargin))
	}
	if !l.WatchersCut.IsZero() {
		quick := later(l.At, later(from.Add(h.QuickSilence()), l.WatchersCut.Add(IsolationLag))).Add(FenceMargin)
		if quick.Before(by) {
			by = quick
		}
	}
	if !l.HoldUntil.IsZero() {
		by = later(by, l.HoldUntil.Add(Unregistered.SelfFenceDeadline(true)))
	}
	return by
}

// Leases. An agent that is alive but not running (stopped by a signal, a
// frozen cgroup, a long stall) neither fences itself nor looks dead to its
// shims, so SelfFence alone does not make the bound above hold: nothing
// that needs the agent to be scheduled enforces it. Each shim therefore
// runs its workers under a lease, a deadline on the node's boot clock that
// the agent renews every FenceCheckEvery and the shim enforces on its own,
// checking every LeaseCheckEvery. A lease the agent grants must hold
// however long it then stops running, so LeaseUntil is never later than the
// earliest bound FencedBy can give, for any way the node may be declared
// lost after its last word; TestLeaseAgrees checks that, with stalls of
// any length starting at any point, and shows the stall that today's
// SelfFence alone fails.
const (
	// LeaseCheckEvery is how often a shim checks its lease.
	LeaseCheckEvery = 50 * time.Millisecond
	// LeaseDrain is how long a shim that finds its lease lapsed still
	// takes the renewals already on their way before it kills: one that
	// ran late (a loaded node) is woken by its clock before it has read
	// its socket, where a renewal sent in time may wait (LeaseRenews).
	LeaseDrain = 20 * time.Millisecond
	// reportLag is how long after a node stopped answering its watchers
	// can say so, at the earliest.
	reportLag = WatchFailures*WatchTimeout - WatchEvery
)

// LeaseUntil is how long the workers of an agent may run if it stops now
// and never runs again: heard is its last word from the controller (as for
// SelfFence), answered the latest time by which every peer it watches had
// answered its probe, zero if one has not; watching is false when it
// watches none.
//
// FencedBy's bound comes from when (from, no earlier than heard) and how
// the node is declared lost. Peers vouching for it, no sooner than
// from+Vouched. Reported unreachable, no sooner than from+Timeout (its
// rule for an isolated agent) and At+IsolationLag, At being no earlier than
// the report. By its watchers, the quick rule, no sooner than
// max(from+QuickSilence, WatchersCut+IsolationLag). A report, a watcher's
// or gossip's, follows the failed probes of a node that stopped (or whose
// link did), which was running and reachable at answered. A watcher's
// comes at the end of its WatchFailures-th failing round in a row, the
// first of which began at most a round trip (under WatchEvery) before the
// stop, and each lasting WatchTimeout: reportLag after answered at the
// earliest (TestLeaseAgrees runs the rounds).
// A node that watches no peer has no such word on its side: it goes by
// the heartbeat timeout. Each bound adds FenceMargin, which covers the
// shim's check, at most LeaseCheckEvery past the lease, its LeaseDrain and
// the kill.
func (h Heartbeat) LeaseUntil(heard, answered time.Time, watching bool) time.Time {
	if h.Timeout <= 0 {
		// No timeout known, no bound: nothing to hold the workers to.
		return time.Time{}
	}
	until := heard.Add(h.Timeout)
	if watching {
		until = heard.Add(h.QuickSilence())
		if !answered.IsZero() {
			until = later(until, answered.Add(reportLag+IsolationLag))
		}
		if vouched := heard.Add(max(h.Vouched, h.Timeout)); vouched.Before(until) {
			until = vouched
		}
	}
	return until.Add(FenceMargin - LeaseCheckEvery - LeaseDrain - fenceKill)
}

// LeaseRenews reports whether a shim whose lease runs until lease takes,
// at now, a renewal its agent sent at sent (all on the boot clock; a zero
// lease holds to none, a zero sent is unknown). A renewal is what
// LeaseUntil allowed when it was sent, so one sent while the lease held
// grants nothing more read late than read in time, however late: the
// controller's bound covers it either way. One sent after the lease
// lapsed never counts, nor one of unknown age read after: by then the
// controller may have moved the job on, and an agent that ran again
// (a thawed cgroup) computes its next lease from peers that answer again,
// not from the word that kept the old one.
func LeaseRenews(lease, sent, now time.Duration) bool {
	return lease == 0 || now < lease || (sent != 0 && sent < lease)
}
