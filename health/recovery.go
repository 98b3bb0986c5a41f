package health

import "time"

// Hang reports whether a job's training has stalled: nothing for timeout
// since its phase's clock started at since (see HangTimeout), and for how
// long. Detection is off when timeout is zero or less, and with a zero
// since.
func Hang(now, since time.Time, timeout time.Duration) (stalled time.Duration, hung bool) {
	at := HangAt(since, timeout)
	if at.IsZero() {
		return 0, false
	}
	return now.Sub(since), !now.Before(at)
}

// HangAt is when a job whose phase's clock started at since becomes hung
// by timeout (Hang), zero when detection is off: the controller wakes then
// rather than at its next periodic pass.
func HangAt(since time.Time, timeout time.Duration) time.Time {
	if timeout <= 0 || since.IsZero() {
		return time.Time{}
	}
	return since.Add(timeout)
}

const (
	// CrashLoopLimit: this many consecutive failed attempts without any
	// training progress fail the job instead of restarting it again.
	CrashLoopLimit = 2
	// MinProductiveRun: an attempt that ran this long counts as progress
	// even when the job reports no steps or checkpoints, so jobs that do not
	// use the reporting helper are not mistaken for crash loops.
	MinProductiveRun = 5 * time.Minute
)

// CrashLoop counts a failed attempt into the run of consecutive attempts
// that failed without training progress (streak before it): progressed is
// whether it reported a new step or checkpoint, ran how long it lasted. It
// returns the new run, and whether the job is crash looping.
func CrashLoop(streak uint32, progressed bool, ran time.Duration) (uint32, bool) {
	if progressed || ran >= MinProductiveRun {
		return 0, false
	}
	streak++
	return streak, streak >= CrashLoopLimit
}

// Flaky is the flaky-node rule: a node lost Losses times within Window
// while running jobs is cordoned. Only losses count: they are
// unambiguously the node's doing, where a worker exiting non-zero may be
// its peers' fault or the program's. Losses zero or less turns it off.
type Flaky struct {
	Losses int
	Window time.Duration
}

// Record adds a loss at now to a node's earlier losses, forgetting those
// that fell out of the window, and reports whether the node is now flaky.
// Like append, it reuses losses' storage. Off, it records nothing.
func (f Flaky) Record(losses []time.Time, now time.Time) ([]time.Time, bool) {
	if f.Losses <= 0 {
		return losses, false
	}
	kept := losses[:0]
	for _, t := range losses {
		if now.Sub(t) < f.Window {
			kept = append(kept, t)
		}
	}
	kept = append(kept, now)
	return kept, len(kept) >= f.Losses
}
