package lifecycle

import (
	"fmt"
	"strings"
	"time"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Event kinds of a generation's workers, stable for `rdzvctl events -o
// json`.
const (
	EventWorkersRunning = "workers_running"
	EventWorkersExited  = "workers_exited"
	EventWorkerFailed   = "worker_failed"
)

// MaxFailureEvents bounds the worker_failed events of one generation: when
// a collective breaks, every rank's launcher fails within moments, and
// thousands of events of one failure would be as many etcd writes and
// would push the job's history out. workers_exited counts the failures not
// listed.
const MaxFailureEvents = 16

// Members is a job's current round and the latest report of each of its
// nodes' workers. The round and its workers are replaced together, by
// Reset, and with them the index and counts that keep one report's
// handling O(1): a pass over the round per report would be O(N²) for a
// generation's N reports. The zero value has no round. Its owner guards
// it (the controller's lock).
type Members struct {
	round   *rdzvv1.Round
	workers map[string]*rdzvv1.WorkerStatus
	// index maps the round's nodes to their assignments; nil until the
	// first lookup after Reset.
	index map[string]*rdzvv1.NodeAssignment
	// counted is set once succeeded and failed count the round's nodes in
	// those states; Report keeps them from then on.
	counted           bool
	succeeded, failed int
	// Where the last scans of the round for a worker not yet running, and
	// for one not yet stopped, found one (see Find).
	notRunningAt, notStoppedAt int
}

// Reset makes round the current one, with workers (node to its latest
// report, possibly of nodes no longer in the round; nil for none), which
// m owns from then on.
func (m *Members) Reset(round *rdzvv1.Round, workers map[string]*rdzvv1.WorkerStatus) {
	*m = Members{round: round, workers: workers}
}

// Round is the current round, nil before the first.
func (m *Members) Round() *rdzvv1.Round { return m.round }

// Worker is node's latest report, nil if none.
func (m *Members) Worker(node string) *rdzvv1.WorkerStatus { return m.workers[node] }

// Assignment is node's part in the current round, nil if none.
func (m *Members) Assignment(node string) *rdzvv1.NodeAssignment {
	if m.index == nil {
		m.index = make(map[string]*rdzvv1.NodeAssignment, len(m.round.GetNodes()))
		for _, a := range m.round.GetNodes() {
			m.index[a.GetNode()] = a
		}
	}
	return m.index[node]
}

// Member reports whether node is in the current round.
func (m *Members) Member(node string) bool { return m.Assignment(node) != nil }

// Succeeded counts the round's nodes whose workers succeeded.
func (m *Members) Succeeded() int { m.count(); return m.succeeded }

// Failed counts the round's nodes whose workers failed.
func (m *Members) Failed() int { m.count(); return m.failed }

func (m *Members) count() {
	if m.counted {
		return
	}
	m.succeeded, m.failed = 0, 0
	for _, a := range m.round.GetNodes() {
		switch m.workers[a.GetNode()].GetState() {
		case rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED:
			m.succeeded++
		case rdzvv1.WorkerState_WORKER_STATE_FAILED:
			m.failed++
		}
	}
	m.counted = true
}

// AllRunning reports whether the workers of every node of the round run.
func (m *Members) AllRunning() bool {
	return !Find(m.round, &m.notRunningAt, func(a *rdzvv1.NodeAssignment) bool {
		return m.workers[a.GetNode()].GetState() != rdzvv1.WorkerState_WORKER_STATE_RUNNING
	})
}

// AllExited reports whether the workers of every node of the round have
// exited (or their node was lost, which records them failed).
func (m *Members) AllExited() bool {
	return !Find(m.round, &m.notStoppedAt, func(a *rdzvv1.NodeAssignment) bool {
		return !TerminalWorker(m.workers[a.GetNode()].GetState())
	})
}

// FencedAt is when no worker of the round can still run (FencedAt), member
// telling what is known of each node beyond its workers' reports.
func (m *Members) FencedAt(member func(node string, running bool) Member) (time.Time, bool) {
	return FencedAt(m.round, &m.notStoppedAt, func(node string) Member {
		return member(node, !TerminalWorker(m.workers[node].GetState()))
	})
}

// TerminalWorker reports whether workers in state s have exited for good.
func TerminalWorker(s rdzvv1.WorkerState) bool {
	switch s {
	case rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED, rdzvv1.WorkerState_WORKER_STATE_FAILED, rdzvv1.WorkerState_WORKER_STATE_STOPPED:
		return true
	}
	return false
}

// Report is what a worker report decides.
type Report struct {
	// Stop, when not empty, is why the reporting node's workers must stop,
	// within StopGrace (0: the agent's own stop grace).
	Stop      string
	StopGrace time.Duration
	// Stale is set when the report is of no current member's workers.
	Stale bool
	// Recorded is set when the report moved the node's workers on, to be
	// stored with Events: the generation's phases (every worker running,
	// every worker exited), once each, and the node's failure while fewer
	// than MaxFailureEvents of the generation were listed. Each phase is
	// reached by exactly one report, as a worker's state only moves
	// forward, so a generation of N nodes costs two events, not 2N, and a
	// controller taking over sees a phase's event exactly when it sees the
	// report that reached it.
	Recorded bool
	Events   []*rdzvv1.Event
	// Lazy is set when the record is the exit of a survivor of a failed
	// generation: the next round's commit supersedes it.
	Lazy bool
	// AllRunning is set when the workers of every node of the round run,
	// the report being of running workers.
	AllRunning bool
	// Exited is set when the report is of the node's workers' exit: its
	// part in the job is over.
	Exited bool
}

// OnWorkerReport takes w, node's report of its workers of job rec, at now:
// a report of another generation, or of a node not in the round, is
// answered by stopping those workers (only the current generation's
// members may run), and so is one of running workers of a job that does
// not run. A report that does not move the node's workers on (the same
// state again, or anything after an exit) records nothing. rec is the
// job's record (not changed); m records the report.
func OnWorkerReport(rec *rdzvv1.Job, m *Members, node string, w *rdzvv1.WorkerStatus, now time.Time) Report {
	alive := !TerminalWorker(w.GetState())
	var r Report
	if rec == nil || rec.GetGeneration() != w.GetGeneration() || !m.Member(node) {
		r.Stale = true
		if alive {
			r.Stop, r.StopGrace = "stale generation", FailedStopGrace
		}
		return r
	}
	if alive && rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING {
		r.Stop = "job is " + StateName(rec.GetState())
	}
	prev := m.workers[node]
	if prev.GetState() == w.GetState() || TerminalWorker(prev.GetState()) {
		return r
	}
	if m.workers == nil {
		m.workers = map[string]*rdzvv1.WorkerStatus{}
	}
	m.workers[node] = w
	if m.counted {
		switch w.GetState() {
		case rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED:
			m.succeeded++
		case rdzvv1.WorkerState_WORKER_STATE_FAILED:
			m.failed++
		}
	}
	r.Recorded = true
	gen := w.GetGeneration()
	nodes := len(m.round.GetNodes())
	if w.GetState() == rdzvv1.WorkerState_WORKER_STATE_FAILED && m.Failed() <= MaxFailureEvents {
		r.Events = append(r.Events, event(rec, node, now, EventWorkerFailed, "workers on %s %s", node, DescribeExit(w)))
	}
	switch {
	case alive && w.GetState() == rdzvv1.WorkerState_WORKER_STATE_RUNNING && m.AllRunning():
		r.AllRunning = true
		r.Events = append(r.Events, event(rec, "", now, EventWorkersRunning, "generation %d: workers running on all %d nodes", gen, nodes))
	case !alive:
		r.Exited = true
		r.Lazy = rec.GetState() == rdzvv1.JobState_JOB_STATE_RECOVERING
		if m.AllExited() {
			r.Events = append(r.Events, event(rec, "", now, EventWorkersExited, "generation %d: workers exited on all %d nodes: %s", gen, nodes, m.exitSummary()))
		}
	}
	return r
}

// StateName is s without its JOB_STATE_ prefix, as messages show it.
func StateName(s rdzvv1.JobState) string {
	name := s.String()
	if v, ok := rdzvv1.JobState_name[int32(s)]; ok {
		name = v
	}
	const prefix = "JOB_STATE_"
	if len(name) > len(prefix) {
		return name[len(prefix):]
	}
	return name
}

// exitSummary counts how the workers of the round ended, e.g. "9999
// stopped, 1 failed (listed in worker_failed events)", for workers_exited.
// One pass over the round, once per generation.
func (m *Members) exitSummary() string {
	var succeeded, failed, stopped int
	for _, a := range m.round.GetNodes() {
		switch m.workers[a.GetNode()].GetState() {
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
	case failed > MaxFailureEvents:
		parts = append(parts, fmt.Sprintf("%d failed (the first %d listed in worker_failed events, %d not)", failed, MaxFailureEvents, failed-MaxFailureEvents))
	case failed > 0:
		parts = append(parts, fmt.Sprintf("%d failed (listed in worker_failed events)", failed))
	}
	return strings.Join(parts, ", ")
}
