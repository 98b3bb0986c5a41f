package lifecycle

import (
	"fmt"
	"strings"
	"time"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Exit is a node's workers' report in a running job's current round.
type Exit struct {
	Node   string
	Rank   uint32
	Worker *rdzvv1.WorkerStatus
	// Retry says a failure the agent named (Worker.Failure) is one another
	// attempt need not repeat: the in-memory step planned could not be
	// fetched, and the next attempt picks another.
	Retry bool
}

// Verdict is what the exits of a running job's workers decide.
type Verdict int

const (
	// Continue: nothing failed, and not every node has succeeded yet.
	Continue Verdict = iota
	// Failed: a node's workers failed or were stopped; the generation
	// fails (Fail).
	Failed
	// Broken: the job's configuration does not fit a node (a missing
	// workdir, named by the agent's failure): every restart would fail
	// the same way, into a crash loop, so the job fails for good
	// (BrokenOn). The operator fixes the job or the node.
	Broken
	// Succeeded: every node of the round succeeded.
	Succeeded
)

// Judge decides a running job's course from exits, the nodes whose
// workers may have exited since it was last judged, and succeeded, the
// count of the round's nodes (of nodes) whose workers succeeded. The
// first exit that failed decides, and is returned.
func Judge(exits []Exit, succeeded, nodes int) (Verdict, Exit) {
	for _, e := range exits {
		switch e.Worker.GetState() {
		case rdzvv1.WorkerState_WORKER_STATE_FAILED, rdzvv1.WorkerState_WORKER_STATE_STOPPED:
			if e.Worker.GetFailure() != "" && !e.Retry {
				return Broken, e
			}
			return Failed, e
		}
	}
	if succeeded == nodes {
		return Succeeded, Exit{}
	}
	return Continue, Exit{}
}

// BrokenOn fails a running job for good: e's node cannot run it.
func BrokenOn(rec *rdzvv1.Job, e Exit, now time.Time) Transition {
	f := e.Worker.GetFailure()
	return Finish(rec, rdzvv1.JobState_JOB_STATE_FAILED, fmt.Sprintf("%s: node %s (rank %d): %s; not restarted, as a restart would fail the same way: fix the job file or the node, then start the job again",
		f, e.Node, e.Rank, strings.TrimPrefix(e.Worker.GetMessage(), f+": ")), now)
}

// Reason says which node's workers failed and how, for Fail.
func (e Exit) Reason() string {
	return fmt.Sprintf("node %s (rank %d): workers %s", e.Node, e.Rank, DescribeExit(e.Worker))
}

// DescribeExit says how w's workers ended: "succeeded", "killed by signal
// KILL", "exited with code 1 (message)".
func DescribeExit(w *rdzvv1.WorkerStatus) string {
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
