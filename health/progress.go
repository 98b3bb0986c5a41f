package health

import (
	"slices"
	"time"
)

// Phase is what a running generation's workers are doing, as far as hang
// detection is concerned (the sections of NVIDIA's ft_launcher): each phase
// has its own timeout, so that a long checkpoint save or the work after the
// last step is never taken for a hang.
type Phase int

const (
	// PhaseStartup: the generation runs and has reported no step yet.
	PhaseStartup Phase = iota
	// PhaseSteps: the workers report training steps.
	PhaseSteps
	// PhaseSaving: a node's workers are saving a checkpoint.
	PhaseSaving
	// PhaseDone: the workers reported their last step; what follows (a
	// final save, evaluation, the exit) is judged by the exit alone.
	PhaseDone
)

// Derived step timeout: with health.progress_timeout unset, a job that
// reports steps is hung when no step came for StepTimeoutFactor times the
// longest of its last StepGapWindow gaps between step reports, and never
// sooner than StepTimeoutFloor. The floor leaves room for what runs between
// steps without reporting (an evaluation loop, a slow data loader
// refill); a job that needs more sets progress_timeout.
const (
	StepTimeoutFloor  = 10 * time.Minute
	StepTimeoutFactor = 10
	StepGapWindow     = 32
)

// HangTimeouts are a job's hang detection settings (job.yaml health).
type HangTimeouts struct {
	// Progress is health.progress_timeout: the steps phase's timeout; nil
	// derives it from the step gaps (StepTimeout). Zero turns hang
	// detection off in every phase.
	Progress *time.Duration
	// Checkpoint bounds the saving phase; zero is no bound.
	Checkpoint time.Duration
	// Startup bounds the start-up phase of a job known to report steps;
	// zero is no bound.
	Startup time.Duration
}

// StepTimeout is the steps phase's timeout: fixed when the job sets one
// (zero is off), else derived from gaps, the latest intervals between step
// reports: StepTimeoutFactor times the longest, at least StepTimeoutFloor.
// The longest rather than a mean: a step time that varies (gradient
// accumulation, periodic logging) must not make its slow steps hangs.
func StepTimeout(fixed *time.Duration, gaps []time.Duration) time.Duration {
	if fixed != nil {
		return max(*fixed, 0)
	}
	longest := time.Duration(0)
	if len(gaps) > 0 {
		longest = slices.Max(gaps)
	}
	if longest > StepTimeoutFloor/StepTimeoutFactor {
		return longest * StepTimeoutFactor
	}
	return StepTimeoutFloor
}

// HangTimeout is the timeout for phase, zero when the phase is never a
// hang. reportsSteps is whether the job reported a step in this or an
// earlier generation: the start-up phase of a job that never did cannot be
// told from a job that does not report, so it is bounded only once the job
// is known to report.
func HangTimeout(phase Phase, t HangTimeouts, gaps []time.Duration, reportsSteps bool) time.Duration {
	if t.Progress != nil && *t.Progress <= 0 {
		return 0
	}
	switch phase {
	case PhaseStartup:
		if !reportsSteps {
			return 0
		}
		return max(t.Startup, 0)
	case PhaseSteps:
		return StepTimeout(t.Progress, gaps)
	case PhaseSaving:
		return max(t.Checkpoint, 0)
	default:
		return 0
	}
}

// StepDated is when a reported step came, by the controller's clock: the
// report arrived at arrived, and its agent says its workers reported the
// step age before it sent it (progress rides on the heartbeat, so it may
// wait a whole interval). The age counts for at most limit, the heartbeat
// timeout (an agent silent longer is lost anyway), and a negative one for
// nothing. The time in transit is not taken off, so a step is never dated
// before it came: a hang is declared no sooner than its timeout.
func StepDated(arrived time.Time, age, limit time.Duration) time.Time {
	return arrived.Add(-min(max(age, 0), max(limit, 0)))
}

// NoteStepGap adds gap, the time between two step reports, to gaps, keeping
// the latest StepGapWindow. It may reuse gaps' array.
func NoteStepGap(gaps []time.Duration, gap time.Duration) []time.Duration {
	if gap <= 0 {
		return gaps
	}
	if len(gaps) >= StepGapWindow {
		gaps = append(gaps[:0], gaps[len(gaps)-StepGapWindow+1:]...)
	}
	return append(gaps, gap)
}
