package health

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSelfFence(t *testing.T) {
	h := Heartbeat{Interval: time.Second, Timeout: 5 * time.Second, Vouched: time.Minute}
	isolated := Cutoff{Isolated: true}
	unwatched := Cutoff{Isolated: true, Unwatched: true}
	tests := []struct {
		name   string
		silent time.Duration
		cutoff Cutoff
		want   bool
	}{
		{"cut off while training", 6 * time.Second, isolated, true},
		{"controller down but peers reachable: keep training", 6 * time.Second, Cutoff{}, false},
		{"no controller for a while (failover, etcd quorum lost): keep training", 59 * time.Second, Cutoff{}, false},
		{"the controller gave up on us even though peers vouch", 61 * time.Second, Cutoff{}, true},
		{"briefly silent controller", 3 * time.Second, isolated, false},
		{"exactly the timeout is not past it", 5 * time.Second, isolated, false},
		{"cut off from the watched peers and silent past the quick silence", 1600 * time.Millisecond, unwatched, true},
		{"cut off from the watched peers, a heartbeat merely late", 1500 * time.Millisecond, unwatched, false},
		{"silent past the quick silence, watched peers answer", 1600 * time.Millisecond, isolated, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, h.SelfFence(tt.silent, tt.cutoff))
		})
	}
	require.False(t, Heartbeat{}.SelfFence(time.Hour, unwatched), "no timeout known: never fence")
}

func TestQuickSilence(t *testing.T) {
	require.Equal(t, 1500*time.Millisecond, Heartbeat{Interval: time.Second, Timeout: 5 * time.Second}.QuickSilence())
	require.Equal(t, 2*time.Second, Heartbeat{Interval: 2 * time.Second, Timeout: 2 * time.Second}.QuickSilence(), "never past the timeout")
}

func TestSelfFenceDeadline(t *testing.T) {
	h := Heartbeat{Interval: time.Second, Timeout: 5 * time.Second, Vouched: time.Minute}
	require.Equal(t, 5*time.Second+FenceMargin, h.SelfFenceDeadline(true))
	require.Equal(t, time.Minute+FenceMargin, h.SelfFenceDeadline(false))
	require.Equal(t, FenceCheckEvery+fenceKill, FenceMargin, "a check interval and the kill")
}

func TestOrphanTimeout(t *testing.T) {
	require.Equal(t, 500*time.Millisecond, Unregistered.OrphanTimeout())
	require.Equal(t, 50*time.Millisecond, Heartbeat{Interval: 100 * time.Millisecond, Timeout: time.Second}.OrphanTimeout())
	require.Equal(t, 500*time.Millisecond, Heartbeat{Interval: time.Second, Timeout: 2 * time.Second}.OrphanTimeout())
}

