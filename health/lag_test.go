package health

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLagWindow(t *testing.T) {
	type obs struct {
		at  time.Duration // after t0
		lag time.Duration
	}
	tests := []struct {
		name string
		obs  []obs
		at   time.Duration
		want time.Duration
	}{
		{name: "nothing seen", at: time.Second, want: 0},
		{name: "the largest in the window", obs: []obs{{0, time.Second}, {time.Second, 3 * time.Second}, {2 * time.Second, 2 * time.Second}}, at: 2 * time.Second, want: 3 * time.Second},
		{name: "a sample lasts the window", obs: []obs{{0, 4 * time.Second}}, at: 5 * time.Second, want: 4 * time.Second},
		{name: "then it is forgotten", obs: []obs{{0, 4 * time.Second}}, at: 5*time.Second + time.Millisecond, want: 0},
		{name: "a smaller later one outlasts a larger earlier one", obs: []obs{{0, 4 * time.Second}, {3 * time.Second, time.Second}}, at: 6 * time.Second, want: time.Second},
		{name: "no lag is not a sample", obs: []obs{{0, time.Second}, {time.Second, 0}, {2 * time.Second, -time.Second}}, at: 5 * time.Second, want: time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewLagWindow(5 * time.Second)
			for _, o := range tt.obs {
				w.Observe(t0.Add(o.at), o.lag)
			}
			require.Equal(t, tt.want, w.Max(t0.Add(tt.at)))
		})
	}
}

// However many samples, the window keeps only those that can still be its
// maximum.
func TestLagWindowStaysSmall(t *testing.T) {
	w := NewLagWindow(time.Hour)
	for i := range 10000 {
		w.Observe(t0.Add(time.Duration(i)*time.Millisecond), time.Duration(10000-i%100)*time.Millisecond)
	}
	require.LessOrEqual(t, len(w.samples), 100)
	require.Equal(t, 10*time.Second, w.Max(t0.Add(10*time.Second)))
}

func TestLagCredit(t *testing.T) {
	h := Heartbeat{Interval: time.Second, Timeout: 5 * time.Second, Vouched: 15 * time.Second}
	for _, tt := range []struct{ lag, want time.Duration }{
		{0, 0},
		{-time.Second, 0},
		{3 * time.Second, 3 * time.Second},
		{time.Minute, 10 * time.Second},
	} {
		require.Equal(t, tt.want, h.LagCredit(tt.lag), "lag %s", tt.lag)
	}
	require.Zero(t, Heartbeat{Interval: time.Second, Timeout: 5 * time.Second, Vouched: 5 * time.Second}.LagCredit(time.Second), "no room above the timeout: no credit")
}
