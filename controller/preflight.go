package controller

// The round smoke test (job.yaml health.preflight): nodes it leaves out,
// and the re-planned round.

import (
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/rendezvous"
)

// preflightExcluded records that the smoke test of the job's current
// generation left node out, and plans the round again without it. The
// node stays out of this job's rounds for as long as the job lives (in
// memory: a controller restart forgives); other jobs may still use it.
// Callers hold c.mu.
func (c *Controller) preflightExcluded(js *jobState, node, verdict string) {
	name := js.rec.GetSpec().GetName()
	gen := js.rec.GetGeneration()
	if js.excluded == nil {
		js.excluded = map[string]string{}
	}
	js.excluded[node] = verdict
	ev := c.event(name, node, gen, EventPreflightExcluded, "generation %d: node %s left out by the preflight test: %s", gen, node, verdict)
	c.log.Warn("node left out by the preflight test", zap.String("job", name), zap.String("node", node), zap.String("verdict", verdict))
	if js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING {
		// Another node's verdict already re-planned this generation.
		c.persist(c.store.AppendEvent(ev), nil)
		return
	}
	// Like a failed attempt, every node is told to stop; unlike one, no
	// restart is counted and no backoff waited: the job did nothing wrong,
	// the round was.
	now := c.clock.Now()
	rec := proto.Clone(js.rec).(*rdzvv1.Job)
	c.closeInterval(rec)
	rec.State = rdzvv1.JobState_JOB_STATE_RECOVERING
	if rec.RecoveryStartedAt == nil {
		rec.RecoveryStartedAt = timestamppb.New(now)
	}
	rec.RestartNotBefore = timestamppb.New(now)
	rec.Reason = "re-planning the round without " + node + ", left out by the preflight test"
	js.rec = rec
	js.pendingSince, js.lastCall = time.Time{}, rendezvous.LastCall{}
	c.stopGeneration(js, ev, "generation re-planned: node "+node+" left out by the preflight test")
}
