package controller

// Job lifecycle: start, stop, and moving a job on from its workers' states.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/controller/lifecycle"
	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

var (
	errNotFound      = errors.New("not found")
	errAlreadyExists = errors.New("already exists")
	errUnavailable   = errors.New("unavailable")
	errNotFinished   = errors.New("not finished")
	errTooManyJobs   = errors.New("too many active jobs")
)

// startJob stores a new job, whose spec the API's guard (validate.go)
// validated on the way in. A finished job of the same name is replaced; its
// generation count carries on so that no late report from the old job can
// be mistaken for the new one.
// It returns the job as stored, and what rdzvctl shows of the spec as
// likely not meant (submitWarnings).
func (c *Controller) startJob(ctx context.Context, specProto *rdzvv1.JobSpec) (*rdzvv1.Job, []string, error) {
	spec := jobspec.FromProto(specProto)
	c.mu.Lock()
	name := spec.Name
	if err := c.jobs.admit(name, c.cfg.Limits.MaxActiveJobs); err != nil {
		c.mu.Unlock()
		return nil, nil, err
	}
	replace, generation := false, c.generationFloor
	if old := c.jobs[name]; old != nil {
		replace, generation = true, old.rec.GetGeneration()
	}
	now := c.clock.Now()
	t := lifecycle.Submit(spec.ToProto(), generation, now)
	rec := t.Job
	js := &jobState{rec: rec, pendingSince: now}
	c.jobs[name] = js
	view := js.apiView(now)
	warnings := submitWarnings(specProto, c.nodes.candidates())
	reply := c.writes.persistWait(c.store.CreateJob(rec, replace, t.Event))
	c.mu.Unlock()
	if err := await(ctx, reply); err != nil {
		return nil, nil, fmt.Errorf("storing job %s: %w", name, err)
	}
	c.log.Info("job submitted", zap.String("job", name))
	c.wake()
	return view, warnings, nil
}

// admit says why a job named name cannot be started now: one of that
// name has not finished, or maxActive jobs are active already
// (limits.max_active_jobs).
func (jt jobTable) admit(name string, maxActive int) error {
	if old := jt[name]; old != nil && !lifecycle.Terminal(old.rec.GetState()) {
		return fmt.Errorf("job %s is %s; stop it before starting it again: %w", name, lifecycle.StateName(old.rec.GetState()), errAlreadyExists)
	}
	if active := jt.activeJobs(); active >= maxActive {
		return fmt.Errorf("job %s refused: %d jobs are pending or running, the most limits.max_active_jobs (%d) allows; "+
			"wait for one to finish or stop one: %w", name, active, maxActive, errTooManyJobs)
	}
	return nil
}

// activeJobs counts the jobs that have not finished.
func (jt jobTable) activeJobs() int {
	n := 0
	for _, js := range jt {
		if !lifecycle.Terminal(js.rec.GetState()) {
			n++
		}
	}
	return n
}

// deleteJob removes a finished job and everything stored for it, answered
// once that is durable.
func (c *Controller) deleteJob(ctx context.Context, name string) error {
	c.mu.Lock()
	js := c.jobs[name]
	if js == nil {
		c.mu.Unlock()
		return fmt.Errorf("job %s: %w", name, errNotFound)
	}
	if state := js.rec.GetState(); !lifecycle.Terminal(state) {
		c.mu.Unlock()
		return fmt.Errorf("job %s is %s; stop it first (rdzvctl stop %s), then delete it: %w", name, lifecycle.StateName(state), name, errNotFinished)
	}
	if node := c.nodes.heldJobs()[name]; node != "" {
		c.mu.Unlock()
		return fmt.Errorf("job %s is %s, but its workers on node %s have not confirmed they exited yet; retry in a moment: %w",
			name, lifecycle.StateName(js.rec.GetState()), node, errNotFinished)
	}
	by := "operator"
	if id, ok := identityFrom(ctx); ok {
		by = id.String()
	}
	reply := c.writes.persistWait(c.dropJob(js, newEvent(c.clock.Now(), "", "", 0, EventJobDeleted, "job %s (%s, generation %d) deleted by %s",
		name, lifecycle.StateName(js.rec.GetState()), js.rec.GetGeneration(), by)))
	c.mu.Unlock()
	if err := await(ctx, reply); err != nil {
		return fmt.Errorf("deleting job %s: %w", name, err)
	}
	c.log.Info("job deleted", zap.String("job", name), zap.String("by", by))
	return nil
}

