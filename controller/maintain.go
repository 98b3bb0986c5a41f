package controller

import (
	"context"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/controller/lifecycle"
	"github.com/rdzv/rdzv/controller/store"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// maintainLoop keeps etcd small over months while this controller leads:
// every retention.interval it prunes events and finished jobs, and every
// etcd.compaction_interval it compacts history to where it stood one
// interval earlier (so watchers and readers of recent revisions are not
// cut short).
func (c *Controller) maintainLoop(ctx context.Context) {
	prune := c.clock.NewTicker(c.cfg.Retention.Interval.Duration)
	defer prune.Stop()
	var compact <-chan time.Time
	if d := c.cfg.Etcd.CompactionInterval.Duration; d > 0 {
		t := c.clock.NewTicker(d)
		defer t.Stop()
		compact = t.Chan()
	}
	// The revision to compact to on the next tick: etcd's revision one
	// interval ago.
	var compactTo int64
	if rev, err := c.store.Revision(ctx); err == nil {
		compactTo = rev
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-prune.Chan():
			c.prune(ctx)
		case <-compact:
			rev, err := c.store.Revision(ctx)
			if err != nil {
				c.log.Warn("reading etcd revision for compaction failed", zap.Error(err))
				continue
			}
			if compactTo > 0 {
				if err := c.store.Compact(ctx, compactTo); err != nil {
					c.log.Warn("compacting etcd failed", zap.Error(err))
				} else {
					c.log.Info("etcd compacted", zap.Int64("revision", compactTo))
				}
			}
			compactTo = rev
		}
	}
}

// prune applies the retention settings once, and drops deny-list entries
// whose certificates have all expired. Finished jobs and long-lost nodes
// are deleted through the writer, in order with everything else, so that
// no restart of the same name (no registration of the node) races the
// delete; events are pruned beside it (they are append-only).
func (c *Controller) prune(ctx context.Context) {
	r := c.cfg.Retention
	now := c.clock.Now()
	c.mu.Lock()
	var finished []*jobState
	scopes := make([]string, 0, len(c.jobs))
	for name, js := range c.jobs {
		scopes = append(scopes, name)
		if lifecycle.Terminal(js.rec.GetState()) {
			finished = append(finished, js)
		}
	}
	// Newest first: the oldest beyond MaxFinishedJobs go, and any finished
	// longer ago than FinishedJobMaxAge.
	sort.Slice(finished, func(i, j int) bool {
		return finished[i].rec.GetFinishedAt().AsTime().After(finished[j].rec.GetFinishedAt().AsTime())
	})
	held := c.nodes.heldJobs()
	for i, js := range finished {
		name := js.rec.GetSpec().GetName()
		if i < r.MaxFinishedJobs && now.Sub(js.rec.GetFinishedAt().AsTime()) <= r.FinishedJobMaxAge.Duration || held[name] != "" {
			continue
		}
		c.writes.persist(c.dropJob(js), nil)
		c.log.Info("finished job deleted (retention)", zap.String("job", name), zap.Time("finished_at", js.rec.GetFinishedAt().AsTime()))
	}
	c.pruneNodes(now)
	for _, r := range c.guard.expireRevocations(now) {
		c.writes.persist(c.store.DeleteRevocation(r), nil)
	}
	c.mu.Unlock()

	cutoff := now.Add(-r.EventMaxAge.Duration)
	prune := func(scope string, keep int) bool {
		n, err := c.store.PruneEvents(ctx, scope, cutoff, keep)
		if err != nil {
			c.log.Warn("pruning events failed", zap.String("scope", scope), zap.Error(err))
			return false
		}
		if n > 0 {
			c.log.Info("events pruned (retention)", zap.String("scope", scope), zap.Int64("deleted", n))
		}
		return true
	}
	if !prune(store.ClusterScope, r.MaxClusterEvents) {
		return
	}
	for _, scope := range scopes {
		if ctx.Err() != nil || !prune(scope, r.MaxJobEvents) {
			return
		}
	}
}

// pruneNodes deletes the nodes lost for longer than
// retention.lost_node_max_age, so that decommissioned and renamed hosts do
// not pile up in the registry; an agent that comes back registers anew. A
// cordoned node is kept: its cordon is an operator's word, which a node
// coming back must not shed. Callers hold c.mu.
func (c *Controller) pruneNodes(now time.Time) {
	maxAge := c.cfg.Retention.LostNodeMaxAge.Duration
	for name, ns := range c.nodes {
		lostFor := now.Sub(ns.rec.GetStateChangedAt().AsTime())
		if ns.rec.GetState() != rdzvv1.NodeState_NODE_STATE_LOST || ns.rec.GetCordoned() || lostFor <= maxAge {
			continue
		}
		delete(c.nodes, name)
		c.writes.persist(c.store.DeleteNode(name, newEvent(c.clock.Now(), "", name, 0, EventNodeDeleted, "node %s deleted: lost for %s, longer than retention.lost_node_max_age (%s)",
			name, lostFor.Round(time.Second), maxAge)), nil)
		c.log.Info("lost node deleted (retention)", zap.String("node", name), zap.Duration("lost_for", lostFor))
	}
}
