package agent

import (
	"math/rand/v2"
	"time"
)

// Beat is an agent's heartbeat schedule on one stream: every interval, at
// a slot of the interval the agent drew at random.
//
// Agents that register together heartbeat in step for as long as they stay
// connected, if each starts its interval when it registers: a relay's
// agents when a controller starts leading, every agent after a controller
// restart. A whole cluster's heartbeats then arrive within a fraction of
// each interval and queue behind each other.
//
// Spread uniformly instead, they leave relays no frames to batch: a relay
// carrying a thousand agents sees one heartbeat a millisecond and sends
// one or two per message to the controller, so relays and controller spend
// their CPU per message. So the interval is cut into slots of
// beatSlot, each agent heartbeats at the start of its slot by the wall
// clock, and the agents sharing a slot (a hundredth of the cluster at a
// 1 s interval) arrive together, a batch for each relay; on clocks not in
// sync (no NTP) the slots are as random as the draw.
//
// The first heartbeat is within one interval of the registration, which
// is all the controller's liveness clock counts on, and each later one an
// interval after the one before.
type Beat struct {
	t        *time.Timer
	next     time.Time
	interval time.Duration
	slot     time.Duration
}

// beatSlot is the width of a heartbeat slot. A slot's heartbeats queue
// behind each other at a relay and at the controller: at wire.MaxNodes
// and a 1 s interval a slot holds 100, a few milliseconds of work.
const beatSlot = 10 * time.Millisecond

// NewBeat starts a schedule of period interval (> 0).
func NewBeat(interval time.Duration) *Beat {
	slots := max(int64(interval/beatSlot), 1)
	b := &Beat{interval: interval, slot: time.Duration(rand.Int64N(slots)) * (interval / time.Duration(slots))}
	now := time.Now()
	b.next = nextBeat(time.Time{}, now, interval, b.slot)
	b.t = time.NewTimer(b.next.Sub(now))
	return b
}

// C delivers each heartbeat's time; call Next after each.
func (b *Beat) C() <-chan time.Time { return b.t.C }

// Next schedules the heartbeat after the one C delivered.
func (b *Beat) Next() {
	now := time.Now()
	b.next = nextBeat(b.next, now, b.interval, b.slot)
	b.t.Reset(b.next.Sub(now))
}

// Stop stops the schedule.
func (b *Beat) Stop() { b.t.Stop() }

// nextBeat is the heartbeat after the one due at last (zero for the
// first): the first time after now that is slot past a multiple of
// interval by the wall clock, within one interval of now. Heartbeats a
// stalled process missed are not made up (a burst helps nobody), like a
// ticker's, and a clock stepped by NTP moves the schedule with it. The
// timer runs on the monotonic clock: while NTP slews the wall clock it
// can fire a hair before last by the wall clock, which must not make the
// same slot due twice.
func nextBeat(last, now time.Time, interval, slot time.Duration) time.Time {
	if early := last.Sub(now); early > 0 && early < beatSlot {
		now = last
	}
	next := now.Truncate(interval).Add(slot)
	if !next.After(now) {
		next = next.Add(interval)
	}
	return next
}
