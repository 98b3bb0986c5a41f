package controller

// Worker reports and the orders that answer them.

import (
	"fmt"
	"strings"
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
		c.exitMemory(node, w)
		w = proto.CloneOf(w)
		w.Memory = nil
	}
	c.applyWorkerStatus(node, w)
}

// exitMemory takes the holdings of w, node's report, when it is the exit
// of the job's current generation on node, a member not lost, reported
// for the first time (jobState.exitMemory says why they count in full).
// Callers hold c.mu.
func (c *Controller) exitMemory(node string, w *rdzvv1.WorkerStatus) {
	js, ns := c.jobs[w.GetJob()], c.nodes[node]
	if js == nil || ns == nil || !terminalWorker(w.GetState()) || js.rec.GetGeneration() != w.GetGeneration() || !js.member(node) ||
		ns.rec.GetState() == rdzvv1.NodeState_NODE_STATE_LOST || terminalWorker(js.workers[node].GetState()) {
		return
	}
	js.exitMemory(node, w.GetMemory())
}

// applyWorkerStatus records a worker report and advances the job. Reports
// for another generation, or for a job that no longer runs, are answered by
// telling the agent to kill those workers: only the current generation of a
// running job may have live workers. Callers hold c.mu.
func (c *Controller) applyWorkerStatus(node string, w *rdzvv1.WorkerStatus) {
	log := c.log.With(zap.String("node", node), zap.String("job", w.GetJob()), zap.Uint64("generation", w.GetGeneration()))
	js := c.jobs[w.GetJob()]
	alive := !terminalWorker(w.GetState())
	current := js != nil && js.rec.GetGeneration() == w.GetGeneration() && js.member(node)
	if !current {
		if alive {
			log.Warn("stopping workers of a stale generation")
			c.sendStop(node, &rdzvv1.StopWorkers{Job: w.GetJob(), Generation: w.GetGeneration(), Reason: "stale generation"}, lifecycle.FailedStopGrace)
		}
		return
	}
	if alive && js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING {
		c.sendStop(node, &rdzvv1.StopWorkers{Job: w.GetJob(), Generation: w.GetGeneration(), Reason: "job is " + stateName(js.rec.GetState())}, 0)
	}
	prev := js.workers[node]
	if prev.GetState() == w.GetState() || terminalWorker(prev.GetState()) {
		return
	}
	js.workers[node] = w
	switch w.GetState() {
	case rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED:
		js.succeeded.note(js)
	case rdzvv1.WorkerState_WORKER_STATE_FAILED:
		js.failed.note(js)
	}
	ch := c.store.PutWorker(w.GetJob(), node, w, c.workerEvents(js, node, w)...)
	if !alive && js.rec.GetState() == rdzvv1.JobState_JOB_STATE_RECOVERING {
		// A survivor of the failed generation has stopped: the next
		// round's commit supersedes the record, and on a large cluster
		// writing every report first would hold that commit back.
		c.persistLazy(ch)
		if nodes := js.round.GetNodes(); len(nodes) > 0 && nodes[0].GetNode() == node {
			c.probeAhead(js, node)
		}
	} else {
		c.persist(ch, nil)
	}
	if alive && !js.reportsSteps && allRunning(js) {
		c.resumeTraining(js)
	}
	if alive {
		c.noteWorkersStarted(js)
	}
	// One line per node and generation is a line per node per recovery on
	// a large cluster; the generation's events say how it went (every worker
	// running, every worker exited), so only failures are worth a line.
	logAt := log.Debug
	if w.GetState() == rdzvv1.WorkerState_WORKER_STATE_FAILED {
		logAt = log.Info
	}
	logAt("worker status", zap.String("state", w.GetState().String()), zap.Int32("exit_code", w.GetExitCode()), zap.String("signal", w.GetSignal()))
	if alive {
		// Only an exit moves a job on (advanceJob acts on exits alone), and
		// asking on every start too was a pass over all N nodes per report:
		// O(N²) under c.mu for a generation's N RUNNING reports, which
		// delayed every agent's next message behind them.
		return
	}
	c.release(node, js)
	if w.GetPreflightExcluded() && js.rec.GetSpec().GetHealthPreflight() != nil {
		c.preflightExcluded(js, node, w.GetMessage())
	}
	c.advanceJobAfter(js, []*rdzvv1.NodeAssignment{js.assignment(node)})
}

// maxFailureEvents bounds the worker_failed events of one generation: when
// a collective breaks, every rank's launcher fails within moments, and
// thousands of events of one failure would be as many etcd writes and
// would push the job's history (maxJobEvents) out. workers_exited counts
// the failures not listed.
const maxFailureEvents = 16

