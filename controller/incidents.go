package controller

// Incident timelines (lifecycle/incidents.go): the phases of a recovery
// that worker and step reports reach.

import (
	"github.com/rdzv/rdzv/controller/lifecycle"
)

// noteWorkersStarted records that every worker of a recovered generation
// runs, and closes the incident if the job reports no steps. Callers hold
// c.mu.
func (c *Controller) noteWorkersStarted(js *jobState) {
	if !lifecycle.AwaitingWorkers(js.rec) || !js.members.AllRunning() {
		return
	}
	if t, ok := lifecycle.WorkersRunning(js.rec, c.clock.Now(), !js.reportsSteps); ok {
		c.apply(js, t)
	}
}

// noteFirstStep records a recovered generation's first step report and
// closes the incident. Callers hold c.mu.
func (c *Controller) noteFirstStep(js *jobState) {
	if t, ok := lifecycle.FirstStep(js.rec, c.clock.Now()); ok {
		c.apply(js, t)
	}
}
