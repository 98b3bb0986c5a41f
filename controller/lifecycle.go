package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/health"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/rendezvous"
)

const (
	// portProbeTimeout bounds the wait for the rank 0 agent to confirm a
	// master port; a silent agent fails the attempt, not the job.
	portProbeTimeout = 5 * time.Second
	// scheduleInterval re-examines pending jobs even without a trigger, so a
	// missed wake-up costs at most this long.
	scheduleInterval = time.Second
)

var (
	errNotFound      = errors.New("not found")
	errAlreadyExists = errors.New("already exists")
	errUnavailable   = errors.New("unavailable")
)

func requirements(spec *rdzvv1.JobSpec) rendezvous.Requirements {
	return rendezvous.Requirements{
		Min: int(spec.GetNodesMin()), Max: int(spec.GetNodesMax()),
		GPUsPerNode: int(spec.GetGpusPerNode()), Selector: spec.GetSelector(),
	}
}

// scheduleLoop runs scheduling passes when woken, when a last call expires,
// and periodically.
func (c *Controller) scheduleLoop(ctx context.Context) {
	for {
		next := c.schedule(ctx)
		wait := scheduleInterval
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(c.clock.Now()), 0))
		}
		timer := c.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-c.kick:
		case <-timer.Chan():
		}
		timer.Stop()
	}
}

// schedule is one pass over pending jobs, oldest first, each seeing only the
// nodes that older jobs did not take. It returns the earliest time a
// decision may change by itself.
func (c *Controller) schedule(ctx context.Context) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	candidates := c.candidates()
	taken := map[string]bool{}
	var next time.Time

	for _, js := range c.pendingJobs(now) {
		spec := js.rec.GetSpec()
		name := spec.GetName()
		req := requirements(spec)
		avail := make([]rendezvous.Candidate, 0, len(candidates))
		for _, cand := range candidates {
			if !taken[cand.Name] {
				avail = append(avail, cand)
			}
		}
		if js.pendingSince.IsZero() {
			js.pendingSince = now
		}
		if timeout := spec.GetRendezvousTimeout().AsDuration(); timeout > 0 && now.Sub(js.pendingSince) >= timeout {
			c.finish(js, rdzvv1.JobState_JOB_STATE_FAILED, fmt.Sprintf("rendezvous timed out after %s: %s", timeout, rendezvous.Explain(req, avail)))
			continue
		}
		window := spec.GetRendezvousLastCall().AsDuration()
		if prev := len(js.round.GetNodes()); js.rec.GetState() == rdzvv1.JobState_JOB_STATE_RECOVERING && rendezvous.Count(req, avail) >= prev {
			// As many nodes as the failed generation had are ready: waiting
			// for more would only lengthen the outage.
			window = 0
		}
		d := js.lastCall.Observe(now, rendezvous.Count(req, avail), req, window)
		if !d.Commit {
			js.rec.Reason = d.Reason
			if req.Min > rendezvous.Count(req, avail) {
				js.rec.Reason = "waiting for nodes: " + rendezvous.Explain(req, avail)
			}
			if !d.RecheckAt.IsZero() && (next.IsZero() || d.RecheckAt.Before(next)) {
				next = d.RecheckAt
			}
			continue
		}
		placed, err := rendezvous.Plan(req, avail)
		if err != nil {
			js.rec.Reason = err.Error()
			continue
		}
		for _, p := range placed {
			taken[p.Name] = true
			c.nodes[p.Name].job, c.nodes[p.Name].generation = name, 0
		}
		js.committing = true
		js.rec.Reason = d.Reason + "; committing rendezvous"
		go c.commit(ctx, c.term, name, placed)
	}
	for _, js := range c.jobs {
		if js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RECOVERING {
			continue
		}
		// Woken when the backoff is over and the lost nodes have fenced
		// themselves, not at the next periodic pass: that would add up to
		// scheduleInterval to every recovery.
		fencedAt, ok := c.fencedAt(js)
		if !ok {
			continue // a worker's exit report wakes the loop
		}
		at := js.rec.GetRestartNotBefore().AsTime()
		if fencedAt.After(at) {
			at = fencedAt
		}
		if at.After(now) && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	return next
}