func TestFencedBy(t *testing.T) {
	h := Heartbeat{Interval: time.Second, Timeout: 5 * time.Second, Vouched: time.Minute}
	elected := t0
	seen := t0.Add(10 * time.Second)
	tests := []struct {
		name string
		loss Loss
		want time.Time
	}{
		{
			name: "confirmed by peers: the heartbeat timeout from its last heartbeat",
			loss: Loss{At: seen.Add(2500 * time.Millisecond), LastSeen: seen, Heard: true, ElectedAt: elected, Gossips: true, Unreachable: true},
			want: seen.Add(5*time.Second + FenceMargin),
		},
		{
			name: "no gossip: it fences after the heartbeat timeout, at the latest a margin after we decided",
			loss: Loss{At: seen.Add(5100 * time.Millisecond), LastSeen: seen, Heard: true, ElectedAt: elected},
			want: seen.Add(5100*time.Millisecond + FenceMargin),
		},
		{
			name: "lost after peers vouched: by then it has fenced",
			loss: Loss{At: seen.Add(61 * time.Second), LastSeen: seen, Heard: true, ElectedAt: elected, Gossips: true},
			want: seen.Add(61*time.Second + FenceMargin),
		},
		{
			// Found disagreeing: this was seen+6s, but an agent whose peers
			// all lost the controller too still reaches them, so it trains
			// on until the vouched timeout.
			name: "timed out with nobody to say: it may still reach its peers",
			loss: Loss{At: seen.Add(5100 * time.Millisecond), LastSeen: seen, Heard: true, ElectedAt: elected, Gossips: true},
			want: seen.Add(time.Minute + FenceMargin),
		},
		{
			// Found disagreeing (TestQuickFencingAgrees): this was a margin
			// after the declaration, but the peer's word may have come just
			// before it, and the node's own probes fail up to IsolationLag
			// after the peer's.
			name: "timed out, and its only peer cannot reach it (a peer without peers is no voter)",
			loss: Loss{At: seen.Add(5100 * time.Millisecond), LastSeen: seen, Heard: true, ElectedAt: elected, Gossips: true, Unreachable: true},
			want: seen.Add(5100*time.Millisecond + IsolationLag + FenceMargin),
		},
		{
			name: "not heard by this leader, confirmed: the heartbeat timeout from the election",
			loss: Loss{At: seen.Add(2500 * time.Millisecond), LastSeen: seen, ElectedAt: elected, Gossips: true, Unreachable: true},
			want: seen.Add(5*time.Second + FenceMargin),
		},
		{
			name: "not heard by this leader, unconfirmed: the vouched timeout from the election",
			loss: Loss{At: seen.Add(15 * time.Second), LastSeen: seen, ElectedAt: elected, Gossips: true},
			want: elected.Add(time.Minute + FenceMargin),
		},
		{
			// After the start-up grace; without gossip it fenced long since.
			name: "not heard by this leader, no gossip: the heartbeat timeout from the election",
			loss: Loss{At: elected.Add(16 * time.Second), LastSeen: elected.Add(time.Second), ElectedAt: elected},
			want: elected.Add(16*time.Second + FenceMargin),
		},
		{
			// Found disagreeing: this was the end of the hold plus a second,
			// but an agent back in time that has not reached a controller
			// runs the workers it adopted for Unregistered's timeout.
			name: "lost after a restart hold: a new agent may have adopted the workers",
			loss: Loss{At: seen.Add(15 * time.Second), LastSeen: seen, Heard: true, ElectedAt: elected, HoldUntil: seen.Add(15 * time.Second), Gossips: true, Unreachable: true},
			want: seen.Add(20*time.Second + FenceMargin),
		},
		{
			name: "its watchers report it: the isolation lag after the last of them began",
			loss: Loss{At: seen.Add(1300 * time.Millisecond), LastSeen: seen, Heard: true, ElectedAt: elected, Gossips: true, Unreachable: true,
				WatchersCut: seen.Add(1200 * time.Millisecond)},
			want: seen.Add(1200*time.Millisecond + IsolationLag + FenceMargin),
		},
		{
			name: "its watchers reported it early: the quick silence from its last heartbeat",
			loss: Loss{At: seen.Add(1300 * time.Millisecond), LastSeen: seen, Heard: true, ElectedAt: elected, Gossips: true, Unreachable: true,
				WatchersCut: seen.Add(100 * time.Millisecond)},
			want: seen.Add(1500*time.Millisecond + FenceMargin),
		},
		{
			name: "its watchers reported it after the heartbeat timeout: no sooner than the usual bound",
			loss: Loss{At: seen.Add(9 * time.Second), LastSeen: seen, Heard: true, ElectedAt: elected, Gossips: true, Unreachable: true,
				WatchersCut: seen.Add(8 * time.Second)},
			want: seen.Add(9*time.Second + FenceMargin),
		},
		{
			name: "its watchers report it, but it may be back from a restart hold",
			loss: Loss{At: seen.Add(15 * time.Second), LastSeen: seen, Heard: true, ElectedAt: elected, HoldUntil: seen.Add(15 * time.Second), Gossips: true, Unreachable: true,
				WatchersCut: seen.Add(14 * time.Second)},
			want: seen.Add(20*time.Second + FenceMargin),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, h.FencedBy(tt.loss))
		})
	}
}

