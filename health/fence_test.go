package health

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSelfFence(t *testing.T) {
	h := Heartbeat{Interval: time.Second, Timeout: 5 * time.Second, Vouched: time.Minute}
	tests := []struct {
		name     string
		silent   time.Duration
		isolated bool
		want     bool
	}{
		{"cut off while training", 6 * time.Second, true, true},
		{"controller down but peers reachable: keep training", 6 * time.Second, false, false},
		{"no controller for a while (failover, etcd quorum lost): keep training", 59 * time.Second, false, false},
		{"the controller gave up on us even though peers vouch", 61 * time.Second, false, true},
		{"briefly silent controller", 3 * time.Second, true, false},
		{"exactly the timeout is not past it", 5 * time.Second, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, h.SelfFence(tt.silent, tt.isolated))
		})
	}
	require.False(t, Heartbeat{}.SelfFence(time.Hour, true), "no timeout known: never fence")
}

func TestSelfFenceDeadline(t *testing.T) {
	h := Heartbeat{Interval: time.Second, Timeout: 5 * time.Second, Vouched: time.Minute}
	require.Equal(t, 5*time.Second+FenceMargin, h.SelfFenceDeadline(true))
	require.Equal(t, time.Minute+FenceMargin, h.SelfFenceDeadline(false))
	require.Equal(t, time.Second, FenceMargin, "the controller has always allowed a second for the check and the kill")
}

func TestOrphanTimeout(t *testing.T) {
	require.Equal(t, 4*time.Second, Unregistered.OrphanTimeout())
	require.Equal(t, 900*time.Millisecond, Heartbeat{Interval: 100 * time.Millisecond, Timeout: time.Second}.OrphanTimeout())
	require.Equal(t, time.Second, Heartbeat{Interval: time.Second, Timeout: 2 * time.Second}.OrphanTimeout(), "never under an interval")
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
			loss: Loss{At: seen.Add(2500 * time.Millisecond), LastSeen: seen, Heard: true, ElectedAt: elected, Confirmed: true},
			want: seen.Add(6 * time.Second),
		},
		{
			name: "timed out: it fences after the heartbeat timeout, at the latest a margin after we decided",
			loss: Loss{At: seen.Add(5100 * time.Millisecond), LastSeen: seen, Heard: true, ElectedAt: elected},
			want: seen.Add(6100 * time.Millisecond),
		},
		{
			name: "lost after peers vouched: by then it has fenced",
			loss: Loss{At: seen.Add(61 * time.Second), LastSeen: seen, Heard: true, ElectedAt: elected},
			want: seen.Add(62 * time.Second),
		},
		{
			name: "not heard by this leader, confirmed: the heartbeat timeout from the election",
			loss: Loss{At: seen.Add(2500 * time.Millisecond), LastSeen: seen, ElectedAt: elected, Confirmed: true},
			want: seen.Add(6 * time.Second),
		},
		{
			name: "not heard by this leader, unconfirmed: the vouched timeout from the election",
			loss: Loss{At: seen.Add(15 * time.Second), LastSeen: seen, ElectedAt: elected},
			want: elected.Add(61 * time.Second),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, h.FencedBy(tt.loss))
		})
	}
}
