package controller

import (
	"fmt"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// registerTimeout bounds how long a new stream may take to say who it is.
const registerTimeout = 10 * time.Second

type agentService struct {
	rdzvv1.UnimplementedAgentServiceServer
	c *Controller
}

func (a *agentService) Connect(stream rdzvv1.AgentService_ConnectServer) error {
	c := a.c
	first, err := recvWithTimeout(stream, registerTimeout)
	if err != nil {
		c.log.Named("agent").Warn("refusing agent stream", zap.Error(err))
		return err
	}
	reg := first.GetRegister()
	if reg == nil {
		return status.Error(codes.InvalidArgument, "the first message on an agent stream must be register")
	}
	name := reg.GetNode().GetName()
	if err := c.checkNodeIdentity(stream.Context(), name); err != nil {
		c.log.Named("agent").Warn("registration refused", zap.String("node", name), zap.Error(err))
		return err
	}
	sess := newSession(stream.Context(), name, c.clock.Now())
	sess.certNotAfter = clientCertNotAfter(stream.Context())
	defer sess.cancel()
	log := c.log.Named("agent").With(zap.String("node", name))
	c.register(sess, reg)
	defer c.disconnect(sess)

	// Receiving runs beside this handler, which owns sending. The handler
	// returns as soon as the session ends from either side; returning is what
	// makes gRPC tear the stream down, which ends the blocked Recv.
	// invalid carries the reason a message was refused (streamGuard): the
	// stream ends with it, so the agent sees what it did wrong.
	invalid := make(chan error, 1)
	go func() {
		defer sess.cancel()
		for {
			m, err := stream.Recv()
			if status.Code(err) == codes.InvalidArgument {
				invalid <- err
				return
			}
			if err != nil {
				return // the agent went away; it reconnects and re-registers
			}
			sess.touch(c.clock.Now())
			switch msg := m.GetMsg().(type) {
			case *rdzvv1.ConnectRequest_Heartbeat:
				sess.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_HeartbeatAck{HeartbeatAck: &rdzvv1.HeartbeatAck{Seq: msg.Heartbeat.GetSeq()}}})
			case *rdzvv1.ConnectRequest_GpuFault:
				c.gpuFault(name, msg.GpuFault)
			case *rdzvv1.ConnectRequest_GossipView:
				c.gossipView(name, msg.GossipView)
			case *rdzvv1.ConnectRequest_WorkerStatus:
				c.workerStatus(name, msg.WorkerStatus)
			case *rdzvv1.ConnectRequest_Progress:
				c.progress(name, msg.Progress)
			case *rdzvv1.ConnectRequest_Checkpoint:
				c.checkpoint(name, msg.Checkpoint)
			case *rdzvv1.ConnectRequest_PortProbeResult:
				sess.deliver(msg.PortProbeResult.GetRequestId(), m)
			case *rdzvv1.ConnectRequest_LogChunk:
				sess.deliver(msg.LogChunk.GetRequestId(), m)
			case *rdzvv1.ConnectRequest_Restarting:
				c.agentRestarting(name, sess, msg.Restarting)
			case *rdzvv1.ConnectRequest_Register:
				log.Warn("ignoring repeated register on an open stream")
			}
		}
	}()
	for {
		select {
		case <-sess.ctx.Done():
			select {
			case err := <-invalid:
				log.Warn("ending agent stream: invalid message", zap.Error(err))
				return err
			default:
			}
			if stream.Context().Err() != nil {
				return nil
			}
			return status.Error(codes.Unavailable, "agent stream ended by the controller (shutting down, node declared lost, replaced by a newer connection of this node, or fell behind); reconnect")
		case m := <-sess.out:
			if err := stream.Send(m); err != nil {
				return fmt.Errorf("sending to agent %s: %w", name, err)
			}
		}
	}
}

func recvWithTimeout(stream rdzvv1.AgentService_ConnectServer, d time.Duration) (*rdzvv1.ConnectRequest, error) {
	type result struct {
		m   *rdzvv1.ConnectRequest
		err error
	}
	ch := make(chan result, 1)
	go func() {
		m, err := stream.Recv()
		ch <- result{m, err}
	}()
	select {
	case r := <-ch:
		if status.Code(r.err) == codes.InvalidArgument {
			return nil, r.err
		}
		if r.err != nil {
			return nil, status.Errorf(codes.Canceled, "agent stream closed before register: %v", r.err)
		}
		return r.m, nil
	case <-time.After(d):
		return nil, status.Errorf(codes.DeadlineExceeded, "no register message within %s", d)
	}
}