// TestFencingAgrees: for every configuration the controller accepts
// (interval > 0, timeout >= 2 intervals, vouched >= timeout) and every way
// a node can be declared lost, the agent's self-fencing, as its own rule
// decides it, has killed the workers no later than the controller's bound.
// The controller's side is simulated with Liveness on its liveness ticks
// (every half interval, at least 50ms); the agent's with SelfFence on its
// checks (every FenceCheckEvery, at any phase), plus fenceKill for the
// kill itself. The agent's last word from the controller is taken as late
// as it can be: LastSeen if this leader heard it; the election if not (the
// previous leader acknowledged it last); the end of the hold for an agent
// back from a restart that has not reached a controller yet.
//
// Not covered, because the controller cannot know it (see
// docs/recovery.md, "What rdzv detects"): a gossip partition that leaves the peers the
// controller hears on the smaller side, so that their word that a node is
// unreachable does not make it isolated.
func TestFencingAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	configs := fencingConfigs(rng)

	type evidence struct {
		name        string
		peers       Peers
		gossips     bool
		unreachable bool
	}
	evidences := []evidence{
		{name: "no gossip"},
		{name: "peers confirm", peers: Peers{Unreachable: 1, Vouching: 1}, gossips: true, unreachable: true},
		{name: "peers vouch", peers: Peers{Vouching: 2}, gossips: true},
		{name: "nobody to say", gossips: true},
		{name: "a peer without peers cannot reach it", gossips: true, unreachable: true},
	}
	checked := 0
	for _, h := range configs {
		tick := max(h.Interval/2, 50*time.Millisecond)
		for _, ev := range evidences {
			// What the agent may count itself, given what the controller saw.
			isolations := []bool{true}
			if ev.gossips && !ev.unreachable {
				isolations = []bool{true, false}
			}
			for _, heard := range []bool{true, false} {
				for _, hold := range []time.Duration{0, time.Second, 15 * time.Second, 5 * time.Minute} {
					elected := t0
					seen := t0.Add(time.Duration(rng.Int64N(int64(3 * time.Second))))
					// An overloaded controller declares the node later.
					lag := []time.Duration{0, h.Interval, time.Hour}[rng.IntN(3)]
					s := Silence{LastSeen: seen, Peers: ev.peers, Lag: lag, Registering: rng.IntN(2) == 0}
					if hold > 0 {
						s.HoldUntil = seen.Add(hold)
					}
					if !heard {
						s.GraceUntil = seen.Add(h.Timeout + 10*time.Second)
					}
					at, ok := lostAt(h, s, tick)
					require.True(t, ok, "%+v %s: never lost", h, ev.name)
					loss := Loss{At: at, LastSeen: seen, Heard: heard, ElectedAt: elected, HoldUntil: s.HoldUntil, Gossips: ev.gossips, Unreachable: ev.unreachable}
					bound := h.FencedBy(loss)
					for _, isolated := range isolations {
						name := fmt.Sprintf("%+v, %s, heard %t, hold %s, isolated %t", h, ev.name, heard, hold, isolated)
						last := seen
						if !heard {
							last = elected
						}
						require.False(t, killedAt(h, last, isolated, rng).After(bound), "%s: the agent fences after the controller's bound %s", name, bound)
						if hold > 0 {
							// An agent back from its restart, alone in its gossip.
							require.False(t, killedAt(Unregistered, s.HoldUntil, true, rng).After(bound), "%s: an adopting agent fences after the bound", name)
						}
						checked++
					}
					if heard && hold == 0 {
						// A crash silenced it: the last heartbeat came less
						// than an interval before, the shims kill the workers
						// the orphan timeout after the crash.
						crash := seen.Add(h.Interval)
						require.False(t, crash.Add(h.OrphanTimeout()+fenceKill).After(bound), "%+v, %s: crashed agent's workers outlive the bound", h, ev.name)
					}
				}
			}
		}
	}
	t.Logf("%d configurations, %d cases", len(configs), checked)
}

