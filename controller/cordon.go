package controller

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// cordon is setCordon for an operator, answered once it is durable.
func (c *Controller) cordon(ctx context.Context, name string, cordoned bool, reason string) (*rdzvv1.Node, error) {
	c.mu.Lock()
	if c.nodes[name] == nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("node %s: %w", name, errNotFound)
	}
	c.setCordon(name, cordoned, reason)
	view := c.nodes[name].apiView()
	reply := c.writes.barrier()
	c.mu.Unlock()
	if err := await(ctx, reply); err != nil {
		return nil, fmt.Errorf("changing cordon of node %s: %w", name, err)
	}
	return view, nil
}

// setCordon cordons or uncordons a known node; a cordoned node takes no new
// work. Callers hold c.mu.
func (c *Controller) setCordon(name string, cordoned bool, reason string) {
	ns := c.nodes[name]
	if ns.rec.GetCordoned() == cordoned && ns.rec.GetCordonReason() == reason {
		return
	}
	rec := proto.Clone(ns.rec).(*rdzvv1.Node)
	rec.Cordoned, rec.CordonReason = cordoned, reason
	kind, what := EventNodeCordoned, "cordoned: "+reason
	if !cordoned {
		// Uncordoning ends a drain too.
		kind, what, rec.CordonReason, rec.Draining = EventNodeUncordoned, "uncordoned", "", false
	}
	c.writes.persist(putNode(c.store, ns, rec, ns.info.decode(), newEvent(c.clock.Now(), "", name, 0, kind, "node %s %s", name, what)), nil)
	c.log.Info("node cordon changed", zap.String("node", name), zap.Bool("cordoned", cordoned), zap.String("reason", reason))
	c.wake()
}

// gpuFault cordons a node whose GPU reported a critical fault. A GPU that
// fell off the bus or lost memory cannot be trusted by the next job either,
// and faults rarely clear by themselves, so the cordon stays until an
// operator has looked (`rdzvctl nodes uncordon`). A job running there is
// restarted elsewhere at once rather than left to crash on the bad GPU.
func (c *Controller) gpuFault(node string, f *rdzvv1.GPUFault) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ns := c.nodes[node]
	if ns == nil {
		return
	}
	ev := newEvent(c.clock.Now(), ns.job, node, ns.generation, EventGPUFault, "node %s: %s", node, f.GetMessage())
	c.writes.persist(c.store.AppendEvent(ev), nil)
	c.setCordon(node, true, "GPU fault: "+f.GetMessage())
	js := c.jobs[ns.job]
	if js == nil || js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING || js.rec.GetGeneration() != ns.generation {
		return
	}
	latency := time.Duration(0)
	if f.GetAt() != nil {
		latency = max(c.clock.Now().Sub(f.GetAt().AsTime()), 0)
	}
	c.attemptFailed(js, causeGPUFault, fmt.Sprintf("node %s: GPU fault: %s", node, f.GetMessage()), latency)
}

// countLoss records that the node was lost while running a job at now,
// and says why to cordon it once that has happened rule.Losses times
// within the window (flaky_nodes): a node that keeps dropping out would
// otherwise be picked again and fail each job it joins. cordon is empty
// when it stays as it is.
func (ns *nodeState) countLoss(rule health.Flaky, now time.Time) (cordon string) {
	var flaky bool
	ns.losses, flaky = rule.Record(ns.losses, now)
	if !flaky || ns.rec.GetCordoned() {
		return ""
	}
	cordon = fmt.Sprintf("lost %d times within %s while running jobs", len(ns.losses), rule.Window)
	ns.losses = nil
	return cordon
}
