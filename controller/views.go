package controller

// The API's view of jobs and nodes.

import (
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/controller/lifecycle"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// apiView is the API form of a job at now: its record plus the current
// round's assignments and worker states.
func (js *jobState) apiView(now time.Time) *rdzvv1.Job {
	j := proto.Clone(js.rec).(*rdzvv1.Job)
	j.Spec = jobspec.RedactSpec(j.GetSpec())
	// Totals up to now, while still showing which interval is open.
	lifecycle.CloseInterval(j, now)
	j.RecoveryStartedAt, j.TrainingSince = js.rec.GetRecoveryStartedAt(), js.rec.GetTrainingSince()
	j.Spares = slices.Clone(js.spares)
	viewTraining(j, js)
	round := js.members.Round()
	if round == nil || round.GetGeneration() != js.rec.GetGeneration() {
		return j
	}
	for _, a := range round.GetNodes() {
		v := proto.Clone(a).(*rdzvv1.NodeAssignment)
		v.State = rdzvv1.WorkerState_WORKER_STATE_ASSIGNED
		if w := js.members.Worker(a.GetNode()); w != nil {
			v.State, v.ExitCode, v.Signal, v.Message = w.GetState(), w.GetExitCode(), w.GetSignal(), w.GetMessage()
		}
		j.Assignments = append(j.Assignments, v)
	}
	return j
}

// apiView is the API form of a node, with the in-memory liveness and job.
// It shares the record's messages rather than copying them: a node record
// is never changed in place, only replaced (as ns.health is), and a deep
// copy of every node listed would be most of a large listing's time and
// garbage under c.mu. The registration, kept encoded
// (nodeInfo), is decoded afresh. TestNodeViewKeepsEveryField makes a field
// added to Node come here too.
func (ns *nodeState) apiView() *rdzvv1.Node {
	r := ns.rec
	seen := ns.lastSeen
	if ns.session != nil {
		seen = ns.session.seen()
	}
	return &rdzvv1.Node{
		Info:             ns.info.decode(),
		State:            viewState(ns),
		Job:              ns.job,
		Generation:       ns.generation,
		RegisteredAt:     r.GetRegisteredAt(),
		LastHeartbeat:    timestamppb.New(seen),
		StateChangedAt:   r.GetStateChangedAt(),
		Cordoned:         r.GetCordoned(),
		CordonReason:     r.GetCordonReason(),
		RestartHoldUntil: r.GetRestartHoldUntil(),
		Draining:         r.GetDraining(),
		HealthChecks:     ns.health,
	}
}

// viewState is a node's state as the API shows it: a ready node holding a
// job is busy; a draining one holding none is drained.
func viewState(ns *nodeState) rdzvv1.NodeState {
	s := ns.rec.GetState()
	switch {
	case s != rdzvv1.NodeState_NODE_STATE_READY:
		return s
	case ns.job != "":
		return rdzvv1.NodeState_NODE_STATE_BUSY
	case ns.rec.GetDraining():
		return rdzvv1.NodeState_NODE_STATE_DRAINED
	}
	return s
}
