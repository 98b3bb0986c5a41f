// Package lifecycle is a job's lifecycle as pure functions, in the manner
// of health/: each takes a job's record, what happened and the time, and
// returns a Transition, the record the job moves to with the event that
// says so and the order its workers are to get once that is durable.
// Nothing here does I/O, takes a lock or reads a clock, and no record
// passed in is changed unless the function says so; the controller keeps
// the lock, writes, sends and schedules, and applies a Transition in one
// place (controller/jobs.go, apply). Every write of a job's state is here.
//
//	PENDING ──Commit──▶ RUNNING ──Fail (a restart left), Grow, Replan──▶ RECOVERING ──Commit──▶ RUNNING
//	RUNNING ──Judge: every node succeeded──▶ SUCCEEDED
//	RUNNING ──Fail (no restart left, crash loop), Judge: broken──▶ FAILED
//	PENDING, RECOVERING ──rendezvous timeout (Finish)──▶ FAILED
//	PENDING ──Stop──▶ STOPPED;  RUNNING, RECOVERING ──Stop──▶ STOPPING ──every worker exited (Finish)──▶ STOPPED
//
// A RECOVERING job commits its next generation only once the failed one is
// fenced (FencedAt): two generations never run at once.
package lifecycle

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Event kinds of a job's lifecycle, stable for `rdzvctl events -o json`.
const (
	EventJobSubmitted        = "job_submitted"
	EventRendezvousCommitted = "rendezvous_committed"
	EventJobSucceeded        = "job_succeeded"
	EventJobFailed           = "job_failed"
	EventJobStopping         = "job_stopping"
	EventJobStopped          = "job_stopped"
	EventAttemptFailed       = "attempt_failed"
	// EventJobGrowing is a generation stopped to grow the job.
	EventJobGrowing        = "job_growing"
	EventPreflightExcluded = "preflight_excluded"
	// EventRecovered closes an incident: the job trains again (or, for a
	// job that reports no steps, all its workers run).
	EventRecovered = "recovered"
)

// Order is what a transition asks of the workers of the generation it
// leaves, once the new record is durable.
type Order int

const (
	// OrderNone tells no worker anything.
	OrderNone Order = iota
	// OrderStop stops the workers still running within the agent's
	// stop_grace: an operator's stop, whose workers may save.
	OrderStop
	// OrderStopFailed stops the workers still running within
	// FailedStopGrace: their generation failed or gives way, and nothing
	// they could save would be used.
	OrderStopFailed
	// OrderEnd tells every node of the round that the job ended (a warm
	// one then drops the job's standby at once) and stops the workers
	// still running.
	OrderEnd
	// OrderAssign sends each node of the transition's Round its
	// assignment.
	OrderAssign
)

// FailedStopGrace is the SIGTERM grace of the workers of a failed or
// stale generation. Their collectives are broken: they cannot save
// anything useful, and the restart waits for them to be gone.
const FailedStopGrace = time.Second

// Transition is a job's move to a new record. Job is nil when only Event
// is written (the state does not change).
type Transition struct {
	Job   *rdzvv1.Job
	Event *rdzvv1.Event
	// Round is the round a commit stores with Job, nil otherwise.
	Round *rdzvv1.Round
	Order Order
	// Why is the reason the stopped workers are given.
	Why string
}

// Submit is the record of a job just submitted: PENDING, counting on from
// generation (the generation of the job of that name it replaces, or the
// floor of deleted ones).
func Submit(spec *rdzvv1.JobSpec, generation uint64, now time.Time) Transition {
	rec := &rdzvv1.Job{Spec: spec, State: rdzvv1.JobState_JOB_STATE_PENDING, Reason: "waiting for rendezvous",
		Generation: generation, CreatedAt: timestamppb.New(now)}
	launcher := "launcher " + spec.GetLauncherKind()
	if r := spec.GetLauncherKindReason(); r != "" {
		launcher += " (auto: " + r + ")"
	}
	return Transition{Job: rec, Event: event(rec, "", now, EventJobSubmitted, "job submitted: %d-%d nodes, %d GPUs and %d processes per node, %s",
		spec.GetNodesMin(), spec.GetNodesMax(), spec.GetGpusPerNode(), spec.GetProcsPerNode(), launcher)}
}

