package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNextBeatIsTheAgentsSlotWithinOneInterval(t *testing.T) {
	second := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		now      time.Duration // after second
		interval time.Duration
		slot     time.Duration
		want     time.Duration // after second
	}{
		{"slot ahead in this interval", 100 * time.Millisecond, time.Second, 300 * time.Millisecond, 300 * time.Millisecond},
		{"slot passed: the next interval's", 400 * time.Millisecond, time.Second, 300 * time.Millisecond, 1300 * time.Millisecond},
		{"due now: the next one", 300 * time.Millisecond, time.Second, 300 * time.Millisecond, 1300 * time.Millisecond},
		{"just after: late, not made up", 301 * time.Millisecond, time.Second, 300 * time.Millisecond, 1300 * time.Millisecond},
		{"stalled for several intervals", 3500 * time.Millisecond, time.Second, 300 * time.Millisecond, 4300 * time.Millisecond},
		{"slot 0", 999 * time.Millisecond, time.Second, 0, time.Second},
		{"a longer interval", 2 * time.Second, 5 * time.Second, 4 * time.Second, 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := second.Add(tc.now)
			got := nextBeat(now, tc.interval, tc.slot)
			require.Equal(t, second.Add(tc.want), got)
			require.True(t, got.After(now))
			require.LessOrEqual(t, got.Sub(now), tc.interval)
		})
	}
}

func TestBeatSlotsAreOnTheSlotGrid(t *testing.T) {
	for _, interval := range []time.Duration{time.Second, 5 * time.Second, 3 * time.Millisecond, 1234 * time.Millisecond} {
		for range 50 {
			b := NewBeat(interval)
			b.Stop()
			require.GreaterOrEqual(t, b.slot, time.Duration(0))
			require.Less(t, b.slot, interval)
			if interval >= beatSlot {
				require.Zero(t, b.slot%(interval/(interval/beatSlot)), "interval %s slot %s", interval, b.slot)
			}
			require.LessOrEqual(t, time.Until(b.next), interval)
		}
	}
}
