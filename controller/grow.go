package controller

import (
	"time"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/controller/lifecycle"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/rendezvous"
)

// A job running on fewer than nodes.max nodes (it started short, or a
// failure shrank it) grows back when eligible idle nodes are there: with
// nodes.grow "checkpoint", at each complete checkpoint it reports the
// scheduler checks for such nodes and, if any, stops the generation and
// restarts it on more. Restarting right after a checkpoint recomputes
// nothing; what it costs is one restart (fast with warm standbys, which
// idle nodes keep for running warm jobs). A grow is no failure: no restart
// is counted, no incident opened.
//
// A job whose in-memory checkpoints are replicated
// (checkpoint.memory.replicated) grows at its in-memory steps too: the
// grown generation resumes from the newest one, whatever the world that
// saved it (planMemory), so it recomputes at most the steps since, and it
// need not wait for a durable checkpoint that may be an hour away.
//
// A node that has just come back has no standby yet: joining at once, its
// workers would import torch while every other rank waits. A job that
// checkpoints often enough waits for it
// (joinWait): the next checkpoint comes soon, and by then the standby is
// ready. One that checkpoints rarely grows at once, cold: waiting a whole
// checkpoint interval at reduced width would cost more than a cold start.

// growStandbyWait bounds the wait for a joining node's standby: a grow
// waits for one only while the job's checkpoints come at least this often,
// and never for a node free for this long (one that cannot keep a standby:
// low memory, a slow import).
const growStandbyWait = 30 * time.Second

// joinWait says whether a warm job's grow waits for a joining free node:
// its standby of the job is not ready, the job's checkpoints come every
// cadence (0: unknown), and the node has been seen free for seenFor.
func joinWait(warm bool, readyStandby, job string, cadence, seenFor time.Duration) bool {
	return warm && readyStandby != job && cadence > 0 && cadence <= growStandbyWait && seenFor < growStandbyWait
}

// noteGrowable marks a running job to be checked for growth on the next
// scheduling pass: it just recorded a complete checkpoint, the cheapest
// moment to restart. It returns whether it did (the scheduler has work).
func (js *jobState) noteGrowable() bool {
	spec := js.rec.GetSpec()
	if spec.GetNodesGrow() != jobspec.GrowCheckpoint || len(js.members.Round().GetNodes()) >= int(spec.GetNodesMax()) {
		return false
	}
	js.growCheck = true
	return true
}

// noteMemoryStep notes, for a job whose in-memory state is replicated,
// the newest in-memory step of its current generation that held (a
// member's progress report) names, at now. It returns whether that step is
// newer than any before: a moment to grow (noteGrowable).
func (js *jobState) noteMemoryStep(held []*rdzvv1.MemoryHeld, now time.Time) bool {
	if !js.rec.GetSpec().GetCheckpointMemory().GetReplicated() {
		return false
	}
	newest := js.memNewest
	for _, h := range held {
		if h.GetGeneration() == js.rec.GetGeneration() {
			newest = max(newest, h.GetStep())
		}
	}
	if newest == js.memNewest {
		return false
	}
	if !js.memNewestAt.IsZero() {
		js.memEvery = now.Sub(js.memNewestAt)
	}
	js.memNewest, js.memNewestAt = newest, now
	return true
}

// growCadence is how often the job offers a moment to grow: its durable
// checkpoints' interval or, if shorter, its replicated in-memory steps';
// 0 while neither is known.
func (js *jobState) growCadence() time.Duration {
	if js.memEvery > 0 && (js.ckptEvery == 0 || js.memEvery < js.ckptEvery) {
		return js.memEvery
	}
	return js.ckptEvery
}

// growChecks lists the running jobs marked by noteGrowable, oldest first.
func (jt jobTable) growChecks() []*jobState {
	var out []*jobState
	for _, js := range jt {
		if !js.growCheck {
			continue
		}
		if js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING {
			js.growCheck = false
			continue
		}
		out = append(out, js)
	}
	sortOldestFirst(out)
	return out
}

// growJobs checks the marked jobs: each grows onto the free candidates no
// pending job took (taken) and no job holds as a spare (held), unless a
// job is still waiting for nodes (it has them first). Callers hold c.mu.
func (c *Controller) growJobs(check []*jobState, candidates []rendezvous.Candidate, taken map[string]bool, held map[string]string, waiting bool) {
	now := c.clock.Now()
	for _, js := range check {
		js.growCheck = false
		if waiting {
			continue
		}
		req := requirements(js.rec.GetSpec())
		name := js.rec.GetSpec().GetName()
		warm := c.jobs.warm(name)
		avail := make([]rendezvous.Candidate, 0, len(candidates))
		seen := map[string]time.Time{}
		wait := false
		for _, cand := range candidates {
			if taken[cand.Name] || held[cand.Name] != "" || js.excluded[cand.Name] != "" {
				continue
			}
			avail = append(avail, cand)
			if ok, _ := rendezvous.Eligible(req, cand); !ok || !warm {
				continue
			}
			first, ok := js.growSeen[cand.Name]
			if !ok {
				first = now
			}
			seen[cand.Name] = first
			ready := ""
			if ns := c.nodes[cand.Name]; ns != nil && ns.session != nil {
				ready = ns.session.readyStandby()
			}
			wait = wait || joinWait(warm, ready, name, js.growCadence(), now.Sub(first))
		}
		// Only the nodes free now: a node busy in between starts afresh.
		js.growSeen = seen
		if wait {
			continue
		}
		from := len(js.members.Round().GetNodes())
		to, ok := rendezvous.Grow(req, from, avail)
		if !ok {
			continue
		}
		// The nodes a later job in this pass must not count on. Min 0
		// cannot fall short: Plan never fails here.
		req.Min, req.Max = 0, to-from
		joining, _ := rendezvous.Plan(req, avail)
		for _, p := range joining {
			taken[p.Name] = true
		}
		c.grow(js, to)
	}
}

// grow stops the current generation of a running job so that it restarts
// on to nodes, from the checkpoint it just recorded or, with replicated
// in-memory checkpoints, the newest in-memory step (lifecycle.Grow). The
// restart commits as soon as to nodes are ready, or after
// rendezvous.last_call with fewer. Callers hold c.mu.
func (c *Controller) grow(js *jobState, to int) {
	from := len(js.members.Round().GetNodes())
	now := c.clock.Now()
	c.log.Info("growing job", zap.String("job", js.rec.GetSpec().GetName()), zap.Uint64("generation", js.rec.GetGeneration()), zap.Int("from_nodes", from),
		zap.Int("to_nodes", to), zap.Uint64("checkpoint_step", js.rec.GetLatestCheckpoint().GetStep()))
	c.apply(js, lifecycle.Grow(js.rec, from, to, js.rec.GetSpec().GetCheckpointMemory().GetReplicated(), now))
	js.growTo, js.grew, js.growSeen = to, true, nil
	js.pendingSince, js.lastCall = time.Time{}, rendezvous.LastCall{}
	js.lastCall.OpenAt(now)
	c.metrics.grows.Inc()
}