// register records the node (writing etcd only when something durable
// changed), replaces any previous stream of the same node, and reconciles
// what the agent runs with what the controller expects.
func (c *Controller) register(sess *session, reg *rdzvv1.Register) {
	info := reg.GetNode()
	name := info.GetName()
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()

	ns := c.nodes[name]
	wasLost := ns != nil && ns.rec.GetState() == rdzvv1.NodeState_NODE_STATE_LOST
	if ns == nil || wasLost || ns.rec.GetRestartHoldUntil() != nil || !proto.Equal(ns.rec.GetInfo(), info) {
		rec := &rdzvv1.Node{Info: info, State: rdzvv1.NodeState_NODE_STATE_READY, RegisteredAt: timestamppb.New(now), StateChangedAt: timestamppb.New(now)}
		if ns != nil && !wasLost {
			rec.StateChangedAt = ns.rec.GetStateChangedAt()
		}
		if ns != nil {
			// A cordon outlives reconnects and restarts: only an operator
			// lifts it.
			rec.Cordoned, rec.CordonReason = ns.rec.GetCordoned(), ns.rec.GetCordonReason()
		}
		ev := c.event("", name, 0, EventNodeRegistered, "node %s registered: %d GPUs%s, interface %s (%s), address %s, agent %s",
			name, len(info.GetGpus()), fakeSuffix(info), info.GetNcclInterface(), info.GetNcclInterfaceReason(), info.GetAddress(), info.GetAgentVersion())
		if ns == nil {
			ns = &nodeState{}
			c.nodes[name] = ns
		}
		ns.rec = rec
		c.persist(c.store.PutNode(rec, ev), nil)
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
	ns.graceUntil, ns.restartHold = time.Time{}, time.Time{}
	ns.heard = true
	sess.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_Registered{Registered: &rdzvv1.Registered{
		HeartbeatIntervalMs: uint32(c.cfg.Heartbeat.Interval.Milliseconds()),
		HeartbeatTimeoutMs:  uint32(c.cfg.Heartbeat.Timeout.Milliseconds()),
		VouchedTimeoutMs:    uint32(c.cfg.Heartbeat.VouchedTimeout.Milliseconds()),
		GossipSeeds:         c.gossipSeeds(name),
	}}})

	reported := map[string]bool{}
	for _, w := range reg.GetWorkers() {
		reported[fmt.Sprintf("%s/%d", w.GetJob(), w.GetGeneration())] = true
		c.applyWorkerStatus(name, w)
	}
	c.resumeAssignment(ns, reported)
	c.wake()
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
	if js == nil || js.rec.GetGeneration() != ns.generation || js.round == nil {
		return
	}
	name := ns.rec.GetInfo().GetName()
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
	switch js.workers[name].GetState() {
	case rdzvv1.WorkerState_WORKER_STATE_UNSPECIFIED, rdzvv1.WorkerState_WORKER_STATE_ASSIGNED:
		// The round may have been decided but not written yet.
		round := js.round
		c.afterDurable(func() { c.sendAssignments(js, round) })
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
	ev := c.event(ns.job, node, ns.generation, EventAgentRestarting, "agent on %s restarting; its workers run on for up to %s", node, hold)
	ns.rec = rec
	c.persist(c.store.PutNode(rec, ev), nil)
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

func (c *Controller) workerStatus(node string, w *rdzvv1.WorkerStatus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.applyWorkerStatus(node, w)
}

// applyWorkerStatus records a worker report and advances the job. Reports
// for another generation, or for a job that no longer runs, are answered by
// telling the agent to kill those workers: only the current generation of a
// running job may have live workers. Callers hold c.mu.
func (c *Controller) applyWorkerStatus(node string, w *rdzvv1.WorkerStatus) {
	log := c.log.With(zap.String("node", node), zap.String("job", w.GetJob()), zap.Uint64("generation", w.GetGeneration()))
	js := c.jobs[w.GetJob()]
	alive := !terminalWorker(w.GetState())
	current := js != nil && js.rec.GetGeneration() == w.GetGeneration() && js.round != nil && inRound(js.round, node)
	if !current {
		if alive {
			log.Warn("stopping workers of a stale generation")
			c.sendStop(node, w.GetJob(), w.GetGeneration(), "stale generation")
		}
		return
	}
	if alive && js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING {
		c.sendStop(node, w.GetJob(), w.GetGeneration(), "job is "+stateName(js.rec.GetState()))
	}
	prev := js.workers[node]
	if prev.GetState() == w.GetState() || terminalWorker(prev.GetState()) {
		return
	}
	var ev *rdzvv1.Event
	if alive {
		ev = c.event(js.rec.GetSpec().GetName(), node, w.GetGeneration(), EventWorkerStarted, "workers started on %s", node)
	} else {
		ev = c.event(js.rec.GetSpec().GetName(), node, w.GetGeneration(), EventWorkerExited, "workers on %s %s", node, describeExit(w))
	}
	js.workers[node] = w
	c.persist(c.store.PutWorker(w.GetJob(), node, w, ev), nil)
	if alive && !js.reportsSteps && allRunning(js) {
		c.resumeTraining(js)
	}
	log.Info("worker status", zap.String("state", w.GetState().String()), zap.Int32("exit_code", w.GetExitCode()), zap.String("signal", w.GetSignal()))
	if !alive {
		c.release(node, js)
	}
	c.advanceJob(js)
}

func describeExit(w *rdzvv1.WorkerStatus) string {
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

// release frees a node whose part in js is over.
func (c *Controller) release(node string, js *jobState) {
	if ns := c.nodes[node]; ns != nil && ns.job == js.rec.GetSpec().GetName() {
		ns.job, ns.generation = "", 0
		c.wake()
	}
}

func allRunning(js *jobState) bool {
	for _, a := range js.round.GetNodes() {
		if js.workers[a.GetNode()].GetState() != rdzvv1.WorkerState_WORKER_STATE_RUNNING {
			return false
		}
	}
	return true
}

func inRound(r *rdzvv1.Round, node string) bool {
	for _, a := range r.GetNodes() {
		if a.GetNode() == node {
			return true
		}
	}
	return false
}

func (c *Controller) sendStop(node, job string, generation uint64, reason string) {
	ns := c.nodes[node]
	if ns == nil || ns.session == nil {
		return
	}
	ns.session.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_StopWorkers{StopWorkers: &rdzvv1.StopWorkers{
		Job: job, Generation: generation, Reason: reason,
	}}})
}
