package controller

// The scheduler: pending jobs, their candidates, and a round's commit.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jonboulle/clockwork"

	"github.com/rdzv/rdzv/controller/lifecycle"
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
	pending := c.jobs.pending(c.nodes, now)
	holding := c.jobs.holdingSpares()
	warm := c.jobs.warmJobs()
	placeIdle := len(warm) > 0 && !now.Before(c.standbys.idleAt.Add(idleStandbyEvery))
	growing := c.jobs.growChecks()
	var candidates []rendezvous.Candidate
	if len(pending) > 0 || len(holding) > 0 || placeIdle || len(growing) > 0 {
		// Only pending jobs, spares, idle standbys and growth need them, and
		// building them is a pass over every node: the scheduler is woken
		// by every worker exit, N of them in a recovery.
		candidates = c.nodes.candidates()
	}
	held := holdSpares(holding, candidates)
	switch {
	case len(warm) == 0:
		c.standbys.idle = nil
	case candidates != nil:
		c.standbys.idle, c.standbys.idleAt = placeIdleStandbys(warm, candidates, c.jobs.withRounds(held, warm), c.standbys.jobs()), now
	}
	c.standbys.tell(c.nodes, c.jobs, held, c.standbys.idle, now, c.log)
	var prefer map[string]map[string]bool
	if len(pending) > 0 {
		prefer = c.standbys.nodes()
	}
	taken := map[string]bool{}
	var next time.Time

	for _, js := range pending {
		spec := js.rec.GetSpec()
		name := spec.GetName()
		req := requirements(spec)
		if c.jobs.warm(name) {
			req.Prefer = preferStandbys(prefer[name], js.members.Round())
		}
		avail := make([]rendezvous.Candidate, 0, len(candidates))
		heldElsewhere := 0
		for _, cand := range candidates {
			switch {
			case taken[cand.Name], js.excluded[cand.Name] != "":
			case held[cand.Name] != "" && held[cand.Name] != name:
				heldElsewhere++
			default:
				avail = append(avail, cand)
			}
		}
		if js.pendingSince.IsZero() {
			js.pendingSince = now
		}
		if timeout := spec.GetRendezvousTimeout().AsDuration(); timeout > 0 && now.Sub(js.pendingSince) >= timeout {
			c.apply(js, lifecycle.Finish(js.rec, rdzvv1.JobState_JOB_STATE_FAILED, fmt.Sprintf("rendezvous timed out after %s: %s", timeout, rendezvous.Explain(req, avail)), now))
			continue
		}
		window := spec.GetRendezvousLastCall().AsDuration()
		if prev := max(len(js.members.Round().GetNodes()), js.growTo); js.rec.GetState() == rdzvv1.JobState_JOB_STATE_RECOVERING && rendezvous.Count(req, avail) >= prev {
			// As many nodes as the failed generation had (or a grow aims
			// for) are ready: waiting for more would only lengthen the
			// outage.
			window = 0
		}
		d := js.lastCall.Observe(now, rendezvous.Count(req, avail), req, window)
		if !d.Commit {
			js.rec.Reason = d.Reason
			if req.Min > rendezvous.Count(req, avail) {
				js.rec.Reason = "waiting for nodes: " + rendezvous.Explain(req, avail)
				if heldElsewhere > 0 {
					js.rec.Reason += fmt.Sprintf("; %d idle node(s) held as spares for running jobs", heldElsewhere)
				}
				if n := len(js.excluded); n > 0 {
					js.rec.Reason += fmt.Sprintf("; %d node(s) left out by the preflight test", n)
				}
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
		go c.commit(ctx, c.tenure.term, name, placed)
	}
	waiting := slices.ContainsFunc(pending, func(js *jobState) bool {
		st := js.rec.GetState()
		return !js.committing && (st == rdzvv1.JobState_JOB_STATE_PENDING || st == rdzvv1.JobState_JOB_STATE_RECOVERING)
	})
	c.growJobs(growing, candidates, taken, held, waiting)
	for _, js := range c.jobs {
		if js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RECOVERING {
			continue
		}
		// Woken when the backoff is over and the lost nodes have fenced
		// themselves, not at the next periodic pass: that would add up to
		// scheduleInterval to every recovery.
		fencedAt, ok := c.nodes.fencedAt(js)
		if !ok {
			continue // a worker's exit report wakes the loop
		}
		switch {
		case fencedAt.IsZero():
			// Fenced by exit reports, which noted their time, unless a
			// new leader found it so.
			lifecycle.NoteFenced(js.rec, now)
		case !fencedAt.After(now):
			// Fenced by the lost nodes' deadline, whenever a pass sees it.
			lifecycle.NoteFenced(js.rec, fencedAt)
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

// holdingSpares lists the jobs that hold spare nodes now (nodes.spares,
// while running or recovering), oldest first, and forgets the spares of
// every other job.
func (jt jobTable) holdingSpares() []*jobState {
	var out []*jobState
	for _, js := range jt {
		st := js.rec.GetState()
		if js.rec.GetSpec().GetNodesSpares() == 0 || (st != rdzvv1.JobState_JOB_STATE_RUNNING && st != rdzvv1.JobState_JOB_STATE_RECOVERING) {
			js.spares = nil
			continue
		}
		out = append(out, js)
	}
	sortOldestFirst(out)
	return out
}

// holdSpares picks each holding job's spares among the candidates, oldest
// job first, as a round would pick its nodes (free, healthy, enough GPUs,
// matching the selector, in rank order), and returns which job holds each.
// No other job gets them; the holding job's next round may, when it
// recovers. A recovering job also holds as many free nodes as its failed
// round had (its own, once their workers stopped): otherwise another job
// could take them during the backoff and the recovery would wait after
// all. Picked anew on every pass: a spare that fails a health check or
// goes away is replaced by the next eligible node.
func holdSpares(holding []*jobState, candidates []rendezvous.Candidate) map[string]string {
	held := map[string]string{}
	for _, js := range holding {
		spec := js.rec.GetSpec()
		req := requirements(spec)
		req.Min, req.Max = 0, int(spec.GetNodesSpares())
		if js.rec.GetState() == rdzvv1.JobState_JOB_STATE_RECOVERING {
			req.Max += len(js.members.Round().GetNodes())
		}
		avail := make([]rendezvous.Candidate, 0, len(candidates))
		for _, cand := range candidates {
			if held[cand.Name] == "" && js.excluded[cand.Name] == "" {
				avail = append(avail, cand)
			}
		}
		// Min 0 cannot fall short: Plan never fails here.
		placed, _ := rendezvous.Plan(req, avail)
		js.spares = nil
		for _, p := range placed {
			held[p.Name] = spec.GetName()
			js.spares = append(js.spares, p.Name)
		}
	}
	return held
}

// pending lists the jobs waiting for a rendezvous: new ones, and
// recovering ones whose backoff is over and whose previous generation has
// no live worker left anywhere (so two generations never run at once).
func (jt jobTable) pending(nt nodeTable, now time.Time) []*jobState {
	var out []*jobState
	for _, js := range jt {
		if js.committing {
			continue
		}
		switch js.rec.GetState() {
		case rdzvv1.JobState_JOB_STATE_PENDING:
			out = append(out, js)
		case rdzvv1.JobState_JOB_STATE_RECOVERING:
			if nt.fenced(js, now) && !now.Before(js.rec.GetRestartNotBefore().AsTime()) {
				out = append(out, js)
			}
		}
	}
	sortOldestFirst(out)
	return out
}

// sortOldestFirst orders jobs by creation, then name.
func sortOldestFirst(jobs []*jobState) {
	sort.Slice(jobs, func(i, j int) bool {
		a, b := jobs[i].rec.GetCreatedAt().AsTime(), jobs[j].rec.GetCreatedAt().AsTime()
		if !a.Equal(b) {
			return a.Before(b)
		}
		return jobs[i].rec.GetSpec().GetName() < jobs[j].rec.GetSpec().GetName()
	})
}

// submitWarnings are what rdzvctl shows of a submitted spec that is valid
// but likely not meant, judged against candidates, the nodes registered
// now.
func submitWarnings(spec *rdzvv1.JobSpec, candidates []rendezvous.Candidate) []string {
	if w := rendezvous.GPUWarning(requirements(spec), candidates); w != "" {
		return []string{w}
	}
	return nil
}

// candidates lists every known node; Free only for nodes that are ready,
// connected and idle.
func (nt nodeTable) candidates() []rendezvous.Candidate {
	out := make([]rendezvous.Candidate, 0, len(nt))
	for name, ns := range nt {
		info := &ns.info
		out = append(out, rendezvous.Candidate{
			Name: name, Labels: info.labels, GPUs: info.gpuIndices,
			Address: info.address, Interface: info.ncclInterface,
			Free:      ns.rec.GetState() == rdzvv1.NodeState_NODE_STATE_READY && ns.session != nil && ns.job == "" && !ns.rec.GetCordoned(),
			Cordoned:  ns.rec.GetCordoned(),
			Unhealthy: ns.unhealthy,
		})
	}
	return out
}

// commit turns a placement into a round: the rank 0 agent confirms a free
// master port, then one etcd transaction moves the job to its next
// generation, then every agent gets its assignment.
func (c *Controller) commit(ctx context.Context, term uint64, name string, placed []rendezvous.Placed) {
	log := c.log.With(zap.String("job", name))
	c.mu.Lock()
	var ahead *masterProbe
	if js := c.jobs[name]; js != nil {
		ahead, js.probe = js.probe, nil
	}
	sess := c.nodes.sessionOf(placed[0].Name)
	c.mu.Unlock()
	port, probeErr := masterPort(ctx, c.clock, ahead, sess, placed[0].Name, c.cfg.MasterPortRange)

	c.mu.Lock()
	defer c.mu.Unlock()
	js := c.jobs[name]
	if js == nil || c.tenure.term != term || !c.gate.leading() {
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
	resume := ""
	plan, resumeEv := c.nodes.planMemory(js, gen, len(placed), now)
	if plan != nil {
		resume = fmt.Sprintf("from in-memory step %d", plan.key.step)
	}
	var more []*rdzvv1.Event
	if resumeEv != nil {
		more = append(more, resumeEv)
		c.metrics.resumed(resumeEv.GetKind())
	}
	t := lifecycle.Committed(js.rec, lifecycle.Commit{Round: round, Nodes: nodeList(placed), Resume: resume}, now)
	js.members.Reset(round, nil)
	js.memPlan, js.growTo = plan, 0
	js.lastCall = rendezvous.LastCall{}
	js.progressed = false
	js.training.newGeneration()
	js.memNewest, js.memNewestAt = 0, time.Time{}
	for _, p := range placed {
		c.nodes[p.Name].generation = gen
	}
	c.metrics.committed(js, now)
	c.apply(js, t, more...)
}

// sendAssignments sends each node of round, js's, its assignment, unless
// the job moved on meanwhile (the node then learns of the newer state
// instead).
func (nt nodeTable) sendAssignments(jt jobTable, js *jobState, round *rdzvv1.Round) {
	for _, a := range round.GetNodes() {
		nt.sendAssignment(jt, js, round, a)
	}
}

// sendAssignment is sendAssignments for one node of round.
func (nt nodeTable) sendAssignment(jt jobTable, js *jobState, round *rdzvv1.Round, a *rdzvv1.NodeAssignment) {
	if js.members.Round() != round || jt[js.rec.GetSpec().GetName()] != js {
		return
	}
	ns := nt[a.GetNode()]
	if ns == nil || ns.session == nil || ns.job != js.rec.GetSpec().GetName() || ns.generation != round.GetGeneration() {
		return
	}
	ns.session.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_Assignment{Assignment: nt.assignmentOf(js, a)}})
}

// sessionOf is node's session, nil when it is unknown or not connected.
func (nt nodeTable) sessionOf(node string) *session {
	if ns := nt[node]; ns != nil {
		return ns.session
	}
	return nil
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

// probeMasterPort asks node's agent, on sess (nil: not connected), for a
// free master port in ports.
func probeMasterPort(ctx context.Context, clock clockwork.Clock, sess *session, node string, ports PortRange) (uint32, error) {
	if sess == nil {
		return 0, fmt.Errorf("probing master port on %s: %w: node not connected", node, errUnavailable)
	}
	id := newID()
	replies := sess.expect(id, 1)
	defer sess.forget(id)
	sess.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_PortProbe{PortProbe: &rdzvv1.PortProbe{
		RequestId: id, PortMin: uint32(ports.Min), PortMax: uint32(ports.Max),
	}}})
	timer := clock.NewTimer(portProbeTimeout)
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

// probeAheadFresh is how old a master port probed ahead may be at the
// commit: the port was free then, and nothing of the job runs on the node
// meanwhile.
const probeAheadFresh = 10 * time.Second

// masterProbe is a master port probe made ahead of a commit. port and err
// are written once, before done is closed.
type masterProbe struct {
	node string
	at   time.Time
	done chan struct{}
	port uint32
	err  error
}

// startProbe probes node's master port, on sess, for a job's next round
// while the recovery still waits for the failed generation to stop
// everywhere or for a lost node's fencing deadline. node is the failed
// round's rank 0, whose workers just stopped: ranks go by node name, so it
// is most often the next round's rank 0 too, and its probe's round trip
// (up to a second on a controller busy with every node's stop report) is
// then off the path to the commit.
func startProbe(clock clockwork.Clock, sess *session, node string, ports PortRange) *masterProbe {
	p := &masterProbe{node: node, at: clock.Now(), done: make(chan struct{})}
	go func() {
		// Bounded by portProbeTimeout and by the session, which a lead
		// that ends ends too.
		p.port, p.err = probeMasterPort(context.Background(), clock, sess, node, ports)
		close(p.done)
	}()
	return p
}

// masterPort is the master port of a round whose rank 0 is node: ahead's
// (the probe made ahead of the commit, may be nil) if it was node's,
// answered and fresh, else a new probe's on sess.
func masterPort(ctx context.Context, clock clockwork.Clock, ahead *masterProbe, sess *session, node string, ports PortRange) (uint32, error) {
	if ahead != nil && ahead.node == node {
		select {
		case <-ahead.done:
			if ahead.err == nil && clock.Since(ahead.at) < probeAheadFresh {
				return ahead.port, nil
			}
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return probeMasterPort(ctx, clock, sess, node, ports)
}

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// assignmentOf builds the assignment of a, a node of the job's current
// round.
func (nt nodeTable) assignmentOf(js *jobState, a *rdzvv1.NodeAssignment) *rdzvv1.Assignment {
	as := &rdzvv1.Assignment{
		Spec: js.rec.GetSpec(), Generation: js.members.Round().GetGeneration(), NodeRank: a.GetNodeRank(),
		Nnodes: uint32(len(js.members.Round().GetNodes())), ProcsPerNode: js.rec.GetSpec().GetProcsPerNode(),
		MasterAddr: js.members.Round().GetMasterAddr(), MasterPort: js.members.Round().GetMasterPort(), GpuIndices: a.GetGpuIndices(),
		ResumeFrom: js.rec.GetLatestCheckpoint().GetPath(), ResumeStep: js.rec.GetLatestCheckpoint().GetStep(), JobCreatedAt: js.rec.GetCreatedAt(),
		Watch: nt.watchedPeers(js.members.Round(), a),
	}
	if m := js.rec.GetSpec().GetCheckpointMemory(); m != nil {
		as.ReplicaPeers = nt.replicaPeers(js.members.Round(), a, int(m.GetReplicas()))
	}
	if p := js.memPlan; p != nil {
		as.ResumeMemoryStep, as.ResumeMemoryGeneration, as.ResumeMemoryWorldSize = p.key.step, p.key.generation, p.saved
		as.MemorySources = p.sources(a.GetNode(), a.GetNodeRank(), js.rec.GetSpec().GetProcsPerNode(), func(node string) string {
			if ns := nt[node]; ns != nil {
				return ns.info.peerAddr
			}
			return ""
		})
	}
	return as
}

// watchedPeers are the nodes a watches in its round: its neighbours in a
// ring by node rank. Every node is watched by two peers (one in a round of
// two), so a dead node's peers know within a few probes, at a constant
// cost per node whatever the job's size. Peers without gossip are left
// out.
func (nt nodeTable) watchedPeers(round *rdzvv1.Round, a *rdzvv1.NodeAssignment) []*rdzvv1.WatchedPeer {
	nodes := round.GetNodes()
	n := len(nodes)
	var out []*rdzvv1.WatchedPeer
	for _, step := range []int{1, n - 1} {
		peer := nodes[(int(a.GetNodeRank())+step)%n].GetNode()
		if peer == a.GetNode() || (len(out) == 1 && out[0].GetNode() == peer) {
			continue
		}
		if ns := nt[peer]; ns != nil && ns.info.gossipAddr != "" {
			out = append(out, &rdzvv1.WatchedPeer{Node: peer, GossipAddr: ns.info.gossipAddr})
		}
	}
	return out
}