// fencingConfigs is every configuration the controller accepts (interval >
// 0, timeout >= 2 intervals, vouched >= timeout) on a grid, 300 random
// ones, and Unregistered.
func fencingConfigs(rng *rand.Rand) []Heartbeat {
	var configs []Heartbeat
	for _, interval := range []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, time.Second, 3 * time.Second} {
		for _, timeouts := range []int64{2, 3, 5, 10, 30} {
			for _, vouched := range []float64{1, 1.5, 3, 12} {
				timeout := time.Duration(timeouts) * interval
				configs = append(configs, Heartbeat{Interval: interval, Timeout: timeout, Vouched: time.Duration(float64(timeout) * vouched)})
			}
		}
	}
	for range 300 {
		interval := time.Duration(1+rng.IntN(5000)) * time.Millisecond
		timeout := 2*interval + time.Duration(rng.Int64N(int64(20*interval)))
		configs = append(configs, Heartbeat{Interval: interval, Timeout: timeout, Vouched: timeout + time.Duration(rng.Int64N(int64(10*timeout)))})
	}
	return append(configs, Unregistered)
}

// lostAt runs the controller's liveness ticks from the node's last
// heartbeat until it is declared lost.
func lostAt(h Heartbeat, s Silence, tick time.Duration) (time.Time, bool) {
	limit := s.LastSeen.Add(max(h.Vouched, h.Timeout) + h.LagCredit(s.Lag+h.Timeout) + 10*time.Minute)
	for now := s.LastSeen.Add(tick); now.Before(limit); now = now.Add(tick) {
		if h.Liveness(now, s).Verdict == Lost {
			return now, true
		}
	}
	return time.Time{}, false
}

// killedAt is when an agent that last heard the controller at last, and
// stays cut off, has killed its workers: at its first check, from a random
// phase, where SelfFence says so, plus the kill.
func killedAt(h Heartbeat, last time.Time, isolated bool, rng *rand.Rand) time.Time {
	check := last.Add(time.Duration(rng.Int64N(int64(FenceCheckEvery))))
	for !h.SelfFence(check.Sub(last), Cutoff{Isolated: isolated}) {
		check = check.Add(FenceCheckEvery)
	}
	return check.Add(fenceKill)
}

