package controller

// Worker reports and the orders that answer them.

import (
	"fmt"

	"go.uber.org/zap"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func (c *Controller) workerStatus(node string, w *rdzvv1.WorkerStatus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.applyWorkerStatus(node, w)
}

// applyWorkerStatus records a worker report and advances the job. Reports
// for another generation, or for a job that no longer runs, are answered by
// telling the agent to kill those workers: only the current generation of a
// running job may have live workers. Callers hold c.mu.
func (c *Controller) applyWorkerStatus(node string, w *rdzvv1.WorkerStatus) {
	log := c.log.With(zap.String("node", node), zap.String("job", w.GetJob()), zap.Uint64("generation", w.GetGeneration()))
	js := c.jobs[w.GetJob()]
	alive := !terminalWorker(w.GetState())
	current := js != nil && js.rec.GetGeneration() == w.GetGeneration() && js.round != nil && inRound(js.round, node)
	if !current {
		if alive {
			log.Warn("stopping workers of a stale generation")
			c.sendStop(node, w.GetJob(), w.GetGeneration(), "stale generation")
		}
		return
	}
	if alive && js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING {
		c.sendStop(node, w.GetJob(), w.GetGeneration(), "job is "+stateName(js.rec.GetState()))
	}
	prev := js.workers[node]
	if prev.GetState() == w.GetState() || terminalWorker(prev.GetState()) {
		return
	}
	var ev *rdzvv1.Event
	if alive {
		ev = c.event(js.rec.GetSpec().GetName(), node, w.GetGeneration(), EventWorkerStarted, "workers started on %s", node)
	} else {
		ev = c.event(js.rec.GetSpec().GetName(), node, w.GetGeneration(), EventWorkerExited, "workers on %s %s", node, describeExit(w))
	}
	js.workers[node] = w
	c.persist(c.store.PutWorker(w.GetJob(), node, w, ev), nil)
	if alive && !js.reportsSteps && allRunning(js) {
		c.resumeTraining(js)
	}
	log.Info("worker status", zap.String("state", w.GetState().String()), zap.Int32("exit_code", w.GetExitCode()), zap.String("signal", w.GetSignal()))
	if !alive {
		c.release(node, js)
	}
	c.advanceJob(js)
}

func describeExit(w *rdzvv1.WorkerStatus) string {
	var what string
	switch {
	case w.GetState() == rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED:
		return "succeeded"
	case w.GetSignal() != "":
		what = "killed by signal " + w.GetSignal()
	default:
		what = fmt.Sprintf("exited with code %d", w.GetExitCode())
	}
	if w.GetMessage() != "" {
		what += " (" + w.GetMessage() + ")"
	}
	return what
}

// release frees a node whose part in js is over.
func (c *Controller) release(node string, js *jobState) {
	if ns := c.nodes[node]; ns != nil && ns.job == js.rec.GetSpec().GetName() {
		ns.job, ns.generation = "", 0
		c.wake()
	}
}

func allRunning(js *jobState) bool {
	for _, a := range js.round.GetNodes() {
		if js.workers[a.GetNode()].GetState() != rdzvv1.WorkerState_WORKER_STATE_RUNNING {
			return false
		}
	}
	return true
}

func inRound(r *rdzvv1.Round, node string) bool {
	for _, a := range r.GetNodes() {
		if a.GetNode() == node {
			return true
		}
	}
	return false
}

func (c *Controller) sendStop(node, job string, generation uint64, reason string) {
	ns := c.nodes[node]
	if ns == nil || ns.session == nil {
		return
	}
	ns.session.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_StopWorkers{StopWorkers: &rdzvv1.StopWorkers{
		Job: job, Generation: generation, Reason: reason,
	}}})
}