// Unreadable is the record standing in for a job whose stored record
// could not be read (why): FAILED, never acted on, replaced when the job
// is started again. Retention counts its age from now, when it was found.
func Unreadable(name string, generation uint64, why string, now time.Time) *rdzvv1.Job {
	return &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: name}, State: rdzvv1.JobState_JOB_STATE_FAILED, Generation: generation,
		Reason: why + "; start the job again to replace it", FinishedAt: timestamppb.New(now)}
}

// Terminal reports whether a job in state s has finished for good.
func Terminal(s rdzvv1.JobState) bool {
	return s == rdzvv1.JobState_JOB_STATE_SUCCEEDED || s == rdzvv1.JobState_JOB_STATE_FAILED || s == rdzvv1.JobState_JOB_STATE_STOPPED
}

// Finish moves a job to the terminal state (SUCCEEDED, FAILED or STOPPED)
// for reason, and ends its workers.
func Finish(rec *rdzvv1.Job, state rdzvv1.JobState, reason string, now time.Time) Transition {
	next := proto.CloneOf(rec)
	CloseInterval(next, now)
	next.State, next.Reason, next.FinishedAt = state, reason, timestamppb.New(now)
	kind := map[rdzvv1.JobState]string{
		rdzvv1.JobState_JOB_STATE_SUCCEEDED: EventJobSucceeded,
		rdzvv1.JobState_JOB_STATE_FAILED:    EventJobFailed,
		rdzvv1.JobState_JOB_STATE_STOPPED:   EventJobStopped,
	}[state]
	return Transition{Job: next, Event: event(next, "", now, kind, "%s", reason), Order: OrderEnd, Why: reason}
}

// Stop is an operator's stop: a job that has not started is STOPPED, one
// running or recovering is STOPPING until its workers exit. ok is false
// for a job that is stopping or has finished already (nothing to do).
func Stop(rec *rdzvv1.Job, now time.Time) (t Transition, ok bool) {
	switch rec.GetState() {
	case rdzvv1.JobState_JOB_STATE_PENDING:
		return Finish(rec, rdzvv1.JobState_JOB_STATE_STOPPED, "stopped by operator before it started", now), true
	case rdzvv1.JobState_JOB_STATE_RUNNING, rdzvv1.JobState_JOB_STATE_RECOVERING:
		next := proto.CloneOf(rec)
		CloseInterval(next, now)
		next.State, next.Reason = rdzvv1.JobState_JOB_STATE_STOPPING, "stopping: waiting for workers to exit"
		return Transition{Job: next, Event: event(next, "", now, EventJobStopping, "stop requested by operator"),
			Order: OrderStop, Why: "stopped by operator"}, true
	}
	return Transition{}, false
}

// Stopped is a stopping job whose workers have all exited.
func Stopped(rec *rdzvv1.Job, now time.Time) Transition {
	return Finish(rec, rdzvv1.JobState_JOB_STATE_STOPPED, "stopped by operator", now)
}

// Failure is the failure of a running job's current generation.
type Failure struct {
	Reason string
	// Latency is from the fault to its detection, now.
	Latency time.Duration
	// Progressed says whether the generation trained (a step or a
	// checkpoint) before it failed.
	Progressed bool
}

