package controller

// Training phases, step times and metrics: what hang detection and the API
// know of a running generation's training beyond its step.

import (
	"fmt"
	"maps"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// training is a job's training state from its nodes' Progress reports,
// guarded by c.mu like the rest of jobState. In memory only, like the
// step: a controller that takes over learns it again from the next
// reports (until then a running job is in its start-up phase, bounded only
// once it has reported a step).
type training struct {
	// saving holds the nodes saving a checkpoint, since savingSince.
	saving      map[string]struct{}
	savingSince time.Time
	// done: a node's workers reported their last step.
	done bool
	// clock is when the steps phase's clock last started: the last step
	// advance, or the end of a save. clockIsStep says it was an advance,
	// so that the next one's gap is a step time.
	clock       time.Time
	clockIsStep bool
	// gaps are the latest times between step advances, for the derived
	// step timeout. Kept across generations: the step time is the job's.
	gaps []time.Duration
	// metrics are the latest metrics reported, with the step metricsStep.
	metrics     map[string]float64
	metricsStep uint64
}

// noteProgress records p, node's report that arrived at now and whose step
// came at stepAt (health.StepDated): the job's step when it advanced
// (advanced; first when it is the generation's first step), the node's
// phase and the metrics.
func (js *jobState) noteProgress(node string, p *rdzvv1.Progress, now, stepAt time.Time) (advanced, first bool) {
	first = js.rec.GetProgressAt() == nil
	if first || p.GetStep() > js.rec.GetStep() {
		js.rec.Step, js.rec.ProgressAt = p.GetStep(), timestamppb.New(now)
		js.progressed, js.reportsSteps = true, true
		js.training.advanced(stepAt)
		advanced = true
	}
	js.training.report(node, p, now)
	return advanced, first
}

// newGeneration forgets what the previous generation reported, but for
// its step times.
func (t *training) newGeneration() {
	*t = training{gaps: t.gaps}
}

// advanced notes that the job's step advanced at at, or when the clock
// last started if that is later (a node's step dated before another's
// report, or before a save ended): the clock never runs back.
func (t *training) advanced(at time.Time) {
	if at.Before(t.clock) {
		at = t.clock
	}
	if t.clockIsStep && len(t.saving) == 0 && !t.done {
		t.gaps = health.NoteStepGap(t.gaps, at.Sub(t.clock))
	}
	t.clock, t.clockIsStep = at, true
}

// report notes node's phase and metrics from p at now.
func (t *training) report(node string, p *rdzvv1.Progress, now time.Time) {
	switch p.GetPhase() {
	case rdzvv1.TrainingPhase_TRAINING_PHASE_DONE:
		t.done = true
	case rdzvv1.TrainingPhase_TRAINING_PHASE_SAVING:
		if len(t.saving) == 0 {
			t.saving, t.savingSince = map[string]struct{}{}, now
		}
		t.saving[node] = struct{}{}
	default:
		if _, ok := t.saving[node]; ok {
			delete(t.saving, node)
			if len(t.saving) == 0 {
				// The steps clock starts again when the save ended: the
				// save's time is no step's.
				t.clock, t.clockIsStep = now, false
			}
		}
	}
	if m := p.GetMetrics(); len(m) > 0 && (t.metrics == nil || p.GetStep() >= t.metricsStep) {
		t.metrics, t.metricsStep = m, p.GetStep()
	}
}

// phase is the job's phase: done once any node is past its last step (the
// exit decides from there), saving while any node saves (its peers wait
// for it at their next collective), else steps once it reported one.
func (js *jobState) phase() health.Phase {
	switch {
	case js.training.done:
		return health.PhaseDone
	case len(js.training.saving) > 0:
		return health.PhaseSaving
	case js.rec.GetProgressAt() != nil:
		return health.PhaseSteps
	default:
		return health.PhaseStartup
	}
}

// hangTimeout is the running job's phase, when that phase's clock started,
// and its timeout (zero: it is never a hang).
func (js *jobState) hangTimeout() (health.Phase, time.Time, time.Duration) {
	spec := js.rec.GetSpec()
	t := health.HangTimeouts{
		Checkpoint: spec.GetHealthCheckpointTimeout().AsDuration(),
		Startup:    spec.GetHealthStartupTimeout().AsDuration(),
	}
	if p := spec.GetHealthProgressTimeout(); p != nil {
		d := p.AsDuration()
		t.Progress = &d
	}
	phase := js.phase()
	var since time.Time
	switch phase {
	case health.PhaseStartup:
		if at := js.rec.GetStartedAt(); at != nil {
			since = at.AsTime()
		}
	case health.PhaseSteps:
		since = js.training.clock
		if since.IsZero() {
			// A record loaded by a controller that took over may carry the
			// step time its predecessor wrote with another change.
			since = js.rec.GetProgressAt().AsTime()
		}
	case health.PhaseSaving:
		since = js.training.savingSince
	}
	return phase, since, health.HangTimeout(phase, t, js.training.gaps, js.reportsSteps)
}

// hangReason is the attempt_failed reason of a hang in phase. Each starts
// "hang: " and names the setting that bounded it.
func hangReason(js *jobState, phase health.Phase, stalled, timeout time.Duration) string {
	step := js.rec.GetStep()
	switch phase {
	case health.PhaseStartup:
		return fmt.Sprintf("hang: no training step %s after the generation started (health.startup_timeout %s)", stalled.Round(time.Second), timeout)
	case health.PhaseSaving:
		return fmt.Sprintf("hang: checkpoint save not complete after %s (last step %d, health.checkpoint_timeout %s)", stalled.Round(time.Second), step, timeout)
	}
	setting := fmt.Sprintf("health.progress_timeout %s", timeout)
	if js.rec.GetSpec().GetHealthProgressTimeout() == nil {
		setting = fmt.Sprintf("timeout %s derived from the step time", timeout)
	}
	return fmt.Sprintf("hang: no training progress for %s (last step %d, %s)", stalled.Round(time.Second), step, setting)
}

// viewTraining fills j, the API view of js, with its phase, the hang
// timeout in force and the latest metrics.
func viewTraining(j *rdzvv1.Job, js *jobState) {
	if js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING {
		return
	}
	phase, _, timeout := js.hangTimeout()
	if phase == health.PhaseStartup && !js.reportsSteps {
		// Not known to report: nothing to say of its training.
		return
	}
	j.Phase = phaseProto[phase]
	if timeout > 0 {
		j.HangTimeout = durationpb.New(timeout)
	}
	j.Metrics = maps.Clone(js.training.metrics)
}

var phaseProto = map[health.Phase]rdzvv1.TrainingPhase{
	health.PhaseStartup: rdzvv1.TrainingPhase_TRAINING_PHASE_STARTUP,
	health.PhaseSteps:   rdzvv1.TrainingPhase_TRAINING_PHASE_STEPS,
	health.PhaseSaving:  rdzvv1.TrainingPhase_TRAINING_PHASE_SAVING,
	health.PhaseDone:    rdzvv1.TrainingPhase_TRAINING_PHASE_DONE,
}
