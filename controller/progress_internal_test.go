package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// The job's phase and the step gaps the derived timeout learns from, as
// its nodes' reports arrive: a save's time and the start are no step's, and
// a step is dated by its age, never before the clock last started.
func TestTrainingFromReports(t *testing.T) {
	const (
		steps  = rdzvv1.TrainingPhase_TRAINING_PHASE_STEPS
		saving = rdzvv1.TrainingPhase_TRAINING_PHASE_SAVING
		done   = rdzvv1.TrainingPhase_TRAINING_PHASE_DONE
	)
	type report struct {
		at    time.Duration
		age   time.Duration // the step came this long before the report arrived
		node  string
		step  uint64
		phase rdzvv1.TrainingPhase
	}
	tests := []struct {
		name      string
		reports   []report
		wantPhase health.Phase
		wantSince time.Duration
		wantGaps  []time.Duration
	}{
		{name: "start-up", wantPhase: health.PhaseStartup},
		{name: "the first step is no gap", reports: []report{{at: 5, node: "a", step: 1, phase: steps}},
			wantPhase: health.PhaseSteps, wantSince: 5},
		{name: "steps", reports: []report{{at: 5, node: "a", step: 1}, {at: 7, node: "b", step: 2, phase: steps}, {at: 10, node: "a", step: 3}},
			wantPhase: health.PhaseSteps, wantSince: 10, wantGaps: []time.Duration{2, 3}},
		{name: "a node at the same step is no advance", reports: []report{{at: 5, node: "a", step: 1}, {at: 7, node: "b", step: 1}},
			wantPhase: health.PhaseSteps, wantSince: 5},
		{name: "saving", reports: []report{{at: 5, node: "a", step: 1}, {at: 7, node: "a", step: 2, phase: saving}, {at: 9, node: "b", step: 2}},
			wantPhase: health.PhaseSaving, wantSince: 7, wantGaps: []time.Duration{2}},
		{name: "saving while any node saves",
			reports:   []report{{at: 5, node: "a", step: 2, phase: saving}, {at: 6, node: "b", step: 2, phase: saving}, {at: 8, node: "a", step: 2}},
			wantPhase: health.PhaseSaving, wantSince: 5},
		{name: "the steps clock starts when the save ends",
			reports:   []report{{at: 5, node: "a", step: 1}, {at: 7, node: "a", step: 2, phase: saving}, {at: 30, node: "a", step: 2}, {at: 31, node: "a", step: 3}},
			wantPhase: health.PhaseSteps, wantSince: 31, wantGaps: []time.Duration{2}},
		{name: "a step is dated by its age", reports: []report{{at: 5, node: "a", step: 1}, {at: 10, age: 2, node: "a", step: 2}},
			wantPhase: health.PhaseSteps, wantSince: 8, wantGaps: []time.Duration{3}},
		{name: "a step dated before another node's does not run the clock back",
			reports:   []report{{at: 5, node: "a", step: 1}, {at: 7, node: "b", step: 2}, {at: 8, age: 4, node: "a", step: 3}},
			wantPhase: health.PhaseSteps, wantSince: 7, wantGaps: []time.Duration{2}},
		{name: "a step dated before its save ended is dated at the end",
			reports:   []report{{at: 5, node: "a", step: 1}, {at: 7, node: "a", step: 2, phase: saving}, {at: 30, node: "a", step: 2}, {at: 31, age: 5, node: "a", step: 3}},
			wantPhase: health.PhaseSteps, wantSince: 30, wantGaps: []time.Duration{2}},
		{name: "done is final", reports: []report{{at: 5, node: "a", step: 9, phase: done}, {at: 6, node: "b", step: 9, phase: saving}, {at: 7, node: "b", step: 10}},
			wantPhase: health.PhaseDone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			js := &jobState{rec: &rdzvv1.Job{}}
			for _, r := range tt.reports {
				arrived := t0.Add(r.at * time.Second)
				js.noteProgress(r.node, &rdzvv1.Progress{Step: r.step, Phase: r.phase}, arrived, arrived.Add(-r.age*time.Second))
			}
			require.Equal(t, tt.wantPhase, js.phase())
			if tt.wantPhase == health.PhaseSteps {
				require.Equal(t, t0.Add(tt.wantSince*time.Second), js.training.clock)
			}
			if tt.wantPhase == health.PhaseSaving {
				require.Equal(t, t0.Add(tt.wantSince*time.Second), js.training.savingSince)
			}
			var gaps []time.Duration
			for _, g := range tt.wantGaps {
				gaps = append(gaps, g*time.Second)
			}
			require.Equal(t, gaps, js.training.gaps)
		})
	}
}