// pendingJobs lists the jobs waiting for a rendezvous: new ones, and
// recovering ones whose backoff is over and whose previous generation has
// no live worker left anywhere (so two generations never run at once).
func (c *Controller) pendingJobs(now time.Time) []*jobState {
	var out []*jobState
	for _, js := range c.jobs {
		if js.committing {
			continue
		}
		switch js.rec.GetState() {
		case rdzvv1.JobState_JOB_STATE_PENDING:
			out = append(out, js)
		case rdzvv1.JobState_JOB_STATE_RECOVERING:
			if c.fenced(js) && !now.Before(js.rec.GetRestartNotBefore().AsTime()) {
				out = append(out, js)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].rec.GetCreatedAt().AsTime(), out[j].rec.GetCreatedAt().AsTime()
		if !a.Equal(b) {
			return a.Before(b)
		}
		return out[i].rec.GetSpec().GetName() < out[j].rec.GetSpec().GetName()
	})
	return out
}

// candidates lists every known node; Free only for nodes that are ready,
// connected and idle.
func (c *Controller) candidates() []rendezvous.Candidate {
	out := make([]rendezvous.Candidate, 0, len(c.nodes))
	for name, ns := range c.nodes {
		info := ns.rec.GetInfo()
		gpus := make([]uint32, len(info.GetGpus()))
		for i, g := range info.GetGpus() {
			gpus[i] = g.GetIndex()
		}
		out = append(out, rendezvous.Candidate{
			Name: name, Labels: info.GetLabels(), GPUs: gpus,
			Address: info.GetAddress(), Interface: info.GetNcclInterface(),
			Free: ns.rec.GetState() == rdzvv1.NodeState_NODE_STATE_READY && ns.session != nil && ns.job == "" && !ns.rec.GetCordoned(),
		})
	}
	return out
}

// commit turns a placement into a round: the rank 0 agent confirms a free
// master port, then one etcd transaction moves the job to its next
// generation, then every agent gets its assignment.
func (c *Controller) commit(ctx context.Context, term uint64, name string, placed []rendezvous.Placed) {
	log := c.log.With(zap.String("job", name))
	port, probeErr := c.probeMasterPort(ctx, placed[0].Name)

	c.mu.Lock()
	defer c.mu.Unlock()
	js := c.jobs[name]
	if js == nil || c.term != term || !c.leading.Load() {
		// Planned under a lead that has ended: the view it was made from
		// is gone.
		return
	}
	js.committing = false
	abort := func(reason string) {
		for _, p := range placed {
			if ns := c.nodes[p.Name]; ns != nil && ns.job == name && ns.generation == 0 {
				ns.job = ""
			}
		}
		js.rec.Reason = reason
		c.wake()
	}
	if probeErr != nil {
		log.Warn("master port probe failed", zap.String("node", placed[0].Name), zap.Error(probeErr))
		abort(fmt.Sprintf("retrying rendezvous: %v", probeErr))
		return
	}
	if st := js.rec.GetState(); st != rdzvv1.JobState_JOB_STATE_PENDING && st != rdzvv1.JobState_JOB_STATE_RECOVERING {
		abort(js.rec.GetReason())
		return
	}
	for _, p := range placed {
		if ns := c.nodes[p.Name]; ns == nil || ns.session == nil || ns.rec.GetState() != rdzvv1.NodeState_NODE_STATE_READY {
			abort(fmt.Sprintf("retrying rendezvous: node %s went away while committing", p.Name))
			return
		}
	}

	now := c.clock.Now()
	gen := js.rec.GetGeneration() + 1
	master := placed[0].Address
	round := &rdzvv1.Round{Job: name, Generation: gen, MasterAddr: master, MasterPort: port, CommittedAt: timestamppb.New(now)}
	for _, p := range placed {
		round.Nodes = append(round.Nodes, &rdzvv1.NodeAssignment{
			Node: p.Name, NodeRank: uint32(p.Rank), Address: p.Address, NcclInterface: p.Interface, GpuIndices: p.GPUIndices,
		})
	}
	rec := proto.Clone(js.rec).(*rdzvv1.Job)
	rec.State, rec.Generation, rec.MasterAddr, rec.MasterPort = rdzvv1.JobState_JOB_STATE_RUNNING, gen, master, port
	rec.Reason = fmt.Sprintf("running on %d nodes", len(placed))
	rec.StartedAt = timestamppb.New(now)
	rec.Step, rec.ProgressAt = 0, nil
	resume := "from scratch"
	if cp := rec.GetLatestCheckpoint(); cp != nil {
		resume = fmt.Sprintf("from checkpoint step %d", cp.GetStep())
	}
	rec.TrainingSince = timestamppb.New(now)
	if rec.RecoveryStartedAt != nil {
		// Still recovering until the new generation is back to training:
		// resumeTraining ends the interval.
		rec.TrainingSince, rec.RestartNotBefore = nil, nil
		rec.Reason += ", resumed " + resume
	}
	ev := c.event(name, "", gen, EventRendezvousCommitted, "generation %d: %d nodes %s, master %s:%d, starting %s",
		gen, len(placed), nodeList(placed), master, port, resume)
	js.rec, js.round = rec, round
	js.workers = map[string]*rdzvv1.WorkerStatus{}
	js.lastCall = rendezvous.LastCall{}
	js.progressed = false
	for _, p := range placed {
		c.nodes[p.Name].generation = gen
	}
	c.persist(c.store.CommitRound(rec, round, ev), func() {
		log.Info("rendezvous committed", zap.Uint64("generation", gen), zap.Int("nodes", len(placed)),
			zap.String("master_addr", master), zap.Uint32("master_port", port))
		c.sendAssignments(js, round)
	})
}

