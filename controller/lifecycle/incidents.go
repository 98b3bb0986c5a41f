package lifecycle

// Incident timelines: each failure of a running job and the phases of its
// recovery. Fail opens one and Committed notes the commit in the record
// they return; the phases in between (fenced, workers running, first
// step) are noted in the live record and written with its next write,
// never with a write of their own per node.

import (
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const (
	// MaxIncidents is how many incidents a job record keeps, newest last.
	MaxIncidents = 20
	// MaxIncidentReasonBytes bounds an incident's reason (the job's reason
	// holds it whole; a cut one ends in "..."), so that 20 of them keep a
	// job record small.
	MaxIncidentReasonBytes = 256
)

// openIncident adds to rec an incident for the failure of its current
// generation, decided now, its fault latency before.
func openIncident(rec *rdzvv1.Job, reason string, latency time.Duration, now time.Time) {
	if len(reason) > MaxIncidentReasonBytes {
		cut := MaxIncidentReasonBytes
		for cut > 0 && !utf8.RuneStart(reason[cut]) {
			cut--
		}
		reason = reason[:cut] + "..."
	}
	rec.Incidents = append(rec.Incidents, &rdzvv1.Incident{
		Generation: rec.GetGeneration(), Reason: reason,
		FaultAt: timestamppb.New(now.Add(-latency)), DetectedAt: timestamppb.New(now),
	})
	if n := len(rec.Incidents); n > MaxIncidents {
		rec.Incidents = rec.Incidents[n-MaxIncidents:]
	}
}

// lastIncident is the job's newest incident if the generation that failed
// in it is gen, or nil.
func lastIncident(rec *rdzvv1.Job, gen uint64) *rdzvv1.Incident {
	if n := len(rec.GetIncidents()); n > 0 && rec.Incidents[n-1].GetGeneration() == gen {
		return rec.Incidents[n-1]
	}
	return nil
}

// NoteFenced records in rec, a recovering job's live record, that its
// failed generation is fenced, at at (or at its detection, if that was
// later), if not recorded yet.
func NoteFenced(rec *rdzvv1.Job, at time.Time) {
	if rec.GetState() != rdzvv1.JobState_JOB_STATE_RECOVERING {
		return
	}
	if inc := lastIncident(rec, rec.GetGeneration()); inc != nil && inc.FencedAt == nil {
		if detected := inc.GetDetectedAt().AsTime(); at.Before(detected) {
			at = detected
		}
		inc.FencedAt = timestamppb.New(at)
	}
}

// noteCommitted records the commit of generation next in rec (a copy of a
// recovering job's record, not updated yet).
func noteCommitted(rec *rdzvv1.Job, next uint64, now time.Time) {
	inc := lastIncident(rec, rec.GetGeneration())
	if rec.GetState() != rdzvv1.JobState_JOB_STATE_RECOVERING || inc == nil {
		return
	}
	if inc.FencedAt == nil {
		// Fenced without this controller seeing it happen (a new leader
		// found it so): it was by the commit at the latest.
		inc.FencedAt = timestamppb.New(now)
	}
	inc.NextGeneration, inc.CommittedAt = next, timestamppb.New(now)
}

// resumed is the incident that rec's current generation recovers from,
// if that one is still open.
func resumed(rec *rdzvv1.Job) *rdzvv1.Incident {
	n := len(rec.GetIncidents())
	if n == 0 || rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING {
		return nil
	}
	if inc := rec.Incidents[n-1]; inc.GetNextGeneration() == rec.GetGeneration() {
		return inc
	}
	return nil
}

// AwaitingWorkers reports whether rec's current generation recovers from
// an open incident and not all its workers were seen running yet: only
// then is WorkersRunning worth a look at the whole round.
func AwaitingWorkers(rec *rdzvv1.Job) bool {
	inc := resumed(rec)
	return inc != nil && inc.StartedAt == nil
}

// WorkersRunning notes in rec, a running job's live record, that every
// worker of the generation that recovers from its open incident runs. For
// a job that reports no steps (closes) that ends the incident: ok is true
// and t closes it.
func WorkersRunning(rec *rdzvv1.Job, now time.Time, closes bool) (t Transition, ok bool) {
	if !AwaitingWorkers(rec) {
		return Transition{}, false
	}
	resumed(rec).StartedAt = timestamppb.New(now)
	if !closes {
		return Transition{}, false
	}
	return recovered(rec, now), true
}

// FirstStep notes in rec, a running job's live record, the first step
// report of the generation that recovers from its open incident, and
// returns the transition closing it; ok is false when no incident is
// open or its first step was noted already.
func FirstStep(rec *rdzvv1.Job, now time.Time) (t Transition, ok bool) {
	inc := resumed(rec)
	if inc == nil || inc.FirstStepAt != nil {
		return Transition{}, false
	}
	inc.FirstStepAt = timestamppb.New(now)
	if inc.StartedAt == nil {
		// A step means every rank joined: the last RUNNING report is
		// still on its way.
		inc.StartedAt = inc.FirstStepAt
	}
	return recovered(rec, now), true
}

// recovered writes rec with the finished timeline of its newest incident
// and says so in an event.
func recovered(rec *rdzvv1.Job, now time.Time) Transition {
	next := proto.CloneOf(rec)
	inc := next.Incidents[len(next.Incidents)-1]
	ev := event(next, "", now, EventRecovered, "recovered from the failure of generation %d: %s", inc.GetGeneration(), timelineSummary(inc))
	ev.Incident = inc
	return Transition{Job: next, Event: ev}
}

// timelineSummary says how long after detection each phase of inc was
// reached, e.g. "detected 1.2s after the fault, fenced +0.4s, committed
// +5.1s, started +7s, first step +12s".
func timelineSummary(inc *rdzvv1.Incident) string {
	detected := inc.GetDetectedAt().AsTime()
	s := fmt.Sprintf("detected %s after the fault", detected.Sub(inc.GetFaultAt().AsTime()).Round(time.Millisecond))
	for _, p := range []struct {
		name string
		at   *timestamppb.Timestamp
	}{{"fenced", inc.GetFencedAt()}, {"committed", inc.GetCommittedAt()}, {"started", inc.GetStartedAt()}, {"first step", inc.GetFirstStepAt()}} {
		if p.at != nil {
			s += fmt.Sprintf(", %s +%s", p.name, p.at.AsTime().Sub(detected).Round(time.Millisecond))
		}
	}
	return s
}
