package controller

// Agents' node health check verdicts: eligibility, events, and what a
// failing check does to a running job.

import (
	"time"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// nodeHealth applies the verdicts an agent reports when one changed.
func (c *Controller) nodeHealth(node string, sess *session, results []*rdzvv1.HealthCheckResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ns := c.nodes[node]
	if ns == nil || ns.session != sess {
		return
	}
	c.applyHealth(node, ns, results)
}

// applyHealth records a node's verdicts. They are kept in memory only: the
// agent reports them whenever it registers, and a node that has not
// registered with this leader takes no work anyway. A check that starts
// failing or passes again is an event; a node with a failing check is not
// eligible for new rounds (candidates) and becomes eligible again by
// itself once it passes, unlike a cordon. A failing critical check ends
// the node's running job at once, as a critical GPU fault does (see
// health.StopsRunningJob). Callers hold c.mu.
func (c *Controller) applyHealth(name string, ns *nodeState, results []*rdzvv1.HealthCheckResult) {
	was := map[string]bool{}
	for _, r := range ns.health {
		was[r.GetName()] = r.GetOk()
	}
	recovered := false
	for _, r := range results {
		ok, known := was[r.GetName()]
		switch {
		case !r.GetOk() && (ok || !known):
			ev := newEvent(c.clock.Now(), "", name, 0, EventNodeUnhealthy, "node %s: health check %s failing: %s", name, r.GetName(), r.GetMessage())
			c.writes.persist(c.store.AppendEvent(ev), nil)
			c.log.Warn("node health check failing", zap.String("node", name), zap.String("check", r.GetName()), zap.String("reason", r.GetMessage()))
		case r.GetOk() && known && !ok:
			ev := newEvent(c.clock.Now(), "", name, 0, EventNodeHealthy, "node %s: health check %s passing again", name, r.GetName())
			c.writes.persist(c.store.AppendEvent(ev), nil)
			c.log.Info("node health check passing again", zap.String("node", name), zap.String("check", r.GetName()))
			recovered = true
		}
	}
	ns.health = results
	ns.unhealthy = health.Summary(healthChecks(results))
	if recovered {
		c.wake()
	}
	stop, why := health.StopsRunningJob(healthChecks(results))
	js := c.jobs[ns.job]
	if !stop || js == nil || js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING || js.rec.GetGeneration() != ns.generation {
		return
	}
	latency := time.Duration(0)
	for _, r := range results {
		if !r.GetOk() && r.GetCritical() && r.GetSince() != nil {
			latency = max(c.clock.Now().Sub(r.GetSince().AsTime()), 0)
			break
		}
	}
	c.attemptFailed(js, causeHealthCheck, "node "+name+": health check "+why, latency)
}

// healthChecks is results as health's rules take them.
func healthChecks(results []*rdzvv1.HealthCheckResult) []health.Check {
	out := make([]health.Check, len(results))
	for i, r := range results {
		out[i] = health.Check{Name: r.GetName(), OK: r.GetOk(), Critical: r.GetCritical(), Message: r.GetMessage(), Since: r.GetSince().AsTime()}
	}
	return out
}