// sendAssignments sends each node of round its assignment, unless the job
// moved on meanwhile (the node then learns of the newer state instead).
// Callers hold c.mu.
func (c *Controller) sendAssignments(js *jobState, round *rdzvv1.Round) {
	if js.round != round || c.jobs[js.rec.GetSpec().GetName()] != js {
		return
	}
	for _, a := range round.GetNodes() {
		ns := c.nodes[a.GetNode()]
		if ns == nil || ns.session == nil || ns.job != js.rec.GetSpec().GetName() || ns.generation != round.GetGeneration() {
			continue
		}
		if asg := c.assignmentFor(js, a.GetNode()); asg != nil {
			ns.session.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_Assignment{Assignment: asg}})
		}
	}
}

func nodeList(placed []rendezvous.Placed) string {
	names := make([]string, len(placed))
	for i, p := range placed {
		names[i] = p.Name
	}
	if len(names) > 8 {
		return fmt.Sprintf("%v... (+%d)", names[:8], len(names)-8)
	}
	return fmt.Sprint(names)
}

func (c *Controller) probeMasterPort(ctx context.Context, node string) (uint32, error) {
	c.mu.Lock()
	var sess *session
	if ns := c.nodes[node]; ns != nil {
		sess = ns.session
	}
	c.mu.Unlock()
	if sess == nil {
		return 0, fmt.Errorf("probing master port on %s: %w: node not connected", node, errUnavailable)
	}
	id := newID()
	replies := sess.expect(id, 1)
	defer sess.forget(id)
	sess.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_PortProbe{PortProbe: &rdzvv1.PortProbe{
		RequestId: id, PortMin: uint32(c.cfg.MasterPortRange.Min), PortMax: uint32(c.cfg.MasterPortRange.Max),
	}}})
	timer := c.clock.NewTimer(portProbeTimeout)
	defer timer.Stop()
	select {
	case m := <-replies:
		res := m.GetPortProbeResult()
		if res.GetError() != "" {
			return 0, fmt.Errorf("probing master port on %s: %s", node, res.GetError())
		}
		return res.GetPort(), nil
	case <-timer.Chan():
		return 0, fmt.Errorf("probing master port on %s: no answer within %s", node, portProbeTimeout)
	case <-sess.ctx.Done():
		return 0, fmt.Errorf("probing master port on %s: %w: node disconnected", node, errUnavailable)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// assignmentFor builds node's assignment in the job's current round.
func (c *Controller) assignmentFor(js *jobState, node string) *rdzvv1.Assignment {
	for _, a := range js.round.GetNodes() {
		if a.GetNode() == node {
			return &rdzvv1.Assignment{
				Spec: js.rec.GetSpec(), Generation: js.round.GetGeneration(), NodeRank: a.GetNodeRank(),
				Nnodes: uint32(len(js.round.GetNodes())), ProcsPerNode: js.rec.GetSpec().GetProcsPerNode(),
				MasterAddr: js.round.GetMasterAddr(), MasterPort: js.round.GetMasterPort(), GpuIndices: a.GetGpuIndices(),
				ResumeFrom: js.rec.GetLatestCheckpoint().GetPath(),
			}
		}
	}
	return nil
}

// advanceJob moves a running or stopping job on from its workers' states.
// Callers hold c.mu.
func (c *Controller) advanceJob(js *jobState) {
	nodes := js.round.GetNodes()
	switch js.rec.GetState() {
	case rdzvv1.JobState_JOB_STATE_RUNNING:
		succeeded := 0
		for _, a := range nodes {
			w := js.workers[a.GetNode()]
			switch w.GetState() {
			case rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED:
				succeeded++
			case rdzvv1.WorkerState_WORKER_STATE_FAILED, rdzvv1.WorkerState_WORKER_STATE_STOPPED:
				c.attemptFailed(js, fmt.Sprintf("node %s (rank %d): workers %s", a.GetNode(), a.GetNodeRank(), describeExit(w)), c.detectionLatency(w))
				return
			}
		}
		if succeeded == len(nodes) {
			c.finish(js, rdzvv1.JobState_JOB_STATE_SUCCEEDED, fmt.Sprintf("all %d nodes finished", len(nodes)))
		}
	case rdzvv1.JobState_JOB_STATE_RECOVERING:
		if c.fenced(js) {
			c.wake()
		}
	case rdzvv1.JobState_JOB_STATE_STOPPING:
		for _, a := range nodes {
			if !terminalWorker(js.workers[a.GetNode()].GetState()) {
				return
			}
		}
		c.finish(js, rdzvv1.JobState_JOB_STATE_STOPPED, "stopped by operator")
	}
}

// finish moves a job to a terminal state and stops whatever still runs.
// Callers hold c.mu.
func (c *Controller) finish(js *jobState, state rdzvv1.JobState, reason string) {
	name := js.rec.GetSpec().GetName()
	rec := proto.Clone(js.rec).(*rdzvv1.Job)
	c.closeInterval(rec)
	rec.State, rec.Reason, rec.FinishedAt = state, reason, timestamppb.New(c.clock.Now())
	kind := map[rdzvv1.JobState]string{
		rdzvv1.JobState_JOB_STATE_SUCCEEDED: EventJobSucceeded,
		rdzvv1.JobState_JOB_STATE_FAILED:    EventJobFailed,
		rdzvv1.JobState_JOB_STATE_STOPPED:   EventJobStopped,
	}[state]
	js.rec = rec
	c.persist(c.store.UpdateJob(rec, c.event(name, "", rec.GetGeneration(), kind, "%s", reason)), func() {
		c.log.Info("job finished", zap.String("job", name), zap.String("state", stateName(state)), zap.String("reason", reason))
		c.stopWorkers(js, reason)
	})
	c.wake()
}

// stopWorkers tells every node of the current round whose workers may still
// run to stop them. Callers hold c.mu.
func (c *Controller) stopWorkers(js *jobState, reason string) {
	for _, a := range js.round.GetNodes() {
		if !terminalWorker(js.workers[a.GetNode()].GetState()) {
			c.sendStop(a.GetNode(), js.rec.GetSpec().GetName(), js.rec.GetGeneration(), reason)
		}
	}
}

// livenessLoop declares nodes lost when their heartbeats stop. Liveness is
// in memory: etcd is written only when a node changes state.
func (c *Controller) livenessLoop(ctx context.Context) {
	ticker := c.clock.NewTicker(max(c.cfg.Heartbeat.Interval.Duration/2, 50*time.Millisecond))
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
			c.checkLiveness()
		}
	}
}