// workerEvents are the events that a worker report, now in js.workers,
// adds to the job's history: the generation's phases (every worker
// running, every worker exited), once each, and the failure of this
// node's workers while fewer than maxFailureEvents of the generation
// were listed. A report that only moves one node along adds none, so a
// generation of N nodes costs two events, not 2N. Each phase is reached by
// exactly one report, as a worker's state only moves forward (see
// applyWorkerStatus), and the events are written with that report: a
// controller taking over sees the phase's event exactly when it sees the
// report. Callers hold c.mu.
func (c *Controller) workerEvents(js *jobState, node string, w *rdzvv1.WorkerStatus) []*rdzvv1.Event {
	job, gen := js.rec.GetSpec().GetName(), w.GetGeneration()
	var evs []*rdzvv1.Event
	if w.GetState() == rdzvv1.WorkerState_WORKER_STATE_FAILED && js.failed.get(js, rdzvv1.WorkerState_WORKER_STATE_FAILED) <= maxFailureEvents {
		evs = append(evs, c.event(job, node, gen, EventWorkerFailed, "workers on %s %s", node, lifecycle.DescribeExit(w)))
	}
	switch {
	case w.GetState() == rdzvv1.WorkerState_WORKER_STATE_RUNNING:
		if allRunning(js) {
			evs = append(evs, c.event(job, "", gen, EventWorkersRunning, "generation %d: workers running on all %d nodes", gen, len(js.round.GetNodes())))
		}
	case terminalWorker(w.GetState()):
		if allExited(js) {
			evs = append(evs, c.event(job, "", gen, EventWorkersExited, "generation %d: workers exited on all %d nodes: %s", gen, len(js.round.GetNodes()), exitSummary(js)))
		}
	}
	return evs
}

// exitSummary counts how the workers of js's round ended, e.g. "9999
// stopped, 1 failed (listed in worker_failed events)", for workers_exited.
// One pass over the round, once per generation. Callers hold c.mu.
func exitSummary(js *jobState) string {
	var succeeded, failed, stopped int
	for _, a := range js.round.GetNodes() {
		switch js.workers[a.GetNode()].GetState() {
		case rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED:
			succeeded++
		case rdzvv1.WorkerState_WORKER_STATE_FAILED:
			failed++
		case rdzvv1.WorkerState_WORKER_STATE_STOPPED:
			stopped++
		}
	}
	var parts []string
	if succeeded > 0 {
		parts = append(parts, fmt.Sprintf("%d succeeded", succeeded))
	}
	if stopped > 0 {
		parts = append(parts, fmt.Sprintf("%d stopped", stopped))
	}
	switch {
	case failed > maxFailureEvents:
		parts = append(parts, fmt.Sprintf("%d failed (the first %d listed in worker_failed events, %d not)", failed, maxFailureEvents, failed-maxFailureEvents))
	case failed > 0:
		parts = append(parts, fmt.Sprintf("%d failed (listed in worker_failed events)", failed))
	}
	return strings.Join(parts, ", ")
}

// release frees a node whose part in js is over.
func (c *Controller) release(node string, js *jobState) {
	if ns := c.nodes[node]; ns != nil && ns.job == js.rec.GetSpec().GetName() {
		ns.job, ns.generation = "", 0
		c.wake()
	}
}

func allRunning(js *jobState) bool {
	return !lifecycle.Find(js.round, &js.notRunningAt, func(a *rdzvv1.NodeAssignment) bool {
		return js.workers[a.GetNode()].GetState() != rdzvv1.WorkerState_WORKER_STATE_RUNNING
	})
}

// allExited reports whether the workers of every node of js's round have
// exited (or their node was lost, which records them failed).
func allExited(js *jobState) bool {
	return !lifecycle.Find(js.round, &js.notStoppedAt, func(a *rdzvv1.NodeAssignment) bool {
		return !terminalWorker(js.workers[a.GetNode()].GetState())
	})
}

// member reports whether node is in the job's current round. Callers hold
// c.mu.
func (js *jobState) member(node string) bool { return js.assignment(node) != nil }

// assignment is node's part in the job's current round, nil if none. Every
// worker report asks, so the round's nodes are indexed, anew whenever
// js.round is replaced: a search through the round per report was O(N²)
// under c.mu for a burst of N reports. Callers hold c.mu.
func (js *jobState) assignment(node string) *rdzvv1.NodeAssignment {
	if js.membersOf != js.round {
		js.members = make(map[string]*rdzvv1.NodeAssignment, len(js.round.GetNodes()))
		for _, a := range js.round.GetNodes() {
			js.members[a.GetNode()] = a
		}
		js.membersOf = js.round
	}
	return js.members[node]
}

// stateCount counts the nodes of a round whose workers are in one state:
// counted once per round (the round and its workers are replaced
// together), then kept by note, so that a report need not pass over the
// round (O(N²) under c.mu for a generation's N reports). Callers hold c.mu.
type stateCount struct {
	of *rdzvv1.Round
	n  int
}

// get is the count of js's round in state s, the one state whose entries
// the caller notes.
func (sc *stateCount) get(js *jobState, s rdzvv1.WorkerState) int {
	if sc.of != js.round {
		sc.n = 0
		for _, a := range js.round.GetNodes() {
			if js.workers[a.GetNode()].GetState() == s {
				sc.n++
			}
		}
		sc.of = js.round
	}
	return sc.n
}

// note counts a member's workers that just entered the state, once
// js.workers holds the report. Until the round is counted, the count will
// include it.
func (sc *stateCount) note(js *jobState) {
	if sc.of == js.round {
		sc.n++
	}
}

// sendStop sends stop to node's agent, within grace if positive (else the
// agent's stop_grace). Callers hold c.mu.
func (c *Controller) sendStop(node string, stop *rdzvv1.StopWorkers, grace time.Duration) {
	ns := c.nodes[node]
	if ns == nil || ns.session == nil {
		return
	}
	if grace > 0 {
		stop.Grace = durationpb.New(grace)
	}
	ns.session.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_StopWorkers{StopWorkers: stop}})
}
