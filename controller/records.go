package controller

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/controller/lifecycle"
	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// Records read back from etcd are validated like the API requests that
// made them before the controller acts on them. etcd is the controller's
// own, but a record may be corrupt, written by an older or buggy version,
// or by whoever gained write access to etcd; the agent runs whatever job
// spec it is sent, as root. An invalid record is logged with its key and
// replaced in memory by a stand-in that is never acted on (etcd keeps the
// record as it is, for whoever investigates):
//
//   - a job is FAILED, with the reason, and has no round, so nothing of it
//     is sent to an agent and its workers still running anywhere are
//     stopped as stale; starting the job again replaces the record;
//   - a node is LOST until its agent registers again, which rewrites the
//     record from what the agent reports;
//   - a worker status or catalog entry is left out.

// screen validates every record of snap, in place.
func (c *Controller) screen(snap *store.Snapshot, now time.Time) {
	for name, v := range snap.Nodes {
		if err := validateNodeRecord(name, v.Value); err != nil {
			snap.UnreadableNodes[name] = store.Unreadable{Key: store.NodeKey(name), ModRevision: v.ModRevision, Err: err}
		}
	}
	for name, bad := range snap.UnreadableNodes {
		c.log.Error("invalid node record in etcd, ignored until the node registers again", zap.String("key", bad.Key), zap.Error(bad.Err))
		if wire.ValidateName("node", name) != nil {
			delete(snap.Nodes, name)
			continue
		}
		snap.Nodes[name] = store.Versioned[*rdzvv1.Node]{ModRevision: bad.ModRevision, Value: &rdzvv1.Node{
			Info: &rdzvv1.NodeInfo{Name: name}, State: rdzvv1.NodeState_NODE_STATE_LOST, StateChangedAt: timestamppb.New(now),
		}}
	}
	for name, v := range snap.Jobs {
		if err := validateJobRecord(name, v.Value); err != nil {
			snap.UnreadableJobs[name] = store.Unreadable{Key: store.JobKey(name), ModRevision: v.ModRevision, Err: err, Generation: v.Value.GetGeneration()}
		} else if err := validateRound(name, snap.Rounds[name]); err != nil {
			snap.UnreadableJobs[name] = store.Unreadable{Key: store.JobKey(name), ModRevision: v.ModRevision, Err: err, Generation: v.Value.GetGeneration()}
		}
	}
	for name, bad := range snap.UnreadableJobs {
		c.log.Error("invalid job record in etcd, not acted on", zap.String("key", bad.Key), zap.String("job", name), zap.Error(bad.Err))
		delete(snap.Rounds, name)
		delete(snap.Workers, name)
		delete(snap.Checkpoints, name)
		if wire.ValidateName("job", name) != nil {
			delete(snap.Jobs, name)
			continue
		}
		snap.Jobs[name] = store.Versioned[*rdzvv1.Job]{ModRevision: bad.ModRevision, Value: lifecycle.Unreadable(name, bad.Generation,
			fmt.Sprintf("its record in etcd (%s) is invalid and was not acted on: %v", bad.Key, bad.Err), now)}
	}
	unsealed := snap.Unsealed[:0]
	for _, name := range snap.Unsealed {
		if _, bad := snap.UnreadableJobs[name]; !bad {
			unsealed = append(unsealed, name)
		}
	}
	snap.Unsealed = unsealed
	for job, workers := range snap.Workers {
		for node, w := range workers {
			if err := validateWorkerRecord(job, node, w); err != nil {
				snap.Dropped = append(snap.Dropped, store.Unreadable{Key: store.WorkerKey(job, node), Err: err})
				delete(workers, node)
			}
		}
	}
	for _, d := range snap.Dropped {
		c.log.Error("invalid record in etcd, ignored", zap.String("key", d.Key), zap.Error(d.Err))
	}
}

// reseal writes back the jobs whose secret_env is not sealed with the
// primary key, which seals it with that key: after an upgrade from
// plaintext, or a key rotation. Callers hold c.mu.
func (c *Controller) reseal(names []string) {
	for _, name := range names {
		c.writes.persist(c.store.UpdateJob(c.jobs[name].rec), func() {
			c.log.Info("job secrets sealed with the primary key", zap.String("job", name))
		})
	}
}