// heldJobs maps each job that some node's workers have not confirmed
// leaving to one such node.
func (nt nodeTable) heldJobs() map[string]string {
	held := map[string]string{}
	for name, ns := range nt {
		if ns.job != "" {
			held[ns.job] = name
		}
	}
	return held
}

// dropJob forgets a finished job that no node holds (its workers' reports
// would otherwise keep their node busy) and returns the change deleting
// what is stored of it. The generation floor rises past it, so a job
// started later under the same name counts on from there and agents that
// ran this one take its assignments. Callers hold c.mu.
func (c *Controller) dropJob(js *jobState, events ...*rdzvv1.Event) *store.Change {
	name := js.rec.GetSpec().GetName()
	c.generationFloor = max(c.generationFloor, js.rec.GetGeneration())
	delete(c.jobs, name)
	return c.store.DeleteJob(name, c.generationFloor, events...)
}

func (c *Controller) stopJob(ctx context.Context, name string) (*rdzvv1.Job, error) {
	c.mu.Lock()
	js := c.jobs[name]
	if js == nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("job %s: %w", name, errNotFound)
	}
	if t, ok := lifecycle.Stop(js.rec, c.clock.Now()); ok {
		c.apply(js, t)
		c.advanceJob(js, js.members.Round().GetNodes())
	}
	view := js.apiView(c.clock.Now())
	// Answered once the stop (and whatever it led to) is durable.
	reply := c.writes.barrier()
	c.mu.Unlock()
	if err := await(ctx, reply); err != nil {
		return nil, fmt.Errorf("stopping job %s: %w", name, err)
	}
	return view, nil
}

// advanceJob moves a running or stopping job on from its workers' states,
// where only the workers of exited (the whole round, when not known) may
// have failed since the job was last advanced: a worker report looks at
// its own node and the round's count of successes, not at the whole round,
// which was O(N²) under c.mu for a job's N exits.
func (c *Controller) advanceJob(js *jobState, exited []*rdzvv1.NodeAssignment) {
	now := c.clock.Now()
	switch js.rec.GetState() {
	case rdzvv1.JobState_JOB_STATE_RUNNING:
		exits := make([]lifecycle.Exit, 0, len(exited))
		for _, a := range exited {
			w := js.members.Worker(a.GetNode())
			exits = append(exits, lifecycle.Exit{Node: a.GetNode(), Rank: a.GetNodeRank(), Worker: w,
				Retry: w.GetFailure() == wire.FailureMemoryFetch && js.memPlan != nil})
		}
		nodes := len(js.members.Round().GetNodes())
		switch verdict, e := lifecycle.Judge(exits, js.members.Succeeded(), nodes); verdict {
		case lifecycle.Broken:
			c.apply(js, lifecycle.BrokenOn(js.rec, e, now))
		case lifecycle.Failed:
			if e.Retry {
				// Another attempt must not pick the same in-memory step:
				// it resumes from an older complete one, or durably.
				if js.memSkip == nil {
					js.memSkip = map[memKey]bool{}
				}
				js.memSkip[js.memPlan.key] = true
			}
			c.attemptFailed(js, c.nodes.failureCause(e.Node), e.Reason(), detectionLatency(e.Worker, now))
		case lifecycle.Succeeded:
			c.apply(js, lifecycle.Finish(js.rec, rdzvv1.JobState_JOB_STATE_SUCCEEDED, fmt.Sprintf("all %d nodes finished", nodes), now))
		}
	case rdzvv1.JobState_JOB_STATE_RECOVERING:
		if c.nodes.fenced(js, c.clock.Now()) {
			lifecycle.NoteFenced(js.rec, now)
			c.wake()
		}
	case rdzvv1.JobState_JOB_STATE_STOPPING:
		if js.members.AllExited() {
			c.apply(js, lifecycle.Stopped(js.rec, now))
		}
	}
}

