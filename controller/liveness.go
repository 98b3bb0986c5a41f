package controller

// Node liveness: heartbeats and gossip decide when a node is lost.

import (
	"context"
	"fmt"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// livenessLoop declares nodes lost when their heartbeats stop, and running
// jobs hung when their training stops. Liveness is in memory: etcd is
// written only when a node changes state. Besides its ticks it runs a pass
// when a peer reports a node unreachable, and when such a node's silence is
// long enough for that word to count (health.ConfirmAt), so a dead node is
// declared lost without waiting for a tick. At a job's hang deadline
// (health.HangAt), or when a report brings one before the loop's next
// (wakeHangPassBy), it runs a pass over the running jobs alone
// (hangPass), which costs nothing per node however often jobs' deadlines
// come.
func (c *Controller) livenessLoop(ctx context.Context) {
	ticker := c.clock.NewTicker(max(c.cfg.Heartbeat.Interval.Duration/2, 50*time.Millisecond))
	defer ticker.Stop()
	confirm := c.clock.NewTimer(time.Hour)
	confirm.Stop()
	defer confirm.Stop()
	hang := c.clock.NewTimer(time.Hour)
	hang.Stop()
	defer hang.Stop()
	// Each term of leadership starts its own loop: a hang wake noted by the
	// last one's is no timer of this one's.
	c.armHangPass(hang)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
			c.lag.note(c.clock.Now())
		case <-confirm.Chan():
		case <-c.peersKick:
		case <-hang.Chan():
			c.armHangPass(hang)
			continue
		case <-c.hangKick:
			c.armHangPass(hang)
			continue
		}
		if next := c.checkLiveness(); !next.IsZero() {
			confirm.Reset(max(next.Sub(c.clock.Now()), 0))
		}
	}
}

// armHangPass runs a hangPass and arms timer for the next deadline.
func (c *Controller) armHangPass(timer clockwork.Timer) {
	if next := c.hangPass(); !next.IsZero() {
		timer.Reset(max(next.Sub(c.clock.Now()), 0))
	}
}

// hangPass restarts the running jobs that are hung (checkHangs) and
// returns the next deadline of the others, noting it under the same lock
// as the loop's next hang wake (hangWake).
func (c *Controller) hangPass() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hangWake = c.checkHangs(c.clock.Now())
	return c.hangWake
}

// wakeHangPassBy makes the liveness loop run a hangPass by at (zero:
// never): it kicks the loop when at comes before the hang wake the loop is
// armed for, so that a job's first deadline, or one that moved earlier (a
// save's), is not left to the next tick. Callers hold c.mu.
func (c *Controller) wakeHangPassBy(at time.Time) {
	if at.IsZero() || (!c.hangWake.IsZero() && !at.Before(c.hangWake)) {
		return
	}
	c.hangWake = at
	select {
	case c.hangKick <- struct{}{}:
	default:
	}
}