// validateJobRecord checks a stored job: its spec exactly as StartJob
// does, and what the controller would otherwise act on or show.
func validateJobRecord(name string, j *rdzvv1.Job) error {
	if j.GetSpec() == nil {
		return errors.New("spec: required")
	}
	var errs []error
	if got := j.GetSpec().GetName(); got != name {
		errs = append(errs, fmt.Errorf("spec.name: %q is not the name in its key, %q", clip(got), name))
	}
	if err := jobspec.FromProto(j.GetSpec()).Validate(); err != nil {
		errs = append(errs, err)
	}
	if s := j.GetState(); rdzvv1.JobState_name[int32(s)] == "" || s == rdzvv1.JobState_JOB_STATE_UNSPECIFIED {
		errs = append(errs, fmt.Errorf("state: unknown job state %d", s))
	}
	if len(j.GetAssignments()) > 0 {
		errs = append(errs, errors.New("assignments: never stored (they are derived from the round)"))
	}
	if cp := j.GetLatestCheckpoint(); cp != nil {
		// Sent to the agents as RDZV_RESUME_FROM.
		if err := checkpointPathOK(j.GetSpec().GetCheckpointDir(), cp.GetPath()); err != nil {
			errs = append(errs, fmt.Errorf("latest_checkpoint.path: %q: %w", clip(cp.GetPath()), err))
		}
	}
	// Shown by status and the dashboard: bounded as lifecycle.Fail bounds them.
	if n := len(j.GetIncidents()); n > lifecycle.MaxIncidents {
		errs = append(errs, fmt.Errorf("incidents: at most %d, got %d", lifecycle.MaxIncidents, n))
	}
	for i, inc := range j.GetIncidents() {
		errs = append(errs, textErr(fmt.Sprintf("incidents[%d].reason", i), inc.GetReason(), lifecycle.MaxIncidentReasonBytes+len("...")))
	}
	return errors.Join(errs...)
}

// validateRound checks a job's latest round, which gives the agents their
// ranks, GPUs and master address.
func validateRound(job string, r *rdzvv1.Round) error {
	if r == nil {
		return nil
	}
	var errs []error
	if r.GetJob() != job {
		errs = append(errs, fmt.Errorf("round.job: %q is not the job %q", clip(r.GetJob()), job))
	}
	if _, err := netip.ParseAddr(r.GetMasterAddr()); err != nil {
		errs = append(errs, fmt.Errorf("round.master_addr: must be an IP address, got %q", clip(r.GetMasterAddr())))
	}
	if p := r.GetMasterPort(); p == 0 || p > 65535 {
		errs = append(errs, fmt.Errorf("round.master_port: must be a TCP port, got %d", p))
	}
	nodes := r.GetNodes()
	if len(nodes) == 0 || len(nodes) > wire.MaxNodes {
		return errors.Join(append(errs, fmt.Errorf("round.nodes: want 1 to %d, got %d", wire.MaxNodes, len(nodes)))...)
	}
	seen := map[string]bool{}
	ranks := make([]bool, len(nodes))
	for i, a := range nodes {
		f := fmt.Sprintf("round.nodes[%d]", i)
		errs = append(errs, nameErr(f+".node", a.GetNode()))
		if seen[a.GetNode()] {
			errs = append(errs, fmt.Errorf("%s.node: %q appears twice", f, a.GetNode()))
		}
		seen[a.GetNode()] = true
		if rank := a.GetNodeRank(); int(rank) >= len(nodes) || ranks[rank] {
			errs = append(errs, fmt.Errorf("%s.node_rank: %d is not a free rank below %d", f, rank, len(nodes)))
		} else {
			ranks[rank] = true
		}
		if _, err := netip.ParseAddr(a.GetAddress()); err != nil {
			errs = append(errs, fmt.Errorf("%s.address: must be an IP address, got %q", f, clip(a.GetAddress())))
		}
		errs = append(errs, textErr(f+".nccl_interface", a.GetNcclInterface(), maxShortText))
		if len(a.GetGpuIndices()) > wire.MaxGPUsPerNode {
			errs = append(errs, fmt.Errorf("%s.gpu_indices: at most %d, got %d", f, wire.MaxGPUsPerNode, len(a.GetGpuIndices())))
		}
		for _, g := range a.GetGpuIndices() {
			if g >= wire.MaxGPUsPerNode {
				errs = append(errs, fmt.Errorf("%s.gpu_indices: must be below %d, got %d", f, wire.MaxGPUsPerNode, g))
				break
			}
		}
	}
	return errors.Join(errs...)
}

// validateNodeRecord checks a stored node like its agent's registration.
func validateNodeRecord(name string, n *rdzvv1.Node) error {
	errs := []error{validateNodeInfo(n.GetInfo())}
	if got := n.GetInfo().GetName(); got != name {
		errs = append(errs, fmt.Errorf("node.name: %q is not the name in its key, %q", clip(got), name))
	}
	if s := n.GetState(); rdzvv1.NodeState_name[int32(s)] == "" || s == rdzvv1.NodeState_NODE_STATE_UNSPECIFIED {
		errs = append(errs, fmt.Errorf("state: unknown node state %d", s))
	}
	errs = append(errs, textErr("cordon_reason", n.GetCordonReason(), maxReasonBytes))
	return errors.Join(errs...)
}

// validateWorkerRecord checks a stored worker status like an agent's report.
func validateWorkerRecord(job, node string, w *rdzvv1.WorkerStatus) error {
	if err := validateWorkerStatus("worker", w); err != nil {
		return err
	}
	if w.GetJob() != job {
		return fmt.Errorf("worker.job: %q is not the job in its key, %q", w.GetJob(), job)
	}
	return nil
}
