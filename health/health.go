// Package health is rdzv's health policy, in one place: when a silent node
// is alive, suspect or lost (heartbeats corroborated by gossip), when a
// cut-off agent kills its own workers and by when the controller may count
// on that, when a job hangs or crash-loops, when a node is flaky, and which
// GPU faults make a node untrustworthy.
//
// Everything here is a pure decision: no I/O, no locks, no clocks. Times are
// passed in, durations come as config structs. The agent and the controller
// act on these decisions; neither holds a rule of its own, so that the two
// sides of one rule (the agent's self-fencing and the controller's bound on
// it) are computed from the same parameters and cannot drift apart.
package health

import "time"

// Heartbeat is the liveness timing both sides go by: the controller's
// heartbeat config, which it sends every agent when it registers.
type Heartbeat struct {
	// Interval is how often agents heartbeat.
	Interval time.Duration
	// Timeout is the silence after which a node is lost, and after which an
	// agent cut off from its peers too fences itself.
	Timeout time.Duration
	// Vouched is the silence tolerated while the node's gossip peers still
	// reach it, and after which an agent fences itself whatever its peers
	// say: by then the controller has moved its job on.
	Vouched time.Duration
}

// hiccupFactor: an agent told a heartbeat timeout but no vouched timeout (a
// controller older than vouched timeouts) takes this many timeouts.
const hiccupFactor = 3

// Unregistered is what an agent goes by until a controller has told it
// otherwise: at start, and so while it runs workers it adopted from the
// agent before it without having reached a controller yet.
var Unregistered = Heartbeat{Interval: time.Second, Timeout: 5 * time.Second, Vouched: hiccupFactor * 5 * time.Second}

// Learn is the heartbeat an agent goes by after a controller's registration
// reply, h being what it went by before. Zero values are what the
// controller did not send: the interval falls back to Unregistered's, and
// the timeouts stay as they were.
func (h Heartbeat) Learn(interval, timeout, vouched time.Duration) Heartbeat {
	h.Interval = Unregistered.Interval
	if interval > 0 {
		h.Interval = interval
	}
	if timeout > 0 {
		h.Timeout, h.Vouched = timeout, hiccupFactor*timeout
	}
	if vouched > 0 {
		h.Vouched = vouched
	}
	return h
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