// checkLiveness is one liveness pass. It returns the earliest time a node
// that peers report unreachable becomes silent long enough for their word
// to declare it lost; zero if none is waiting for that.
func (c *Controller) checkLiveness() (next time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	policy := c.cfg.Heartbeat.policy()
	votes, reporters := c.nodes.gossipVotes()
	lag := c.lag.max(now)
	warned := 0
	for name, ns := range c.nodes {
		if warned < maxExpiryWarningsPerPass && c.warnCertExpiry(now, ns) {
			warned++
		}
		if ns.rec.GetState() == rdzvv1.NodeState_NODE_STATE_LOST {
			continue
		}
		seen, registering, late := ns.lastSeen, false, time.Duration(0)
		if ns.session != nil {
			seen, registering, late = ns.session.seen(), !ns.session.heartbeated.Load(), ns.session.lateness()
		}
		// Peers that called the node unreachable and then reached it again
		// were wrong about it: it is slow, not gone.
		if votes[name] > 0 {
			ns.accused = true
		} else if ns.accused {
			ns.accused, ns.doubtedUntil = false, now.Add(health.DoubtFor)
		}
		doubted := now.Before(ns.doubtedUntil)
		l := policy.Liveness(now, health.Silence{
			LastSeen: seen, HoldUntil: ns.restartHold, GraceUntil: ns.graceUntil, Lag: lag, Registering: registering,
			Late: late, Doubted: doubted,
			Peers: health.Peers{Unreachable: votes[name], Vouching: reporters - votes[name] - ns.selfReporter()},
		})
		switch l.Verdict {
		case health.Lost:
			reason := fmt.Sprintf("no heartbeat for %s", l.Silent.Round(100*time.Millisecond))
			if l.Confirmed {
				reason += fmt.Sprintf(" and %d peers cannot reach it", votes[name])
			}
			c.markLost(name, ns, now, seen, reason)
		case health.Suspect:
			if !ns.hiccup {
				ns.hiccup = true
				c.log.Warn("node silent to the controller but reachable by its peers", zap.String("node", name), zap.Duration("silent", l.Silent))
			}
		case health.Alive:
			ns.hiccup = false
		}
		if at := policy.ConfirmAt(seen, late); votes[name] > 0 && !doubted && l.Verdict != health.Lost && at.After(now) && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	// The ticks judge hangs too; hangPass arms the deadlines' wake.
	c.checkHangs(now)
	return next
}

// markLost declares a node lost. Callers hold c.mu.
func (c *Controller) markLost(name string, ns *nodeState, now, lastSeen time.Time, reason string) {
	rec := proto.Clone(ns.rec).(*rdzvv1.Node)
	rec.State, rec.StateChangedAt = rdzvv1.NodeState_NODE_STATE_LOST, timestamppb.New(c.clock.Now())
	rec.RestartHoldUntil = nil
	ns.accused = false // peers were right: no doubt when it comes back
	c.metrics.nodesLost.Inc()
	c.writes.persist(putNode(c.store, ns, rec, ns.info.decode(), newEvent(c.clock.Now(), ns.job, name, ns.generation, EventNodeLost, "node %s lost: %s", name, reason)), nil)
	loss := health.Loss{
		At: now, LastSeen: lastSeen, Heard: ns.heard, ElectedAt: c.tenure.began, HoldUntil: ns.restartHold,
		Gossips: ns.info.gossipAddr != "", Unreachable: c.nodes.unreachableTo(name), WatchersCut: c.nodes.watchersCut(c.jobs[ns.job], name, ns.generation),
	}
	ns.fencedBy, ns.lost = c.cfg.Heartbeat.policy().FencedBy(loss), nil
	if loss.WatchersCut.IsZero() && ns.job != "" && ns.generation != 0 {
		ns.lost = &lostFencing{loss: loss, job: ns.job, generation: ns.generation}
	}
	c.log.Warn("node lost", zap.String("node", name), zap.Duration("silent", now.Sub(lastSeen)))
	if ns.session != nil {
		ns.session.cancel()
		ns.session = nil
	}
	if ns.job == "" {
		return
	}
	if js := c.jobs[ns.job]; js != nil && js.rec.GetGeneration() == ns.generation && ns.generation != 0 {
		if reason := ns.countLoss(health.Flaky{Losses: c.cfg.FlakyNodes.Losses, Window: c.cfg.FlakyNodes.Window.Duration}, c.clock.Now()); reason != "" {
			c.setCordon(name, true, reason)
		}
		c.applyWorkerStatus(name, &rdzvv1.WorkerStatus{
			Job: ns.job, Generation: ns.generation, State: rdzvv1.WorkerState_WORKER_STATE_FAILED,
			ExitCode: -1, Message: "node lost: " + reason, ExitedAt: timestamppb.New(lastSeen),
		})
	}
	ns.job, ns.generation = "", 0
}
