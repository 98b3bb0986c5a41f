package controller

// The round smoke test (job.yaml health.preflight): nodes it leaves out,
// and the re-planned round.

import (
	"time"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/controller/lifecycle"
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
	if js.excluded == nil {
		js.excluded = map[string]string{}
	}
	js.excluded[node] = verdict
	c.log.Warn("node left out by the preflight test", zap.String("job", name), zap.String("node", node), zap.String("verdict", verdict))
	replan := js.rec.GetState() == rdzvv1.JobState_JOB_STATE_RUNNING
	c.apply(js, lifecycle.Replan(js.rec, node, verdict, c.clock.Now()))
	if replan {
		js.pendingSince, js.lastCall = time.Time{}, rendezvous.LastCall{}
	}
}
