package controller

// A connected agent's node: registration, restarts, disconnection.

import (
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// register records the node (writing etcd only when something durable
// changed), replaces any previous stream of the same node, and reconciles
// what the agent runs with what the controller expects.
func (c *Controller) register(sess *session, reg *rdzvv1.Register) {
	info := reg.GetNode()
	name := info.GetName()
	ni, err := newNodeInfo(info)
	if err != nil {
		c.log.Error("refusing registration", zap.String("node", name), zap.Error(err))
		sess.cancel()
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.gate.leading() {
		// The lead ended while this stream waited for the lock (the gate let
		// it in before): registered into the view a follower drops, its
		// reports would be judged against no jobs (stop orders for the
		// workers of a running generation), and the next lead, which
		// loads a fresh view, would never see its session while the
		// stream acknowledged its heartbeats. It reconnects to the leader.
		sess.cancel()
		return
	}
	// After the lock: in a registration storm the wait for it is long, and
	// the node's liveness clock must not run while it is spent.
	now := c.clock.Now()
	sess.touch(now)

	ns := c.nodes[name]
	wasLost := ns != nil && ns.rec.GetState() == rdzvv1.NodeState_NODE_STATE_LOST
	if ns == nil || wasLost || ns.rec.GetRestartHoldUntil() != nil || !ns.info.same(ni.encoded) {
		rec := &rdzvv1.Node{State: rdzvv1.NodeState_NODE_STATE_READY, RegisteredAt: timestamppb.New(now), StateChangedAt: timestamppb.New(now)}
		if ns != nil && !wasLost {
			rec.StateChangedAt = ns.rec.GetStateChangedAt()
		}
		if ns != nil {
			// A cordon outlives reconnects and restarts: only an operator
			// lifts it.
			rec.Cordoned, rec.CordonReason = ns.rec.GetCordoned(), ns.rec.GetCordonReason()
		}
		ev := newEvent(c.clock.Now(), "", name, 0, EventNodeRegistered, "node %s registered: %d GPUs%s, interface %s (%s), address %s, agent %s",
			name, len(info.GetGpus()), fakeSuffix(info), info.GetNcclInterface(), info.GetNcclInterfaceReason(), info.GetAddress(), info.GetAgentVersion())
		if ns == nil {
			ns = &nodeState{}
			c.nodes[name] = ns
		}
		ns.info = ni
		c.writes.persist(putNode(c.store, ns, rec, info, ev), nil)
		c.log.Info("node registered", zap.String("node", name), zap.Int("gpus", len(info.GetGpus())),
			zap.String("interface", info.GetNcclInterface()), zap.String("address", info.GetAddress()))
	}
	if ns.session != nil {
		ns.session.cancel()
	}
	ns.session = sess
	ns.lastSeen = now
	// Heard from now on: neither a start-up grace nor a restart hold may
	// delay noticing that it dies later.
	ns.graceUntil, ns.restartHold, ns.lost = time.Time{}, time.Time{}, nil
	if info.GetGossipAddr() != "" {
		c.seeds.add(name)
	}
	ns.heard = true
	sess.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_Registered{Registered: &rdzvv1.Registered{
		HeartbeatIntervalMs: uint32(c.cfg.Heartbeat.Interval.Milliseconds()),
		HeartbeatTimeoutMs:  uint32(c.cfg.Heartbeat.Timeout.Milliseconds()),
		VouchedTimeoutMs:    uint32(c.cfg.Heartbeat.VouchedTimeout.Milliseconds()),
		GossipSeeds:         c.nodes.gossipSeeds(&c.seeds, name),
	}}})

	reported := map[string]bool{}
	for _, w := range reg.GetWorkers() {
		reported[fmt.Sprintf("%s/%d", w.GetJob(), w.GetGeneration())] = true
		c.applyWorkerStatus(name, w)
	}
	c.resumeAssignment(ns, reported)
	c.jobs.registerMemory(name, reg.GetMemory())
	c.applyHealth(name, ns, reg.GetHealth())
	c.wake()
}

