package lifecycle

import (
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// EventCheckpoint is a complete checkpoint added to a job's catalog.
const EventCheckpoint = "checkpoint_recorded"

// Checkpointed is what OnCheckpoint decides of a checkpoint report.
type Checkpointed struct {
	// Job is the job's record with the checkpoint as its latest, nil when
	// the report is not recorded.
	Job        *rdzvv1.Job
	Checkpoint *rdzvv1.Checkpoint
	Event      *rdzvv1.Event
	// Stale is set for a report of another generation than the running
	// one, or from a node outside its round.
	Stale bool
	// Ignored says why a current report is not recorded: empty for one
	// that is, or that is no newer than the latest (nothing to say).
	Ignored string
	// Every is the time since the generation's previous checkpoint, or
	// since it started for its first (start-up included, so at most an
	// overestimate): the cadence growth weighs. Zero when unknown.
	Every time.Duration
}

// OnCheckpoint decides a report from node (member: of the job's current
// round) of a complete checkpoint. Only the current generation of a
// running job may add one, and never one found on disk beyond where it
// has trained (reportsSteps: the job reports steps): such a checkpoint was
// written by a generation being stopped, and a fenced generation must
// never become the one the job resumes from.
func OnCheckpoint(rec *rdzvv1.Job, node string, member, reportsSteps bool, r *rdzvv1.CheckpointReport, now time.Time) Checkpointed {
	if rec == nil || rec.GetGeneration() != r.GetGeneration() || rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING || !member {
		return Checkpointed{Stale: true}
	}
	prev := rec.GetLatestCheckpoint()
	if prev != nil && r.GetStep() <= prev.GetStep() {
		return Checkpointed{}
	}
	if r.GetSource() == "scan" && reportsSteps && r.GetStep() > rec.GetStep() {
		return Checkpointed{Ignored: "found on disk ahead of this generation's progress"}
	}
	var every time.Duration
	if prev.GetGeneration() == r.GetGeneration() && prev.GetReportedAt() != nil {
		every = now.Sub(prev.GetReportedAt().AsTime())
	} else if started := rec.GetStartedAt(); started != nil {
		every = now.Sub(started.AsTime())
	}
	cp := &rdzvv1.Checkpoint{Step: r.GetStep(), Path: r.GetPath(), Generation: r.GetGeneration(), Node: node,
		ReportedAt: timestamppb.New(now), Source: r.GetSource()}
	next := proto.CloneOf(rec)
	next.LatestCheckpoint = cp
	return Checkpointed{Job: next, Checkpoint: cp, Every: every,
		Event: event(next, node, now, EventCheckpoint, "checkpoint step %d complete (%s): %s", r.GetStep(), r.GetSource(), r.GetPath())}
}
