package health

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHang(t *testing.T) {
	now := t0.Add(time.Hour)
	tests := []struct {
		name    string
		since   time.Time
		timeout time.Duration
		stalled time.Duration
		hung    bool
	}{
		{name: "stepping", since: now.Add(-time.Second), timeout: 5 * time.Second, stalled: time.Second},
		{name: "just short of the timeout", since: now.Add(-5*time.Second + time.Nanosecond), timeout: 5 * time.Second, stalled: 5*time.Second - time.Nanosecond},
		{name: "the timeout is a hang", since: now.Add(-5 * time.Second), timeout: 5 * time.Second, stalled: 5 * time.Second, hung: true},
		{name: "stalled past the timeout", since: now.Add(-7 * time.Second), timeout: 5 * time.Second, stalled: 7 * time.Second, hung: true},
		{name: "off with no timeout", since: now.Add(-time.Hour), timeout: 0},
		{name: "off with a negative timeout", since: now.Add(-time.Hour), timeout: -time.Second},
		{name: "off without a start", timeout: 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stalled, hung := Hang(now, tt.since, tt.timeout)
			require.Equal(t, tt.hung, hung)
			require.Equal(t, tt.stalled, stalled)
			at := HangAt(tt.since, tt.timeout)
			if tt.stalled == 0 {
				require.True(t, at.IsZero(), "detection off: no time to wake at")
				return
			}
			require.Equal(t, tt.since.Add(tt.timeout), at)
			_, hungAt := Hang(at, tt.since, tt.timeout)
			require.True(t, hungAt, "hung at HangAt")
			_, hungBefore := Hang(at.Add(-time.Nanosecond), tt.since, tt.timeout)
			require.False(t, hungBefore, "not hung before HangAt")
		})
	}
}

func TestCrashLoop(t *testing.T) {
	tests := []struct {
		name       string
		streak     uint32
		progressed bool
		ran        time.Duration
		want       uint32
		looping    bool
	}{
		{name: "first failure without progress", ran: time.Minute, want: 1},
		{name: "second in a row is a crash loop", streak: 1, ran: time.Minute, want: 2, looping: true},
		{name: "a reported step or checkpoint resets", streak: 1, progressed: true, ran: time.Second, want: 0},
		{name: "a long run counts as progress without reports", streak: 1, ran: MinProductiveRun, want: 0},
		{name: "just short of a productive run", streak: 1, ran: MinProductiveRun - time.Second, want: 2, looping: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, looping := CrashLoop(tt.streak, tt.progressed, tt.ran)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.looping, looping)
		})
	}
}

func TestFlaky(t *testing.T) {
	rule := Flaky{Losses: 3, Window: time.Hour}
	now := t0.Add(24 * time.Hour)
	tests := []struct {
		name   string
		rule   Flaky
		before []time.Time
		want   []time.Time
		flaky  bool
	}{
		{name: "first loss", rule: rule, want: []time.Time{now}},
		{name: "third within the window", rule: rule, before: []time.Time{now.Add(-50 * time.Minute), now.Add(-time.Minute)},
			want: []time.Time{now.Add(-50 * time.Minute), now.Add(-time.Minute), now}, flaky: true},
		{name: "old losses are forgotten", rule: rule, before: []time.Time{now.Add(-2 * time.Hour), now.Add(-time.Hour), now.Add(-time.Minute)},
			want: []time.Time{now.Add(-time.Minute), now}},
		{name: "off records nothing", rule: Flaky{Window: time.Hour}, before: []time.Time{now.Add(-time.Minute)}, want: []time.Time{now.Add(-time.Minute)}},
		{name: "a threshold of one cordons at the first loss", rule: Flaky{Losses: 1, Window: time.Hour}, want: []time.Time{now}, flaky: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, flaky := tt.rule.Record(tt.before, now)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.flaky, flaky)
		})
	}
}