func (c *Controller) checkLiveness() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	policy := c.cfg.Heartbeat.policy()
	votes, reporters := c.gossipVotes()
	warned := 0
	for name, ns := range c.nodes {
		if warned < maxExpiryWarningsPerPass && c.warnCertExpiry(now, ns) {
			warned++
		}
		if ns.rec.GetState() == rdzvv1.NodeState_NODE_STATE_LOST {
			continue
		}
		seen := ns.lastSeen
		if ns.session != nil {
			seen = ns.session.seen()
		}
		l := policy.Liveness(now, health.Silence{LastSeen: seen, HoldUntil: ns.restartHold, GraceUntil: ns.graceUntil,
			Peers: health.Peers{Unreachable: votes[name], Vouching: reporters - votes[name] - ns.selfReporter()}})
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
	}
	c.checkHangs(now)
}

// markLost declares a node lost. Callers hold c.mu.
func (c *Controller) markLost(name string, ns *nodeState, now, lastSeen time.Time, reason string) {
	rec := proto.Clone(ns.rec).(*rdzvv1.Node)
	rec.State, rec.StateChangedAt = rdzvv1.NodeState_NODE_STATE_LOST, timestamppb.New(c.clock.Now())
	rec.RestartHoldUntil = nil
	ns.rec = rec
	c.persist(c.store.PutNode(rec, c.event(ns.job, name, ns.generation, EventNodeLost, "node %s lost: %s", name, reason)), nil)
	ns.fencedBy = c.cfg.Heartbeat.policy().FencedBy(health.Loss{
		At: now, LastSeen: lastSeen, Heard: ns.heard, ElectedAt: c.electedAt, HoldUntil: ns.restartHold,
		Gossips: rec.GetInfo().GetGossipAddr() != "", Unreachable: c.unreachableTo(name),
	})
	c.log.Warn("node lost", zap.String("node", name), zap.Duration("silent", now.Sub(lastSeen)))
	if ns.session != nil {
		ns.session.cancel()
		ns.session = nil
	}
	if ns.job == "" {
		return
	}
	if js := c.jobs[ns.job]; js != nil && js.rec.GetGeneration() == ns.generation && ns.generation != 0 {
		c.countLoss(name, ns)
		c.applyWorkerStatus(name, &rdzvv1.WorkerStatus{
			Job: ns.job, Generation: ns.generation, State: rdzvv1.WorkerState_WORKER_STATE_FAILED,
			ExitCode: -1, Message: "node lost: " + reason, ExitedAt: timestamppb.New(lastSeen),
		})
	}
	ns.job, ns.generation = "", 0
}

