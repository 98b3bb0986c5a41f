package controller

// Worker reports and the orders that answer them.

import (
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rdzv/rdzv/controller/lifecycle"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// workerStatus applies a worker report from node's stream. The holdings
// an exit carries are taken first, so that a commit the exit completes
// plans from them, and are not kept with the report.
func (c *Controller) workerStatus(node string, w *rdzvv1.WorkerStatus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.GetMemory() != nil {
		c.jobs.exitMemory(c.nodes, node, w)
		w = proto.CloneOf(w)
		w.Memory = nil
	}
	c.applyWorkerStatus(node, w)
}

// exitMemory takes the holdings of w, node's report, when it is the exit
// of the job's current generation on node, a member not lost, reported
// for the first time (jobState.exitMemory says why they count in full).
func (jt jobTable) exitMemory(nt nodeTable, node string, w *rdzvv1.WorkerStatus) {
	js, ns := jt[w.GetJob()], nt[node]
	if js == nil || ns == nil || !lifecycle.TerminalWorker(w.GetState()) || js.rec.GetGeneration() != w.GetGeneration() || !js.members.Member(node) ||
		ns.rec.GetState() == rdzvv1.NodeState_NODE_STATE_LOST || lifecycle.TerminalWorker(js.members.Worker(node).GetState()) {
		return
	}
	js.exitMemory(node, w.GetMemory())
}

// applyWorkerStatus records a worker report and advances the job
// (lifecycle.OnWorkerReport decides). Callers hold c.mu.
func (c *Controller) applyWorkerStatus(node string, w *rdzvv1.WorkerStatus) {
	log := c.log.With(zap.String("node", node), zap.String("job", w.GetJob()), zap.Uint64("generation", w.GetGeneration()))
	js := c.jobs[w.GetJob()]
	var r lifecycle.Report
	if js == nil {
		r = lifecycle.OnWorkerReport(nil, &lifecycle.Members{}, node, w, c.clock.Now())
	} else {
		r = lifecycle.OnWorkerReport(js.rec, &js.members, node, w, c.clock.Now())
	}
	if r.Stop != "" {
		if r.Stale {
			log.Warn("stopping workers of a stale generation")
		}
		c.nodes.sendStop(node, &rdzvv1.StopWorkers{Job: w.GetJob(), Generation: w.GetGeneration(), Reason: r.Stop}, r.StopGrace)
	}
	if !r.Recorded {
		return
	}
	ch := c.store.PutWorker(w.GetJob(), node, w, r.Events...)
	if r.Lazy {
		// A survivor of the failed generation has stopped: the next
		// round's commit supersedes the record, and on a large cluster
		// writing every report first would hold that commit back.
		c.writes.persistLazy(ch)
		if nodes := js.members.Round().GetNodes(); len(nodes) > 0 && nodes[0].GetNode() == node {
			js.probe = startProbe(c.clock, c.nodes.sessionOf(node), node, c.cfg.MasterPortRange)
		}
	} else {
		c.writes.persist(ch, nil)
	}
	if r.AllRunning && !js.reportsSteps {
		if took, ok := js.resumeTraining(c.clock.Now()); ok {
			c.metrics.recovery.Observe(took.Seconds())
		}
	}
	if !r.Exited && lifecycle.AwaitingWorkers(js.rec) && js.members.AllRunning() {
		if t, ok := lifecycle.WorkersRunning(js.rec, c.clock.Now(), !js.reportsSteps); ok {
			c.apply(js, t)
		}
	}
	// One line per node and generation is a line per node per recovery on
	// a large cluster; the generation's events say how it went (every worker
	// running, every worker exited), so only failures are worth a line.
	logAt := log.Debug
	if w.GetState() == rdzvv1.WorkerState_WORKER_STATE_FAILED {
		logAt = log.Info
	}
	logAt("worker status", zap.String("state", w.GetState().String()), zap.Int32("exit_code", w.GetExitCode()), zap.String("signal", w.GetSignal()))
	if !r.Exited {
		// Only an exit moves a job on (advanceJob acts on exits alone), and
		// asking on every start too was a pass over all N nodes per report:
		// O(N²) under c.mu for a generation's N RUNNING reports, which
		// delayed every agent's next message behind them.
		return
	}
	if c.nodes.release(node, js) {
		c.wake()
	}
	if w.GetPreflightExcluded() && js.rec.GetSpec().GetHealthPreflight() != nil {
		c.preflightExcluded(js, node, w.GetMessage())
	}
	c.advanceJob(js, []*rdzvv1.NodeAssignment{js.members.Assignment(node)})
}

// release frees a node whose part in js is over; freed is whether it was
// js's.
func (nt nodeTable) release(node string, js *jobState) (freed bool) {
	ns := nt[node]
	if ns == nil || ns.job != js.rec.GetSpec().GetName() {
		return false
	}
	ns.job, ns.generation = "", 0
	return true
}

// sendStop sends stop to node's agent, within grace if positive (else the
// agent's stop_grace).
func (nt nodeTable) sendStop(node string, stop *rdzvv1.StopWorkers, grace time.Duration) {
	ns := nt[node]
	if ns == nil || ns.session == nil {
		return
	}
	if grace > 0 {
		stop.Grace = durationpb.New(grace)
	}
	ns.session.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_StopWorkers{StopWorkers: stop}})
}
