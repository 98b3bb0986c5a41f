package health

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLeaseAgrees: an agent that stops running (SIGSTOP, a frozen cgroup,
// a stall) at any point of its timeline, for any length, has its workers
// killed by their shims' lease no later than the controller's bound for
// the node it then declares lost, for every configuration the controller
// accepts, with none, one or two watchers, heard by this leader or by the
// one before. The agent heartbeats every interval, each acknowledged a
// round trip later; probes its watched peers every WatchEvery; renews the
// lease on every fence check and every acknowledgement. Stalled, it does
// nothing; its watchers' probes fail from the stall on (watchRounds, as
// for a cut). The shim checks the lease every LeaseCheckEvery from its own
// phase.
//
// The same cases are run against the rule before leases, SelfFence alone,
// which kills the workers only once the agent runs again: the first case
// it fails is printed. It fails whenever the stall outlasts the bound.
func TestLeaseAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	stalls := func(h Heartbeat) []time.Duration {
		return []time.Duration{FenceCheckEvery, h.Interval / 2, h.Interval, h.QuickSilence(), h.Timeout, 2 * h.Timeout, max(h.Vouched, h.Timeout) + time.Minute, 24 * time.Hour}
	}
	var oldFails int
	var counterexample string
	checked := 0
	for _, h := range fencingConfigs(rng) {
		tick := max(h.Interval/2, 50*time.Millisecond)
		for _, watchers := range []int{0, 1, 2} {
			for _, heard := range []bool{true, false} {
				for phase := range 8 {
					for _, outage := range []time.Duration{0, 2 * h.Interval, h.Timeout, max(h.Vouched, h.Timeout) / 2} {
						for _, stall := range stalls(h) {
							name := fmt.Sprintf("%+v, %d watchers, heard %t, controller out for %s before, stall %s", h, watchers, heard, outage, stall)
							c := stallCase(h, watchers, heard, time.Duration(phase)*h.Interval/8, outage, stall, tick, rng)
							if !c.lost {
								continue
							}
							require.False(t, c.leaseGone.After(c.bound), "%s: workers gone at %s under the lease, after the controller's bound %s (stall from %s, last heard %s)",
								name, c.leaseGone.Sub(t0), c.bound.Sub(t0), c.stalled.Sub(t0), c.heard.Sub(t0))
							checked++
							if c.oldGone.After(c.bound) {
								// The first, or the issue's: a {2,3} job, heartbeat every
								// second, timeout 3s, stalled for 2 timeouts.
								if oldFails == 0 || (h.Interval == time.Second && h.Timeout == 3*time.Second && watchers == 2 && heard && outage == 0 && stall == 2*h.Timeout && phase == 4) {
									counterexample = fmt.Sprintf("%s: stalled at %s, declared lost at %s, the controller may commit at %s; SelfFence alone kills the workers at %s, %s after it; the lease at %s",
										name, c.stalled.Sub(t0), c.at.Sub(t0), c.bound.Sub(t0), c.oldGone.Sub(t0), c.oldGone.Sub(c.bound), c.leaseGone.Sub(t0))
								}
								oldFails++
							}
						}
					}
				}
			}
		}
	}
	require.Positive(t, oldFails, "the rule without leases never failed: the model no longer shows why leases are needed")
	t.Logf("%d cases where the node is lost; SelfFence alone fails %d of them, e.g. %s", checked, oldFails, counterexample)
}

// stalled is one run of the stall model.
type stalled struct {
	// lost: the controller declared the node lost at at, bound being the
	// fencing deadline it then computed.
	lost      bool
	at, bound time.Time
	// stalled is when the agent stopped, heard its last word from the
	// controller as of then.
	stalled, heard time.Time
	// leaseGone and oldGone are when the workers are gone under the lease
	// and under SelfFence alone.
	leaseGone, oldGone time.Time
}

