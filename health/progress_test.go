package health

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func dur(d time.Duration) *time.Duration { return &d }

func TestStepTimeout(t *testing.T) {
	tests := []struct {
		name  string
		fixed *time.Duration
		gaps  []time.Duration
		want  time.Duration
	}{
		{name: "fixed", fixed: dur(6 * time.Second), gaps: []time.Duration{time.Hour}, want: 6 * time.Second},
		{name: "fixed off", fixed: dur(0), want: 0},
		{name: "fixed negative is off", fixed: dur(-time.Second), want: 0},
		{name: "derived without gaps is the floor", want: StepTimeoutFloor},
		{name: "derived from fast steps is the floor", gaps: []time.Duration{time.Second, 2 * time.Second}, want: StepTimeoutFloor},
		{name: "derived from slow steps", gaps: []time.Duration{time.Minute, 3 * time.Minute, 2 * time.Minute},
			want: StepTimeoutFactor * 3 * time.Minute},
		{name: "the longest gap counts, not the latest", gaps: []time.Duration{5 * time.Minute, time.Second},
			want: StepTimeoutFactor * 5 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, StepTimeout(tt.fixed, tt.gaps))
		})
	}
}

func TestHangTimeout(t *testing.T) {
	set := HangTimeouts{Progress: dur(6 * time.Second), Checkpoint: time.Hour, Startup: 30 * time.Minute}
	derived := HangTimeouts{Checkpoint: time.Hour, Startup: 30 * time.Minute}
	off := HangTimeouts{Progress: dur(0), Checkpoint: time.Hour, Startup: 30 * time.Minute}
	slow := []time.Duration{2 * time.Minute}
	tests := []struct {
		name         string
		phase        Phase
		t            HangTimeouts
		reportsSteps bool
		want         time.Duration
	}{
		{name: "steps, fixed", phase: PhaseSteps, t: set, reportsSteps: true, want: 6 * time.Second},
		{name: "steps, derived", phase: PhaseSteps, t: derived, reportsSteps: true, want: 20 * time.Minute},
		{name: "saving takes the checkpoint timeout", phase: PhaseSaving, t: set, reportsSteps: true, want: time.Hour},
		{name: "saving without a bound", phase: PhaseSaving, t: HangTimeouts{Progress: dur(time.Second)}, reportsSteps: true},
		{name: "done is never a hang", phase: PhaseDone, t: set, reportsSteps: true},
		{name: "start-up of a job known to report", phase: PhaseStartup, t: set, reportsSteps: true, want: 30 * time.Minute},
		{name: "start-up of a job not known to report", phase: PhaseStartup, t: set},
		{name: "progress_timeout 0s turns steps off", phase: PhaseSteps, t: off, reportsSteps: true},
		{name: "progress_timeout 0s turns saving off", phase: PhaseSaving, t: off, reportsSteps: true},
		{name: "progress_timeout 0s turns start-up off", phase: PhaseStartup, t: off, reportsSteps: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, HangTimeout(tt.phase, tt.t, slow, tt.reportsSteps))
		})
	}
}

func TestNoteStepGap(t *testing.T) {
	var gaps []time.Duration
	for i := 1; i <= StepGapWindow+5; i++ {
		gaps = NoteStepGap(gaps, time.Duration(i))
	}
	require.Len(t, gaps, StepGapWindow)
	require.Equal(t, time.Duration(6), gaps[0], "the oldest go first")
	require.Equal(t, time.Duration(StepGapWindow+5), gaps[len(gaps)-1])
	require.Len(t, NoteStepGap(gaps, 0), StepGapWindow, "a zero gap (two reports at once) is no sample")
}

func TestStepDated(t *testing.T) {
	arrived := time.Date(2030, 1, 1, 0, 0, 10, 0, time.UTC)
	const limit = 3 * time.Second
	tests := []struct {
		name string
		age  time.Duration
		want time.Time
	}{
		{name: "unset: the arrival", want: arrived},
		{name: "waited for the heartbeat", age: 800 * time.Millisecond, want: arrived.Add(-800 * time.Millisecond)},
		{name: "at most the limit", age: time.Hour, want: arrived.Add(-limit)},
		{name: "a negative age counts for nothing", age: -time.Second, want: arrived},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, StepDated(arrived, tt.age, limit))
		})
	}
	require.Equal(t, arrived, StepDated(arrived, time.Second, 0), "no limit known: the arrival")
}