// registerMemory replaces what node holds of every job's in-memory
// checkpoints with what its agent registered holding: nothing after the
// agent restarted (its replicas were in its memory), its own after a
// reconnect, and a new leader's first knowledge of them.
func (jt jobTable) registerMemory(node string, held []*rdzvv1.JobMemoryHeld) {
	by := make(map[string][]*rdzvv1.MemoryHeld, len(held))
	for _, h := range held {
		by[h.GetJob()] = h.GetHeld()
	}
	for name, js := range jt {
		if js.memHeld[node] != nil || by[name] != nil {
			js.memoryHeld(node, by[name])
		}
	}
}

func fakeSuffix(info *rdzvv1.NodeInfo) string {
	if info.GetFakeGpus() {
		return " (fake)"
	}
	return ""
}

// resumeAssignment handles a node that the controller believes is in a job
// the agent did not mention: an assignment the agent never confirmed is sent
// again; one it had confirmed was lost with the agent's workers.
func (c *Controller) resumeAssignment(ns *nodeState, reported map[string]bool) {
	if ns.job == "" || reported[fmt.Sprintf("%s/%d", ns.job, ns.generation)] {
		return
	}
	js := c.jobs[ns.job]
	if js == nil || js.rec.GetGeneration() != ns.generation || js.members.Round() == nil {
		return
	}
	name := ns.info.name
	if js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING {
		// The job is ending or ended while the agent was away, and nothing of
		// it runs there any more: record that, which frees the node and lets
		// a stopping job finish.
		c.applyWorkerStatus(name, &rdzvv1.WorkerStatus{
			Job: ns.job, Generation: ns.generation, State: rdzvv1.WorkerState_WORKER_STATE_STOPPED,
			ExitCode: -1, Message: "agent reconnected without its workers",
		})
		return
	}
	switch js.members.Worker(name).GetState() {
	case rdzvv1.WorkerState_WORKER_STATE_UNSPECIFIED, rdzvv1.WorkerState_WORKER_STATE_ASSIGNED:
		// The round may have been decided but not written yet. To this node
		// alone: the others have theirs.
		round := js.members.Round()
		for _, a := range round.GetNodes() {
			if a.GetNode() == name {
				c.writes.afterDurable(func() { c.nodes.sendAssignment(c.jobs, js, round, a) })
			}
		}
	case rdzvv1.WorkerState_WORKER_STATE_RUNNING:
		c.applyWorkerStatus(name, &rdzvv1.WorkerStatus{
			Job: ns.job, Generation: ns.generation, State: rdzvv1.WorkerState_WORKER_STATE_FAILED,
			ExitCode: -1, Message: "agent reconnected without its workers",
		})
	}
}

// maxRestartHold bounds how long a restarting agent may keep its node from
// being declared lost (the agent's own limit on restart_grace).
const maxRestartHold = 5 * time.Minute

// agentRestarting holds off declaring a node lost while its agent restarts:
// its workers run on under their shims, which kill them if no agent adopts
// them within the hold. The shims started counting before we heard of it, so
// by the time we give up on the node its workers are gone.
func (c *Controller) agentRestarting(node string, sess *session, r *rdzvv1.AgentRestarting) {
	hold := min(time.Duration(r.GetHoldMs())*time.Millisecond, maxRestartHold)
	c.mu.Lock()
	defer c.mu.Unlock()
	ns := c.nodes[node]
	if ns == nil || ns.session != sess {
		return
	}
	ns.restartHold = c.clock.Now().Add(hold)
	c.log.Info("agent restarting, holding its node", zap.String("node", node), zap.String("job", ns.job), zap.Duration("hold", hold))
	// Stored so that a controller taking the lead during the restart holds
	// the node too; without it, its start-up grace would give way to the
	// first peer reporting the node unreachable, which it is while its
	// agent (and gossip with it) is down.
	rec := proto.Clone(ns.rec).(*rdzvv1.Node)
	rec.RestartHoldUntil = timestamppb.New(ns.restartHold)
	ev := newEvent(c.clock.Now(), ns.job, node, ns.generation, EventAgentRestarting, "agent on %s restarting; its workers run on for up to %s", node, hold)
	c.writes.persist(putNode(c.store, ns, rec, ns.info.decode(), ev), nil)
}

// disconnect forgets a stream unless a newer one replaced it. The node stays
// in its state: only the heartbeat timeout declares it lost, so a brief
// reconnect never disturbs a job.
func (c *Controller) disconnect(sess *session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ns := c.nodes[sess.node]; ns != nil && ns.session == sess {
		ns.lastSeen = sess.seen()
		ns.session = nil
	}
}
