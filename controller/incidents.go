package controller

// Incident timelines: each failure of a running job and the phases of its
// recovery, noted at the decision points that reach them. Phases are set
// in memory and persisted with the job record's next write (the failure's,
// the commit's, and the one that closes the incident), never with a write
// of their own per node.

import (
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const (
	// maxIncidents is how many incidents a job record keeps, newest last.
	maxIncidents = 20
	// maxIncidentReasonBytes bounds an incident's reason (the job's reason
	// holds it whole), so that 20 of them keep a job record small.
	maxIncidentReasonBytes = 256
)

// EventRecovered closes an incident: the job trains again (or, for a job
// that reports no steps, all its workers run).
const EventRecovered = "recovered"

// openIncident adds an incident for the failure of rec's current
// generation, decided now, its fault latency before. Callers hold c.mu.
func (c *Controller) openIncident(rec *rdzvv1.Job, reason string, latency time.Duration) {
	now := c.clock.Now()
	if len(reason) > maxIncidentReasonBytes {
		cut := maxIncidentReasonBytes
		for cut > 0 && !utf8.RuneStart(reason[cut]) {
			cut--
		}
		reason = reason[:cut] + "..."
	}
	rec.Incidents = append(rec.Incidents, &rdzvv1.Incident{
		Generation: rec.GetGeneration(), Reason: reason,
		FaultAt: timestamppb.New(now.Add(-latency)), DetectedAt: timestamppb.New(now),
	})
	if n := len(rec.Incidents); n > maxIncidents {
		rec.Incidents = rec.Incidents[n-maxIncidents:]
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

// noteFenced records that the failed generation of a recovering job is
// fenced, at at (or at its detection, if that was later), if not recorded
// yet. Callers hold c.mu.
func noteFenced(js *jobState, at time.Time) {
	if js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RECOVERING {
		return
	}
	if inc := lastIncident(js.rec, js.rec.GetGeneration()); inc != nil && inc.FencedAt == nil {
		if detected := inc.GetDetectedAt().AsTime(); at.Before(detected) {
			at = detected
		}
		inc.FencedAt = timestamppb.New(at)
	}
}

// noteCommitted records the commit of generation next in rec (a copy of a
// recovering job's record, not updated yet). Callers hold c.mu.
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

// resumed is the incident that js's current generation recovers from,
// if that one is still open.
func resumed(js *jobState) *rdzvv1.Incident {
	n := len(js.rec.GetIncidents())
	if n == 0 || js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING {
		return nil
	}
	if inc := js.rec.Incidents[n-1]; inc.GetNextGeneration() == js.rec.GetGeneration() {
		return inc
	}
	return nil
}

// noteWorkersStarted records that every worker of a recovered generation
// runs, and closes the incident if the job reports no steps. Callers hold
// c.mu.
func (c *Controller) noteWorkersStarted(js *jobState) {
	if inc := resumed(js); inc != nil && inc.StartedAt == nil && allRunning(js) {
		inc.StartedAt = timestamppb.New(c.clock.Now())
		if !js.reportsSteps {
			c.closeIncident(js)
		}
	}
}

// noteFirstStep records a recovered generation's first step report and
// closes the incident. Callers hold c.mu.
func (c *Controller) noteFirstStep(js *jobState) {
	if inc := resumed(js); inc != nil && inc.FirstStepAt == nil {
		inc.FirstStepAt = timestamppb.New(c.clock.Now())
		if inc.StartedAt == nil {
			// A step means every rank joined: the last RUNNING report is
			// still on its way.
			inc.StartedAt = inc.FirstStepAt
		}
		c.closeIncident(js)
	}
}

// closeIncident persists the job record with the finished timeline of
// its newest incident, and says so in an event. Callers hold c.mu.
func (c *Controller) closeIncident(js *jobState) {
	rec := proto.Clone(js.rec).(*rdzvv1.Job)
	inc := rec.Incidents[len(rec.Incidents)-1]
	ev := c.event(rec.GetSpec().GetName(), "", rec.GetGeneration(), EventRecovered, "recovered from the failure of generation %d: %s",
		inc.GetGeneration(), timelineSummary(inc))
	ev.Incident = inc
	js.rec = rec
	c.persist(c.store.UpdateJob(rec, ev), nil)
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
