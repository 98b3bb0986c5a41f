package controller

import (
	"time"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/controller/lifecycle"
	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/rendezvous"
	"github.com/rdzv/rdzv/wire"
)

// catalogSize bounds the checkpoint catalog kept in etcd per job.
const catalogSize = 32

// fencedAt is when no worker of the job's current generation can still be
// running (lifecycle.FencedAt), from what this controller knows of the
// round's nodes.
func (nt nodeTable) fencedAt(js *jobState) (at time.Time, ok bool) {
	return js.members.FencedAt(func(node string, running bool) lifecycle.Member {
		ns := nt[node]
		switch {
		case ns == nil:
			return lifecycle.Member{}
		case ns.rec.GetState() == rdzvv1.NodeState_NODE_STATE_LOST:
			return lifecycle.Member{FencedBy: ns.fencedBy}
		}
		return lifecycle.Member{Running: running}
	})
}

// fenced reports whether the job's current generation is fenced by now.
func (nt nodeTable) fenced(js *jobState, now time.Time) bool {
	at, ok := nt.fencedAt(js)
	return ok && !now.Before(at)
}

// detectionLatency is how long before now w's workers exited: the time
// their exit took to be noticed, reported and decided on.
func detectionLatency(w *rdzvv1.WorkerStatus, now time.Time) time.Duration {
	if w.GetExitedAt() == nil {
		return 0
	}
	return max(now.Sub(w.GetExitedAt().AsTime()), 0)
}

// resumeTraining marks a restarted generation as training again
// (lifecycle.ResumeTraining). It returns how long the recovery took, ok
// false if the job was not recovering or restarted to grow (no recovery
// from a fault).
func (js *jobState) resumeTraining(now time.Time) (took time.Duration, ok bool) {
	took, ok = lifecycle.ResumeTraining(js.rec, now)
	grew := js.grew
	js.grew = js.grew && !ok
	return took, ok && !grew
}

// attemptFailed ends the current generation of a running job
// (lifecycle.Fail): it is fenced (every node is told to kill its
// workers), and the job either waits out its backoff to re-rendezvous and
// resume from the latest complete checkpoint, or fails for good when
// restarts are used up or it is crash looping. Callers hold c.mu.
func (c *Controller) attemptFailed(js *jobState, cause, reason string, latency time.Duration) {
	now := c.clock.Now()
	t := lifecycle.Fail(js.rec, lifecycle.Failure{Reason: reason, Latency: latency, Progressed: js.progressed}, now)
	restarting := t.Job.GetState() == rdzvv1.JobState_JOB_STATE_RECOVERING
	c.metrics.attemptFailed(js, cause, latency, now, restarting)
	if at, ok := c.nodes.fencedAt(js); ok && !at.After(now) {
		lifecycle.NoteFenced(t.Job, now) // every worker had exited already
	}
	c.apply(js, t)
	if !restarting {
		return
	}
	js.grew = false
	// The rendezvous timeout runs from when the job can rendezvous again
	// (stopped everywhere, backoff over), not from the failure.
	// Its last call for more nodes runs from now: nodes that come back
	// while the failed generation is being fenced have had their chance,
	// and waiting the window again after the fencing would only add to the
	// outage.
	js.pendingSince, js.lastCall = time.Time{}, rendezvous.LastCall{}
	js.lastCall.OpenAt(now)
	c.log.Warn("attempt failed, recovering", zap.String("job", js.rec.GetSpec().GetName()), zap.Uint64("generation", js.rec.GetGeneration()),
		zap.String("reason", reason), zap.Duration("detection_latency", latency),
		zap.Duration("backoff", js.rec.GetRestartNotBefore().AsTime().Sub(now)))
}