// stallCase runs the agent's timeline until it stops at phase into a
// heartbeat interval, a few intervals in, for stall; no controller has
// heard it for outage by then (a failover, a relay cut), while its
// watchers still reach it.
func stallCase(h Heartbeat, watchers int, heard bool, phase, outage, stall, tick time.Duration, rng *rand.Rand) stalled {
	rtt := time.Duration(rng.Int64N(int64(min(h.Interval, WatchEvery))))
	start := t0
	stop := start.Add(3*h.Interval + outage + phase)
	// The agent's last heartbeat a controller received before the stall,
	// and the latest acked.
	var lastSent, lastHeard time.Time
	for beat := start; beat.Before(stop.Add(-outage)); beat = beat.Add(h.Interval) {
		lastSent = beat
		if !beat.Add(rtt).After(stop.Add(-outage)) {
			lastHeard = beat
		}
	}
	// The latest answer from every watched peer (probes every WatchEvery).
	var answered time.Time
	if watchers > 0 {
		for round := start.Add(time.Duration(rng.Int64N(int64(WatchEvery)))); !round.Add(rtt).After(stop); round = round.Add(WatchEvery) {
			answered = round.Add(rtt)
		}
	}
	// The last lease granted: at the last fence check or acknowledgement
	// before the stall, both of which see the same state by then.
	lease := h.LeaseUntil(lastHeard, answered, watchers > 0)
	// The controller received the last heartbeat half a round trip after it
	// was sent; a new leader elected since has not heard it.
	seen := lastSent.Add(rtt / 2)
	elected := t0
	if !heard {
		elected = seen.Add(time.Duration(rng.Int64N(int64(h.Interval + outage))))
	}
	// No peer reports it unreachable before it stops: gossip's own word
	// comes later still than its watchers'.
	reported := stop
	for range watchers {
		reported = later(reported, watchRounds(stop, rng, false).Add(time.Duration(rng.Int64N(int64(300*time.Millisecond)))))
	}
	s := Silence{LastSeen: seen, Peers: Peers{Unreachable: max(watchers, 1)}}
	at, ok := lostAt(h, s, tick)
	if !ok {
		return stalled{}
	}
	at = later(at, reported)
	resume := stop.Add(stall)
	if !resume.After(at) {
		// Back before it was declared lost: its next heartbeat comes in
		// time.
		return stalled{}
	}
	loss := Loss{At: at, LastSeen: seen, Heard: heard, ElectedAt: elected, Gossips: true, Unreachable: true}
	if watchers > 0 {
		loss.WatchersCut = reported
	}
	c := stalled{lost: true, at: at, bound: h.FencedBy(loss), stalled: stop, heard: lastHeard}
	// The shim's checks, from its own phase.
	check := t0.Add(time.Duration(rng.Int64N(int64(LeaseCheckEvery))))
	for check.Before(lease) {
		check = check.Add(LeaseCheckEvery)
	}
	c.leaseGone = check.Add(LeaseDrain + fenceKill)
	// SelfFence alone: the agent's first check once it runs again.
	first := resume.Add(time.Duration(rng.Int64N(int64(FenceCheckEvery))))
	for check := first; ; check = check.Add(FenceCheckEvery) {
		if h.SelfFence(check.Sub(lastHeard), Cutoff{Isolated: true, Unwatched: watchers > 0}) {
			c.oldGone = check.Add(fenceKill)
			break
		}
	}
	c.leaseGone = earliest(c.leaseGone, c.oldGone)
	return c
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// TestLeaseUntil: the lease of a healthy agent outlasts the next renewal;
// its terms, each a bound of FencedBy's.
func TestLeaseUntil(t *testing.T) {
	h := Heartbeat{Interval: time.Second, Timeout: 3 * time.Second, Vouched: 9 * time.Second}
	heard := t0
	margin := FenceMargin - LeaseCheckEvery - LeaseDrain - fenceKill
	tests := []struct {
		name     string
		answered time.Time
		watching bool
		want     time.Time
	}{
		{"no watchers: no quick rule, the heartbeat timeout", time.Time{}, false, heard.Add(3*time.Second + margin)},
		{"watchers, none answered yet: the quick silence", time.Time{}, true, heard.Add(1500*time.Millisecond + margin)},
		{"watchers answered lately: the isolation lag after that", heard.Add(1200 * time.Millisecond), true, heard.Add(1200*time.Millisecond + reportLag + IsolationLag + margin)},
		{"watchers answered long ago: the quick silence", heard.Add(-time.Second), true, heard.Add(1500*time.Millisecond + margin)},
		{"watchers answer through a controller outage: up to the vouched timeout", heard.Add(8 * time.Second), true, heard.Add(8*time.Second + reportLag + IsolationLag + margin)},
		{"never past the vouched timeout", heard.Add(10 * time.Second), true, heard.Add(9*time.Second + margin)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, h.LeaseUntil(heard, tt.answered, tt.watching))
		})
	}
	require.True(t, Heartbeat{}.LeaseUntil(heard, heard, true).IsZero(), "no timeout: no lease")
}

// TestLeaseRenews: a renewal counts if the lease held when it was sent,
// whenever it is read; never if it was sent after the lapse or, of unknown
// age, read after it.
func TestLeaseRenews(t *testing.T) {
	const lease = 10 * time.Second
	tests := []struct {
		name        string
		lease, sent time.Duration
		now         time.Duration
		want        bool
	}{
		{"no lease to hold", 0, 0, 11 * time.Second, true},
		{"read in time", lease, 9 * time.Second, 9 * time.Second, true},
		{"read in time, age unknown", lease, 0, 9 * time.Second, true},
		{"sent in time, read late", lease, 9 * time.Second, 12 * time.Second, true},
		{"sent as it lapsed", lease, lease, 12 * time.Second, false},
		{"sent after the lapse", lease, 11 * time.Second, 12 * time.Second, false},
		{"age unknown, read late", lease, 0, 12 * time.Second, false},
		{"read as it lapses", lease, 0, lease, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, LeaseRenews(tt.lease, tt.sent, tt.now))
		})
	}
}