// startJob stores a new job, whose spec the API's guard (validate.go)
// validated on the way in. A finished job of the same name is replaced; its
// generation count carries on so that no late report from the old job can
// be mistaken for the new one.
func (c *Controller) startJob(ctx context.Context, specProto *rdzvv1.JobSpec) (*rdzvv1.Job, error) {
	spec := jobspec.FromProto(specProto)
	c.mu.Lock()
	name := spec.Name
	var replace bool
	var generation uint64
	if old := c.jobs[name]; old != nil {
		if !terminalJob(old.rec.GetState()) {
			c.mu.Unlock()
			return nil, fmt.Errorf("job %s is %s; stop it before starting it again: %w", name, stateName(old.rec.GetState()), errAlreadyExists)
		}
		replace, generation = true, old.rec.GetGeneration()
	}
	now := c.clock.Now()
	rec := &rdzvv1.Job{Spec: spec.ToProto(), State: rdzvv1.JobState_JOB_STATE_PENDING, Reason: "waiting for rendezvous",
		Generation: generation, CreatedAt: timestamppb.New(now)}
	ev := c.event(name, "", generation, EventJobSubmitted, "job submitted: %d-%d nodes, %d GPUs and %d processes per node",
		spec.Nodes.Min, spec.Nodes.Max, spec.GPUsPerNode, spec.ProcsPerNode)
	js := &jobState{rec: rec, workers: map[string]*rdzvv1.WorkerStatus{}, pendingSince: now}
	c.jobs[name] = js
	view := c.jobView(js)
	reply := c.persistWait(c.store.CreateJob(rec, replace, ev))
	c.mu.Unlock()
	if err := await(ctx, reply); err != nil {
		return nil, fmt.Errorf("storing job %s: %w", name, err)
	}
	c.log.Info("job submitted", zap.String("job", name))
	c.wake()
	return view, nil
}