// Fail ends the current generation of a running job after f: it is
// RECOVERING, waiting out its backoff to re-rendezvous and resume from
// the latest complete checkpoint, or FAILED for good when its restarts
// are used up or it is crash looping. Either way an incident is opened,
// and the generation's workers are stopped (ended, if FAILED).
func Fail(rec *rdzvv1.Job, f Failure, now time.Time) Transition {
	spec := rec.GetSpec()
	gen := rec.GetGeneration()
	next := proto.CloneOf(rec)
	var crashLoop bool
	next.RestartsWithoutProgress, crashLoop = health.CrashLoop(rec.GetRestartsWithoutProgress(), f.Progressed, now.Sub(rec.GetStartedAt().AsTime()))
	openIncident(next, f.Reason, f.Latency, now)
	switch {
	case next.GetRestarts() >= spec.GetRestartMaxRestarts():
		return Finish(next, rdzvv1.JobState_JOB_STATE_FAILED, fmt.Sprintf("%s; no restarts left (max_restarts %d)", f.Reason, spec.GetRestartMaxRestarts()), now)
	case crashLoop:
		return Finish(next, rdzvv1.JobState_JOB_STATE_FAILED, fmt.Sprintf("crash loop: %d attempts in a row failed without training progress; last: %s",
			next.GetRestartsWithoutProgress(), f.Reason), now)
	}
	CloseInterval(next, now)
	backoff := Backoff(spec, next.GetRestartsWithoutProgress())
	next.Restarts++
	next.State = rdzvv1.JobState_JOB_STATE_RECOVERING
	// Recovery is timed from the fault, not from when it was noticed.
	next.RecoveryStartedAt = timestamppb.New(now.Add(-f.Latency))
	next.RestartNotBefore = timestamppb.New(now.Add(backoff))
	from := "from scratch"
	if cp := next.GetLatestCheckpoint(); cp != nil {
		from = fmt.Sprintf("from checkpoint step %d", cp.GetStep())
	}
	next.Reason = fmt.Sprintf("recovering: %s; restart %d of %d %s", f.Reason, next.GetRestarts(), spec.GetRestartMaxRestarts(), from)
	ev := event(next, "", now, EventAttemptFailed, "generation %d failed: %s; restart %d of %d after %s backoff, %s (detected after %s)",
		gen, f.Reason, next.GetRestarts(), spec.GetRestartMaxRestarts(), backoff, from, f.Latency.Round(time.Millisecond))
	ev.DetectionLatency = durationpb.New(f.Latency)
	return Transition{Job: next, Event: ev, Order: OrderStopFailed, Why: fmt.Sprintf("generation %d failed: %s", gen, f.Reason)}
}

// Backoff is the wait before restarting after consecutive failures in a
// row without progress: none after an attempt that trained (it is no
// crash loop, and any wait is outage), else the initial backoff, doubled
// per further such failure, capped at the maximum.
func Backoff(spec *rdzvv1.JobSpec, consecutive uint32) time.Duration {
	if consecutive == 0 {
		return 0
	}
	d := spec.GetRestartBackoffInitial().AsDuration()
	limit := spec.GetRestartBackoffMax().AsDuration()
	for range consecutive - 1 {
		if d >= limit/2 {
			return limit
		}
		d *= 2
	}
	return min(d, limit)
}

// Grow stops the current generation of a running job so that it restarts
// on to nodes (from the from it runs on), from the checkpoint it just
// recorded or, fromMemory, from the newest in-memory step (a replicated
// state's, which fits the grown world). Growing is no failure: no restart
// is counted, no backoff.
func Grow(rec *rdzvv1.Job, from, to int, fromMemory bool, now time.Time) Transition {
	gen := rec.GetGeneration()
	next := proto.CloneOf(rec)
	CloseInterval(next, now)
	next.State = rdzvv1.JobState_JOB_STATE_RECOVERING
	next.RecoveryStartedAt = timestamppb.New(now)
	next.RestartNotBefore = timestamppb.New(now)
	resume := fmt.Sprintf("checkpoint step %d", next.GetLatestCheckpoint().GetStep())
	if fromMemory {
		resume = "the newest in-memory step"
	}
	next.Reason = fmt.Sprintf("growing from %d to %d nodes: restarting from %s", from, to, resume)
	ev := event(next, "", now, EventJobGrowing, "generation %d stops to grow the job from %d to %d nodes (nodes.max %d); it resumes from %s",
		gen, from, to, rec.GetSpec().GetNodesMax(), resume)
	return Transition{Job: next, Event: ev, Order: OrderStopFailed, Why: fmt.Sprintf("generation %d stops: the job grows from %d to %d nodes", gen, from, to)}
}

// Replan is the preflight test of the current generation leaving node
// out (verdict): a running job plans its round again without it. Like a
// failure every node is told to stop; unlike one no restart is counted
// and no backoff waited, as the job did nothing wrong, the round was. A
// job no longer running (another node's verdict re-planned it) only
// records the event.
func Replan(rec *rdzvv1.Job, node, verdict string, now time.Time) Transition {
	gen := rec.GetGeneration()
	ev := event(rec, node, now, EventPreflightExcluded, "generation %d: node %s left out by the preflight test: %s", gen, node, verdict)
	if rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING {
		return Transition{Event: ev}
	}
	next := proto.CloneOf(rec)
	CloseInterval(next, now)
	next.State = rdzvv1.JobState_JOB_STATE_RECOVERING
	if next.RecoveryStartedAt == nil {
		next.RecoveryStartedAt = timestamppb.New(now)
	}
	next.RestartNotBefore = timestamppb.New(now)
	next.Reason = "re-planning the round without " + node + ", left out by the preflight test"
	return Transition{Job: next, Event: ev, Order: OrderStopFailed, Why: "generation re-planned: node " + node + " left out by the preflight test"}
}

