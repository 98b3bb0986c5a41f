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
			got := nextBeat(time.Time{}, now, tc.interval, tc.slot)
			require.Equal(t, second.Add(tc.want), got)
			require.True(t, got.After(now))
			require.LessOrEqual(t, got.Sub(now), tc.interval)
		})
	}
}

func TestNextBeatAfterTheOneDue(t *testing.T) {
	due := time.Date(2030, 1, 2, 3, 4, 5, 300_000_000, time.UTC)
	for _, tc := range []struct {
		name string
		now  time.Duration // relative to due
		want time.Duration // relative to due
	}{
		{"fired on time", 0, time.Second},
		{"fired late", 40 * time.Millisecond, time.Second},
		{"fired a hair early by a slewed wall clock: not the same slot again", -50 * time.Microsecond, time.Second},
		{"wall clock stepped back: within an interval of now", -10 * time.Second, -9 * time.Second},
		{"wall clock stepped forward", 10*time.Second + 500*time.Millisecond, 11 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := due.Add(tc.now)
			got := nextBeat(due, now, time.Second, 300*time.Millisecond)
			require.Equal(t, due.Add(tc.want), got)
			require.True(t, got.After(now))
			// An interval after now, or after the heartbeat just due when
			// the timer fired a hair early.
			require.LessOrEqual(t, got.Sub(now), time.Second+beatSlot)
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
