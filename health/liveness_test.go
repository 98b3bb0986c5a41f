package health

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func TestLiveness(t *testing.T) {
	h := Heartbeat{Interval: time.Second, Timeout: 5 * time.Second, Vouched: 15 * time.Second}
	peers := func(unreachable, vouching int) Peers { return Peers{Unreachable: unreachable, Vouching: vouching} }
	tests := []struct {
		name      string
		silent    time.Duration
		peers     Peers
		held      bool // by a restart hold that outlasts the silence
		grace     bool // in a new leader's start-up grace
		lag       time.Duration
		reg       bool // heard only its registration so far
		late      time.Duration
		doubted   bool
		want      Verdict
		confirmed bool
	}{
		{name: "heartbeating", silent: 500 * time.Millisecond, peers: peers(0, 2), want: Alive},
		{name: "a heartbeat late by jitter is not enough even if a peer agrees", silent: 1200 * time.Millisecond, peers: peers(1, 1), want: Alive},
		{name: "peers confirm a silent node once a heartbeat is overdue", silent: 1250 * time.Millisecond, peers: peers(1, 1), want: Lost, confirmed: true},
		{name: "a late node's usual lateness is not enough even if a peer agrees", silent: 1800 * time.Millisecond, late: 450 * time.Millisecond, peers: peers(1, 1), want: Alive},
		{name: "peers confirm a late node silent past twice its lateness", silent: 1900 * time.Millisecond, late: 450 * time.Millisecond, peers: peers(1, 1), want: Lost, confirmed: true},
		{name: "a node late by less than an eighth interval keeps the quarter", silent: 1250 * time.Millisecond, late: 100 * time.Millisecond, peers: peers(1, 1), want: Lost, confirmed: true},
		{name: "lateness never extends the timeout", silent: 6 * time.Second, late: 3 * time.Second, peers: peers(1, 0), want: Lost},
		{name: "peers who took their word back are not believed", silent: 2 * time.Second, peers: peers(2, 0), doubted: true, want: Alive},
		{name: "a doubted node is still lost at the timeout", silent: 6 * time.Second, peers: peers(2, 0), doubted: true, want: Lost},
		{name: "silent within the timeout, nobody objects", silent: 4 * time.Second, want: Alive},
		{name: "timed out without gossip", silent: 6 * time.Second, want: Lost},
		{name: "timed out but peers reach it: controller-side trouble", silent: 6 * time.Second, peers: peers(0, 2), want: Suspect},
		{name: "peers' word lasts the vouched timeout", silent: 15 * time.Second, peers: peers(0, 2), want: Suspect},
		{name: "peers' word has a limit", silent: 16 * time.Second, peers: peers(0, 2), want: Lost},
		{name: "a dead vote beats vouchers", silent: 6 * time.Second, peers: peers(1, 2), want: Lost, confirmed: true},
		{name: "a restart hold spares it whatever its peers say", silent: time.Minute, peers: peers(3, 0), held: true, want: Spared},
		{name: "a restart hold spares a heartbeating node too", silent: 0, held: true, want: Spared},
		{name: "the start-up grace spares a timed-out node", silent: 6 * time.Second, grace: true, want: Spared},
		{name: "the start-up grace spares a vouched node", silent: 6 * time.Second, peers: peers(0, 2), grace: true, want: Spared},
		{name: "the start-up grace spares a heartbeating node", silent: 0, grace: true, want: Spared},
		{name: "the start-up grace gives way to peers' word", silent: 1500 * time.Millisecond, peers: peers(1, 0), grace: true, want: Lost, confirmed: true},
		{name: "the controller's own lag is not the node's silence", silent: 7 * time.Second, lag: 3 * time.Second, want: Alive},
		{name: "silent beyond the controller's lag", silent: 9 * time.Second, lag: 3 * time.Second, want: Lost},
		{name: "the lag extends the peers' word too", silent: 17 * time.Second, lag: 3 * time.Second, peers: peers(0, 2), want: Suspect},
		{name: "a node not heard since registering gets a second timeout", silent: 9 * time.Second, reg: true, want: Alive},
		{name: "and not more", silent: 11 * time.Second, reg: true, want: Lost},
		{name: "registering adds to the controller's lag", silent: 12 * time.Second, reg: true, lag: 2 * time.Second, want: Alive},
		{name: "the lag credit is bounded", silent: 16 * time.Second, lag: time.Minute, want: Lost},
		{name: "the lag does not outweigh peers that cannot reach it", silent: 2500 * time.Millisecond, lag: 3 * time.Second, peers: peers(1, 0), want: Lost, confirmed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := t0.Add(time.Hour)
			s := Silence{LastSeen: now.Add(-tt.silent), Peers: tt.peers, Lag: tt.lag, Registering: tt.reg, Late: tt.late, Doubted: tt.doubted}
			if tt.held {
				s.HoldUntil = now.Add(time.Second)
			}
			if tt.grace {
				s.GraceUntil = now.Add(time.Second)
			}
			got := h.Liveness(now, s)
			require.Equal(t, tt.want, got.Verdict, "got %s", got.Verdict)
			require.Equal(t, tt.confirmed, got.Confirmed)
			if tt.held {
				return
			}
			require.Equal(t, tt.silent, got.Silent)
		})
	}
}

// A hold or a grace that is over spares nothing.
func TestLivenessAfterHoldAndGrace(t *testing.T) {
	h := Heartbeat{Interval: time.Second, Timeout: 5 * time.Second, Vouched: 15 * time.Second}
	now := t0.Add(time.Hour)
	got := h.Liveness(now, Silence{LastSeen: now.Add(-time.Minute), HoldUntil: now, GraceUntil: now.Add(-time.Second)})
	require.Equal(t, Lost, got.Verdict)
	require.Equal(t, time.Minute, got.Silent)
}

func TestLearn(t *testing.T) {
	tests := []struct {
		name                     string
		interval, timeout, vouch time.Duration
		want                     Heartbeat
	}{
		{"everything sent", 100 * time.Millisecond, time.Second, 7 * time.Second, Heartbeat{100 * time.Millisecond, time.Second, 7 * time.Second}},
		{"no vouched timeout: a few heartbeat timeouts", 100 * time.Millisecond, time.Second, 0, Heartbeat{100 * time.Millisecond, time.Second, 3 * time.Second}},
		{"nothing sent: timeouts kept, default interval", 0, 0, 0, Heartbeat{time.Second, 2 * time.Second, 9 * time.Second}},
	}
	before := Heartbeat{Interval: 50 * time.Millisecond, Timeout: 2 * time.Second, Vouched: 9 * time.Second}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, before.Learn(tt.interval, tt.timeout, tt.vouch))
		})
	}
	require.Equal(t, Heartbeat{Interval: time.Second, Timeout: 5 * time.Second, Vouched: 15 * time.Second}, Unregistered)
}