// Commit is a rendezvous committed: the job's next generation, on the
// round's nodes, resuming as Resume says.
type Commit struct {
	Round *rdzvv1.Round
	// Nodes lists the round's nodes for the event, e.g. "[h1 h2]".
	Nodes string
	// Resume is where the generation starts, when not from the latest
	// durable checkpoint (or from scratch): "from in-memory step 30".
	Resume string
}

// Committed moves a pending or recovering job to RUNNING in c's round.
func Committed(rec *rdzvv1.Job, c Commit, now time.Time) Transition {
	r := c.Round
	next := proto.CloneOf(rec)
	noteCommitted(next, r.GetGeneration(), now)
	next.State, next.Generation, next.MasterAddr, next.MasterPort = rdzvv1.JobState_JOB_STATE_RUNNING, r.GetGeneration(), r.GetMasterAddr(), r.GetMasterPort()
	next.Reason = fmt.Sprintf("running on %d nodes", len(r.GetNodes()))
	next.StartedAt = timestamppb.New(now)
	next.Step, next.ProgressAt = 0, nil
	resume := c.Resume
	if resume == "" {
		resume = "from scratch"
		if cp := next.GetLatestCheckpoint(); cp != nil {
			resume = fmt.Sprintf("from checkpoint step %d", cp.GetStep())
		}
	}
	next.TrainingSince = timestamppb.New(now)
	if next.RecoveryStartedAt != nil {
		// Still recovering until the new generation is back to training:
		// ResumeTraining ends the interval.
		next.TrainingSince, next.RestartNotBefore = nil, nil
		next.Reason += ", resumed " + resume
	}
	ev := event(next, "", now, EventRendezvousCommitted, "generation %d: %d nodes %s, master %s:%d, starting %s",
		r.GetGeneration(), len(r.GetNodes()), c.Nodes, r.GetMasterAddr(), r.GetMasterPort(), resume)
	return Transition{Job: next, Event: ev, Round: r, Order: OrderAssign}
}

// CloseInterval adds the time since rec last entered RUNNING or
// RECOVERING to its training or recovery total, in rec itself. Callers
// change the state right after (or work on a copy for display), so no
// interval counts twice.
func CloseInterval(rec *rdzvv1.Job, now time.Time) {
	if rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING && rec.GetState() != rdzvv1.JobState_JOB_STATE_RECOVERING {
		return
	}
	if rec.GetRecoveryStartedAt() != nil {
		rec.RecoveryTime = durationpb.New(rec.GetRecoveryTime().AsDuration() + now.Sub(rec.GetRecoveryStartedAt().AsTime()))
		rec.RecoveryStartedAt = nil
	}
	if rec.GetTrainingSince() != nil {
		rec.TrainingTime = durationpb.New(rec.GetTrainingTime().AsDuration() + now.Sub(rec.GetTrainingSince().AsTime()))
		rec.TrainingSince = nil
	}
}

// ResumeTraining marks a restarted generation as training again, in rec
// (held in memory, written with its next write): its first step report,
// or, for a job that reports no steps, all its workers running. Until
// then the outage goes on, start-up included. It returns how long the
// recovery took, ok false if rec was not recovering.
func ResumeTraining(rec *rdzvv1.Job, now time.Time) (took time.Duration, ok bool) {
	if rec.GetRecoveryStartedAt() == nil {
		return 0, false
	}
	took = now.Sub(rec.GetRecoveryStartedAt().AsTime())
	CloseInterval(rec, now)
	rec.TrainingSince = timestamppb.New(now)
	return took, true
}

func event(rec *rdzvv1.Job, node string, now time.Time, kind, format string, args ...any) *rdzvv1.Event {
	return &rdzvv1.Event{Time: timestamppb.New(now), Job: rec.GetSpec().GetName(), Node: node, Generation: rec.GetGeneration(),
		Kind: kind, Message: fmt.Sprintf(format, args...)}
}