// progress records a training step report: the step, the node's phase and
// the metrics. It lives in memory only: at one report per node per
// heartbeat it would be the bulk of etcd's writes.
func (c *Controller) progress(node string, p *rdzvv1.Progress) {
	c.mu.Lock()
	defer c.mu.Unlock()
	js := c.jobs[p.GetJob()]
	if js == nil || js.rec.GetGeneration() != p.GetGeneration() || js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING || !js.members.Member(node) {
		return
	}
	js.memoryHeld(node, p.GetMemory())
	now := c.clock.Now()
	if js.noteMemoryStep(p.GetMemory(), now) && js.noteGrowable() {
		c.wake()
	}
	stepAt := health.StepDated(now, p.GetAge().AsDuration(), c.cfg.Heartbeat.Timeout.Duration)
	if advanced, first := js.noteProgress(node, p, now, stepAt); advanced {
		if first {
			c.metrics.firstStep(js, now)
		}
		if took, ok := js.resumeTraining(now); ok {
			c.metrics.recovery.Observe(took.Seconds())
		}
		if t, ok := lifecycle.FirstStep(js.rec, now); ok {
			c.apply(js, t)
		}
	}
	// The report may have started the job's steps clock or a save's, so
	// its first deadline or an earlier one.
	_, since, timeout := js.hangTimeout()
	c.wakeHangPassBy(health.HangAt(since, timeout))
}

// checkpoint adds a complete checkpoint to the job's catalog, as
// lifecycle.OnCheckpoint decides.
func (c *Controller) checkpoint(node string, r *rdzvv1.CheckpointReport) {
	c.mu.Lock()
	defer c.mu.Unlock()
	log := c.log.With(zap.String("node", node), zap.String("job", r.GetJob()), zap.Uint64("generation", r.GetGeneration()), zap.Uint64("step", r.GetStep()))
	js := c.jobs[r.GetJob()]
	var d lifecycle.Checkpointed
	if js == nil {
		d = lifecycle.OnCheckpoint(nil, node, false, false, r, c.clock.Now())
	} else {
		d = lifecycle.OnCheckpoint(js.rec, node, js.members.Member(node), js.reportsSteps, r, c.clock.Now())
	}
	switch {
	case d.Stale:
		log.Warn("ignoring checkpoint from a stale generation")
		return
	case d.Ignored != "":
		log.Info("ignoring checkpoint", zap.String("reason", d.Ignored), zap.Uint64("progress_step", js.rec.GetStep()))
		return
	case d.Job == nil:
		return
	}
	if err := checkpointPathOK(js.rec.GetSpec().GetCheckpointDir(), r.GetPath()); err != nil {
		log.Warn("ignoring checkpoint with a bad path", zap.String("path", r.GetPath()), zap.Error(err))
		return
	}
	js.ckptEvery = d.Every
	var keepFrom uint64
	if n := len(js.catalog); n >= catalogSize {
		keepFrom = js.catalog[n-catalogSize+1]
	}
	js.rec = d.Job
	c.writes.persist(c.store.RecordCheckpoint(d.Job, d.Checkpoint, keepFrom, d.Event), nil)
	js.catalog = append(js.catalog, r.GetStep())
	if len(js.catalog) > catalogSize {
		js.catalog = js.catalog[len(js.catalog)-catalogSize:]
	}
	js.progressed = true
	c.metrics.checkpoints.Inc()
	log.Info("checkpoint recorded", zap.String("path", r.GetPath()), zap.String("source", r.GetSource()))
	if js.noteGrowable() {
		c.wake()
	}
}

func checkpointPathOK(dir, path string) error {
	if fe := wire.CheckPath("checkpoint.path", path, dir); fe != nil {
		return fe
	}
	return nil
}

// checkHangs restarts running jobs whose training stopped advancing, each
// by the timeout of the phase it is in (hangTimeout), and returns when the
// next of the others would be hung if nothing changes; zero if none can
// be. Callers hold c.mu.
func (c *Controller) checkHangs(now time.Time) (next time.Time) {
	for _, js := range c.jobs {
		if js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING {
			continue
		}
		phase, since, timeout := js.hangTimeout()
		if stalled, hung := health.Hang(now, since, timeout); hung {
			c.attemptFailed(js, causeHang, hangReason(js, phase, stalled, timeout), stalled-timeout)
		} else if at := health.HangAt(since, timeout); !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	return next
}