func (c *Controller) stopJob(ctx context.Context, name string) (*rdzvv1.Job, error) {
	c.mu.Lock()
	js := c.jobs[name]
	if js == nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("job %s: %w", name, errNotFound)
	}
	switch js.rec.GetState() {
	case rdzvv1.JobState_JOB_STATE_PENDING:
		c.finish(js, rdzvv1.JobState_JOB_STATE_STOPPED, "stopped by operator before it started")
	case rdzvv1.JobState_JOB_STATE_RUNNING, rdzvv1.JobState_JOB_STATE_RECOVERING:
		rec := proto.Clone(js.rec).(*rdzvv1.Job)
		c.closeInterval(rec)
		rec.State, rec.Reason = rdzvv1.JobState_JOB_STATE_STOPPING, "stopping: waiting for workers to exit"
		js.rec = rec
		c.persist(c.store.UpdateJob(rec, c.event(name, "", rec.GetGeneration(), EventJobStopping, "stop requested by operator")), func() {
			c.stopWorkers(js, "stopped by operator")
		})
		c.advanceJob(js)
	}
	view := c.jobView(js)
	// Answered once the stop (and whatever it led to) is durable.
	reply := make(chan error, 1)
	c.queueWrite(pendingWrite{reply: reply})
	c.mu.Unlock()
	if err := await(ctx, reply); err != nil {
		return nil, fmt.Errorf("stopping job %s: %w", name, err)
	}
	return view, nil
}

// jobView is the API form of a job: its record plus the current round's
// assignments and worker states.
func (c *Controller) jobView(js *jobState) *rdzvv1.Job {
	j := proto.Clone(js.rec).(*rdzvv1.Job)
	j.Spec = jobspec.RedactSpec(j.GetSpec())
	// Totals up to now, while still showing which interval is open.
	c.closeInterval(j)
	j.RecoveryStartedAt, j.TrainingSince = js.rec.GetRecoveryStartedAt(), js.rec.GetTrainingSince()
	if js.round == nil || js.round.GetGeneration() != js.rec.GetGeneration() {
		return j
	}
	for _, a := range js.round.GetNodes() {
		v := proto.Clone(a).(*rdzvv1.NodeAssignment)
		v.State = rdzvv1.WorkerState_WORKER_STATE_ASSIGNED
		if w := js.workers[a.GetNode()]; w != nil {
			v.State, v.ExitCode, v.Signal, v.Message = w.GetState(), w.GetExitCode(), w.GetSignal(), w.GetMessage()
		}
		j.Assignments = append(j.Assignments, v)
	}
	return j
}

// nodeView is the API form of a node, with the in-memory liveness and job.
func (c *Controller) nodeView(ns *nodeState) *rdzvv1.Node {
	n := proto.Clone(ns.rec).(*rdzvv1.Node)
	seen := ns.lastSeen
	if ns.session != nil {
		seen = ns.session.seen()
	}
	n.LastHeartbeat = timestamppb.New(seen)
	n.Job, n.Generation = ns.job, ns.generation
	if n.State == rdzvv1.NodeState_NODE_STATE_READY && ns.job != "" {
		n.State = rdzvv1.NodeState_NODE_STATE_BUSY
	}
	return n
}

func stateName(s rdzvv1.JobState) string {
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