// TestQuickFencingAgrees: an agent cut off from every peer it watches
// fences by the controller's bound for a node all of whose watchers report
// it unreachable, for every configuration the controller accepts and any
// timing of the cut, of both sides' probe rounds and of the reports'
// delivery. Each link to a watcher breaks at its own time, possibly before
// the node's last heartbeat (its peers were cut off first). Both sides
// probe as the agent does (watchRounds); the watcher as early as it can,
// the node as late. The first watcher's word may declare the node lost
// before the others' comes (the controller then tightens the bound); then
// the links break at once (one fault, which each watcher sees at its own
// pace): a node cut off from one watcher and not yet from the other, and
// declared lost then, counts itself isolated only by gossip's word, which
// docs/recovery.md ("What rdzv detects") says is assumed, not known.
func TestQuickFencingAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	worstLag := time.Duration(0)
	checked := 0
	for _, h := range fencingConfigs(rng) {
		tick := max(h.Interval/2, 50*time.Millisecond)
		for _, watchers := range []int{1, 2} {
			for _, heard := range []bool{true, false} {
				for range 10 {
					elected := t0
					seen := t0.Add(time.Duration(rng.Int64N(int64(3 * time.Second))))
					last := seen
					if !heard {
						last = elected
					}
					early := rng.IntN(2) == 0
					cut := seen.Add(time.Duration(rng.Int64N(int64(4*h.Interval))) - h.Interval)
					var first, reported, isolated time.Time
					for range watchers {
						if !early {
							cut = seen.Add(time.Duration(rng.Int64N(int64(4*h.Interval))) - h.Interval)
						}
						knows := watchRounds(cut, rng, false).Add(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
						if first.IsZero() || knows.Before(first) {
							first = knows
						}
						reported = later(reported, knows)
						isolated = later(isolated, watchRounds(cut, rng, true))
					}
					worstLag = max(worstLag, isolated.Sub(reported))
					s := Silence{LastSeen: seen, Peers: Peers{Unreachable: watchers}, Lag: []time.Duration{0, h.Interval}[rng.IntN(2)]}
					at, ok := lostAt(h, s, tick)
					require.True(t, ok, "%+v: never lost", h)
					declared := later(at, reported)
					if early {
						declared = later(at, first)
					}
					loss := Loss{At: declared, LastSeen: seen, Heard: heard, ElectedAt: elected, Gossips: true, Unreachable: true, WatchersCut: reported}
					bound := h.FencedBy(loss)
					killed := killedOnceCut(h, last, isolated, rng)
					require.False(t, killed.After(bound), "%+v, %d watchers, heard %t: the agent fences at %s, after the controller's bound %s (cut off from its watched peers at %s, last reported %s)",
						h, watchers, heard, killed.Sub(t0), bound.Sub(t0), isolated.Sub(t0), reported.Sub(t0))
					checked++
					if heard {
						// The agent crashed instead, before its next
						// heartbeat, its gossip with it: its watchers
						// report it as soon as they can; its shims kill
						// the workers the orphan timeout after the crash.
						crash := seen.Add(time.Duration(rng.Int64N(int64(h.Interval))))
						reported = time.Time{}
						for range watchers {
							reported = later(reported, watchRounds(crash, rng, false))
						}
						at, ok := lostAt(h, Silence{LastSeen: seen, Peers: Peers{Unreachable: watchers}}, tick)
						require.True(t, ok)
						bound := h.FencedBy(Loss{At: later(at, reported), LastSeen: seen, Heard: true, ElectedAt: elected, Gossips: true, Unreachable: true, WatchersCut: reported})
						gone := crash.Add(h.OrphanTimeout() + fenceKill)
						require.False(t, gone.After(bound), "%+v, %d watchers: a crashed agent's workers are gone at %s, after the controller's bound %s (last heartbeat %s, crash %s, reported %s)",
							h, watchers, gone.Sub(t0), bound.Sub(t0), seen.Sub(t0), crash.Sub(t0), reported.Sub(t0))
						checked++
					}
				}
			}
		}
	}
	require.LessOrEqual(t, worstLag, IsolationLag)
	t.Logf("%d cases; a node knew it was cut off at worst %s after its watchers' word (IsolationLag %s)", checked, worstLag, IsolationLag)
}

// watchRounds is when a prober knows that a peer whose link broke at cut
// is unreachable: at the end of its WatchFailures-th failing round in a
// row. Rounds begin on ticks WatchEvery apart, from a random phase; a
// round fails if its answer, a random round trip under a tick after it
// began, would come after the cut, and then ends WatchTimeout after it
// began. The next round begins at the next tick, or at once if lazy is
// false: the ticker keeps the tick that came during the round.
func watchRounds(cut time.Time, rng *rand.Rand, lazy bool) time.Time {
	rtt := time.Duration(rng.Int64N(int64(WatchEvery)))
	start := cut.Add(-WatchEvery - time.Duration(rng.Int64N(int64(WatchEvery))))
	for !start.Add(rtt).After(cut) {
		start = start.Add(WatchEvery)
	}
	for failed := 1; ; failed++ {
		end := start.Add(WatchTimeout)
		if failed == WatchFailures {
			return end
		}
		next := end
		if lazy {
			for next = start; !next.After(end); next = next.Add(WatchEvery) {
			}
		}
		start = next
	}
}

// killedOnceCut is when an agent that last heard the controller at last,
// and is cut off from every peer it watches from cut on, has killed its
// workers: at its first check, from a random phase, where SelfFence says
// so, plus the kill.
func killedOnceCut(h Heartbeat, last, cut time.Time, rng *rand.Rand) time.Time {
	check := last.Add(time.Duration(rng.Int64N(int64(FenceCheckEvery))))
	for {
		off := !check.Before(cut)
		if h.SelfFence(check.Sub(last), Cutoff{Isolated: off, Unwatched: off}) {
			return check.Add(fenceKill)
		}
		check = check.Add(FenceCheckEvery)
	}
}