// apply makes t the job's state: the one place where a transition's
// record replaces js.rec. The record is written with t's event, and once
// that is durable t's order goes to the workers of the generation t
// left, unless the job has moved to another generation meanwhile (a
// commit decided before the write was durable: none of the generation's
// workers can still run then, and the next one's are not this order's
// to stop). more are written with t's event. Callers hold c.mu.
func (c *Controller) apply(js *jobState, t lifecycle.Transition, more ...*rdzvv1.Event) {
	if t.Job == nil {
		c.writes.persist(c.store.AppendEvent(t.Event), nil)
		return
	}
	name, gen, state := t.Job.GetSpec().GetName(), t.Job.GetGeneration(), t.Job.GetState()
	js.rec = t.Job
	events := append([]*rdzvv1.Event{t.Event}, more...)
	ch := c.store.UpdateJob(t.Job, events...)
	if t.Round != nil {
		ch = c.store.CommitRound(t.Job, t.Round, events...)
	}
	if lifecycle.Terminal(state) {
		c.metrics.finished(state)
	}
	c.writes.persist(ch, func() {
		if lifecycle.Terminal(state) {
			c.log.Info("job finished", zap.String("job", name), zap.String("state", lifecycle.StateName(state)), zap.String("reason", t.Why))
		}
		if js.rec.GetGeneration() != gen {
			return
		}
		switch t.Order {
		case lifecycle.OrderStop:
			c.nodes.stopWorkers(js, t.Why, 0)
		case lifecycle.OrderStopFailed:
			c.nodes.stopWorkers(js, t.Why, lifecycle.FailedStopGrace)
		case lifecycle.OrderEnd:
			c.nodes.endWorkers(js, t.Why)
		case lifecycle.OrderAssign:
			c.log.Info("rendezvous committed", zap.String("job", name), zap.Uint64("generation", gen), zap.Int("nodes", len(t.Round.GetNodes())),
				zap.String("master_addr", t.Round.GetMasterAddr()), zap.Uint32("master_port", t.Round.GetMasterPort()))
			c.nodes.sendAssignments(c.jobs, js, t.Round)
		}
	})
	if t.Order == lifecycle.OrderStopFailed || t.Order == lifecycle.OrderEnd {
		// The job may rendezvous again (after its backoff) or has let
		// its nodes go: the scheduler has work.
		c.wake()
	}
}

// stopWorkers tells every node of the current round whose workers may still
// run to stop them, within grace if positive (else the agent's stop_grace).
func (nt nodeTable) stopWorkers(js *jobState, reason string, grace time.Duration) {
	for _, a := range js.members.Round().GetNodes() {
		if !lifecycle.TerminalWorker(js.members.Worker(a.GetNode()).GetState()) {
			nt.sendStop(a.GetNode(), &rdzvv1.StopWorkers{Job: js.rec.GetSpec().GetName(), Generation: js.rec.GetGeneration(), Reason: reason}, grace)
		}
	}
}

// endWorkers is stopWorkers for a job that finished, saying so: an agent
// then drops what it keeps for the job's next generation, at once. A warm
// job's nodes are told even where its workers have exited: a standby
// outlives the generation it was started beside, waiting for the next
// one, and without word of the end it held the job's preloaded Python for
// a minute (standbyLinger in agent/warm.go) after every job that failed or
// was stopped. So are the nodes that hold the job's in-memory checkpoints,
// in its round or not (an earlier generation's, a replica): their shared
// memory is freed only on that word, or when their agent next starts.
func (nt nodeTable) endWorkers(js *jobState, reason string) {
	name := js.rec.GetSpec().GetName()
	warm, memory := js.rec.GetSpec().GetLauncherKind() == jobspec.KindWarm, js.rec.GetSpec().GetCheckpointMemory() != nil
	end := func(node string) {
		nt.sendStop(node, &rdzvv1.StopWorkers{Job: name, Generation: js.rec.GetGeneration(), Reason: reason, JobEnded: true}, 0)
	}
	for _, a := range js.members.Round().GetNodes() {
		if warm || memory || !lifecycle.TerminalWorker(js.members.Worker(a.GetNode()).GetState()) {
			end(a.GetNode())
		}
	}
	for node := range js.memHeld {
		if !js.members.Member(node) {
			end(node)
		}
	}
}
