package controller

// Draining a node, previewing a placement, and what the controller is:
// operator conveniences over the cordon, the scheduler and buildinfo.

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/buildinfo"
	"github.com/rdzv/rdzv/controller/lifecycle"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/rendezvous"
)

// EventNodeDraining is a node cordoned by `rdzvctl nodes drain`.
const EventNodeDraining = "node_draining"

// drain cordons a node and marks it draining, answered once durable. Its
// job keeps running there until it ends; with now, the job's current
// attempt fails at once (as on a GPU fault) and recovers on other nodes.
func (c *Controller) drain(ctx context.Context, name, reason string, now bool) (*rdzvv1.Node, error) {
	c.mu.Lock()
	ns := c.nodes[name]
	if ns == nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("node %s: %w", name, errNotFound)
	}
	if !ns.rec.GetDraining() || ns.rec.GetCordonReason() != reason {
		rec := proto.Clone(ns.rec).(*rdzvv1.Node)
		rec.Cordoned, rec.CordonReason, rec.Draining = true, reason, true
		c.writes.persist(putNode(c.store, ns, rec, ns.info.decode(), newEvent(c.clock.Now(), "", name, 0, EventNodeDraining, "node %s draining: %s", name, reason)), nil)
		c.log.Info("node draining", zap.String("node", name), zap.String("reason", reason), zap.Bool("now", now))
	}
	if js := c.jobs[ns.job]; now && js != nil && js.rec.GetState() == rdzvv1.JobState_JOB_STATE_RUNNING && js.rec.GetGeneration() == ns.generation {
		c.attemptFailed(js, causeDrain, fmt.Sprintf("node %s drained now by an operator", name), 0)
	}
	c.wake()
	view := ns.apiView()
	reply := c.writes.barrier()
	c.mu.Unlock()
	if err := await(ctx, reply); err != nil {
		return nil, fmt.Errorf("draining node %s: %w", name, err)
	}
	return view, nil
}

// previewJob is the job a spec, admitted, would start as, and where the
// scheduler would place it among candidates (the nodes now), storing
// nothing.
func previewJob(specProto *rdzvv1.JobSpec, candidates []rendezvous.Candidate, now time.Time) (*rdzvv1.Job, *rdzvv1.PlacementPreview) {
	job := lifecycle.Submit(jobspec.FromProto(specProto).ToProto(), 0, now).Job
	job.Reason = "dry run: not stored"
	req := requirements(job.GetSpec())
	preview := &rdzvv1.PlacementPreview{}
	placed, err := rendezvous.Plan(req, candidates)
	if err != nil {
		preview.Reason = "would wait for nodes: " + rendezvous.Explain(req, candidates)
		return job, preview
	}
	for _, p := range placed {
		preview.Nodes = append(preview.Nodes, &rdzvv1.NodeAssignment{
			Node: p.Name, NodeRank: uint32(p.Rank), Address: p.Address, NcclInterface: p.Interface, GpuIndices: p.GPUIndices,
		})
	}
	preview.Reason = fmt.Sprintf("would run on %d nodes now (%s)", len(placed), rendezvous.Explain(req, candidates))
	return job, preview
}

type serverService struct {
	rdzvv1.UnimplementedServerServiceServer
	c *Controller
}

// GetServerInfo is answered by the leader only (the client follows it),
// so the address is the leader's.
func (s *serverService) GetServerInfo(context.Context, *rdzvv1.GetServerInfoRequest) (*rdzvv1.GetServerInfoResponse, error) {
	bi := buildinfo.Get()
	return &rdzvv1.GetServerInfoResponse{Version: bi.Version, Commit: bi.Commit, GoVersion: bi.GoVersion, Platform: bi.Platform,
		LeaderAddr: s.c.cfg.Advertised()}, nil
}
