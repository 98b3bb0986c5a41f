package health

import "time"

// confirmLate is how far past its interval a node's heartbeat must be
// overdue before its peers' word that they cannot reach it either declares
// it lost. A heartbeat on time but for jitter is in by then; the peers of
// a job probe each other every 150 ms, so their word is in too.
const confirmLate = 4 // a quarter of an interval

// lateFactor widens that margin for a node whose heartbeats have recently
// been late: a starved host (CPU saturated, throttled) is late again by as
// much and more, and then also misses its peers' probes, so their word is
// no independent evidence of death until its silence is past twice its
// recent lateness. A punctual node keeps the quarter interval. Without
// this, a host starved to a sliver of a CPU, whose heartbeats come late
// while its peers report it unreachable, would be declared lost again and
// again while alive.
const lateFactor = 2

// DoubtFor is how long peers' word that a node is unreachable does not
// count after they took it back without the node being lost: they called
// a starved node dead and it was not, and a starved node's peers may do
// so every few seconds. Meanwhile only the heartbeat timeout declares it
// lost.
const DoubtFor = time.Minute

// Verdict is the controller's judgement of one node's silence.
type Verdict int

const (
	// Alive: heard within the heartbeat timeout.
	Alive Verdict = iota
	// Spared: no judgement while its agent restarts (the hold it asked
	// for) or while a new leader gives agents time to reconnect (the
	// start-up grace); nothing about the node changes.
	Spared
	// Suspect: silent past the timeout, but peers still reach it, so the
	// trouble is between it and the controller, which alone must not
	// condemn a healthy node (up to the vouched timeout).
	Suspect
	// Lost: gone, or cut off; its job moves on.
	Lost
)

func (v Verdict) String() string {
	switch v {
	case Alive:
		return "alive"
	case Spared:
		return "spared"
	case Suspect:
		return "suspect"
	case Lost:
		return "lost"
	}
	return "unknown"
}

// Peers is what the other connected nodes' gossip says of one node. Only
// nodes whose gossip sees at least one other member count, and a node never
// counts for itself.
type Peers struct {
	// Unreachable counts those that report it unreachable.
	Unreachable int
	// Vouching counts those that do not: they still reach it.
	Vouching int
}

// Silence is what the controller knows of one node that is not lost yet.
type Silence struct {
	// LastSeen is when its agent last sent anything.
	LastSeen time.Time
	// HoldUntil ends the hold its restarting agent asked for; zero if none.
	// Held, it is spared whatever its peers say: they lost it too, since
	// gossip restarts with the agent.
	HoldUntil time.Time
	// GraceUntil ends the start-up grace of a leader that has not heard its
	// agent yet; zero once heard. The grace spares nodes whose agents have
	// not reconnected yet, not those their peers know are gone.
	GraceUntil time.Time
	Peers      Peers
	// Lag is how far behind the controller itself has lately been in
	// hearing its agents (see LagCredit): heartbeats it has not processed
	// yet are not the node's silence.
	Lag time.Duration
	// Registering: the controller has heard only the node's registration
	// so far. Its first heartbeat follows the registration reply, which
	// waits, like the heartbeat itself, behind every other agent's
	// registration on both sides, so a registration storm (a cold start,
	// a new leader) counts as a heartbeat timeout of lag for it.
	Registering bool
	// Late is how late its heartbeats have recently arrived (the recent
	// worst gap beyond the interval); zero for a punctual node.
	Late time.Duration
	// Doubted: its peers recently called it unreachable in error
	// (DoubtFor), so their word declares nothing.
	Doubted bool
}

// Liveness is a verdict with what it was based on.
type Liveness struct {
	Verdict Verdict
	// Silent is how long the node has been silent (zero when held).
	Silent time.Duration
	// Confirmed: lost because peers cannot reach it either, before the
	// full timeout.
	Confirmed bool
}

// ConfirmAt is when a node last heard at lastSeen is silent long enough for
// its peers' word to declare it lost (Liveness): a heartbeat overdue by a
// quarter of an interval, or by twice its recent lateness if more.
func (h Heartbeat) ConfirmAt(lastSeen time.Time, late time.Duration) time.Time {
	return lastSeen.Add(h.Interval + max(h.Interval/confirmLate, lateFactor*late))
}

// Liveness judges a node's silence at now. Overdue by a heartbeat (see
// ConfirmAt) while a peer cannot reach it either, it is gone: no need to
// wait out the full timeout; unless its peers are Doubted. Silent past the timeout, it is lost unless
// peers vouch for it, which they can for the vouched timeout.
//
// The timeouts are judged on the silence net of the controller's own lag
// (LagCredit): an overloaded controller (a cold start's thousands of TLS
// handshakes) must not condemn nodes whose heartbeats wait in its queues.
// Peers' word that they cannot reach the node is not the controller's
// hearing, so it is judged on the full silence. Declaring a node later
// never weakens fencing: FencedBy runs from the declaration.
func (h Heartbeat) Liveness(now time.Time, s Silence) Liveness {
	if now.Before(s.HoldUntil) {
		return Liveness{Verdict: Spared}
	}
	silent := now.Sub(s.LastSeen)
	lag := s.Lag
	if s.Registering {
		lag += h.Timeout
	}
	heard := silent - h.LagCredit(lag)
	l := Liveness{Verdict: Lost, Silent: silent}
	switch {
	case s.Peers.Unreachable > 0 && !s.Doubted && !now.Before(h.ConfirmAt(s.LastSeen, s.Late)):
		l.Confirmed = true
		return l
	case now.Before(s.GraceUntil):
		l.Verdict = Spared
	case heard <= h.Timeout:
		l.Verdict = Alive
	case s.Peers.Vouching > 0 && heard <= h.Vouched:
		l.Verdict = Suspect
	}
	return l
}

// LagCredit is how much of a node's silence is forgiven for the
// controller's own lag: all of it, up to what lets a node without peers'
// word be silent for the vouched timeout at most (a node vouched for, twice
// that), so that a controller that stays overloaded still moves jobs on,
// late rather than never.
func (h Heartbeat) LagCredit(lag time.Duration) time.Duration {
	return max(min(lag, h.Vouched-h.Timeout), 0)
}
