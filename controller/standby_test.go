package controller_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/controller"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// warmJob is a recoverable job of launcher.kind warm on nodes nodes with
// spares spares.
func (c *cluster) warmJob(name string, nodes, spares uint32) *rdzvv1.JobSpec {
	spec := c.recoverable(name, nodes, 3)
	spec.LauncherTorchrun, spec.LauncherKind, spec.LauncherPython = "", "warm", "/usr/bin/python3"
	spec.NodesSpares = spares
	return spec
}

// nextPastStandby is f's next message other than a standby request (a
// node of a recovering job is held for it, as a spare is, until its next
// round).
func (f *fakeAgent) nextPastStandby() *rdzvv1.ConnectResponse {
	f.t.Helper()
	for {
		if m := f.next(); m.GetPrepareStandby() == nil {
			return m
		}
	}
}

// nextAssignment is the next assignment for f, past any standby requests,
// answered RUNNING.
func (f *fakeAgent) nextAssignment() *rdzvv1.Assignment {
	f.t.Helper()
	m := f.nextPastStandby()
	a := m.GetAssignment()
	require.NotNil(f.t, a, "expected an assignment for %s, got %v", f.name, m)
	f.report(a, rdzvv1.WorkerState_WORKER_STATE_RUNNING, 0)
	return a
}

// A spare held for a warm job is told to keep a standby of that job's
// run; when it joins the job's next round its assignment comes with no
// drop before it; a spare released is told to keep none. A job of another
// kind has its spares told nothing.
func TestSpareStandbys(t *testing.T) {
	c := newCluster(t)
	fakes := map[string]*fakeAgent{}
	for _, n := range []string{"node-a", "node-b", "node-s"} {
		fakes[n] = c.connectFake(n)
		fakes[n].keepAlive()
	}
	job := c.startJob(c.warmJob("big", 2, 1))
	a1, b1 := fakes["node-a"].run(), fakes["node-b"].run()
	c.waitRunning("big")

	p := fakes["node-s"].next().GetPrepareStandby()
	require.NotNil(t, p, "the spare is told to keep a standby")
	require.Equal(t, "big", p.GetSpec().GetName())
	require.Equal(t, "warm", p.GetSpec().GetLauncherKind())
	require.True(t, job.GetCreatedAt().AsTime().Equal(p.GetJobCreatedAt().AsTime()), "the job's run")
	require.Positive(t, p.GetKeepFor().AsDuration())

	// node-b's GPU goes bad: the spare joins generation 2, told nothing
	// in between that would drop its standby.
	fakes["node-b"].health(1, &rdzvv1.HealthCheckResult{Name: "gpu", Critical: true, Message: "7 GPUs present, expected 8"})
	c.waitJobState("big", recovering)
	fakes["node-a"].expectStop(a1)
	fakes["node-b"].expectStop(b1)
	a2 := fakes["node-a"].nextAssignment()
	s2 := fakes["node-s"].run()
	require.Equal(t, uint64(2), a2.GetGeneration())
	require.Equal(t, uint64(2), s2.GetGeneration())
	c.waitRunning("big")

	// node-t becomes the spare; stopping the job releases it.
	fakes["node-t"] = c.connectFake("node-t")
	fakes["node-t"].keepAlive()
	p = fakes["node-t"].next().GetPrepareStandby()
	require.Equal(t, "big", p.GetSpec().GetName(), "the new spare is told to keep a standby")
	c.stopJob("big")
	fakes["node-a"].expectStop(a2)
	fakes["node-s"].expectStop(s2)
	c.waitJobState("big", rdzvv1.JobState_JOB_STATE_STOPPED)
	// Its last round's nodes drop the standbys kept for generation 3.
	fakes["node-a"].expectJobEnd(a2)
	fakes["node-s"].expectJobEnd(s2)
	drop := fakes["node-t"].next().GetPrepareStandby()
	require.NotNil(t, drop, "the released spare is told")
	require.Nil(t, drop.GetSpec(), "to keep no standby")

	// A torchrun job's spare is told nothing: its first message is its
	// assignment when the job needs it.
	plain := c.recoverable("plain", 2, 3)
	plain.NodesSpares = 1
	c.startJob(plain)
	j := c.waitJob("plain", func(j *rdzvv1.Job) bool {
		return len(j.GetSpares()) == 1 && j.GetState() == rdzvv1.JobState_JOB_STATE_RUNNING
	})
	for _, a := range j.GetAssignments() {
		fakes[a.GetNode()].run()
	}
	// The pass that picked the spare told it whatever it was told before
	// this heartbeat's answer, on the same stream.
	spare := j.GetSpares()[0]
	fakes[spare].heartbeat(99)
	select {
	case m := <-fakes[spare].msgs:
		require.Failf(t, "a torchrun job's spare was told something", "%v", m)
	default:
	}
}

// A held spare is told again before its standby's keep_for runs out, and
// an agent that reconnects is told again at once: it may have restarted
// without its standby.
func TestSpareStandbyRenewed(t *testing.T) {
	c := newFakeClockCluster(t)
	fakes := map[string]*fakeAgent{}
	for _, n := range []string{"node-a", "node-b", "node-s"} {
		fakes[n] = c.connectFake(n)
		fakes[n].keepAlive()
	}
	c.startJob(c.warmJob("big", 2, 1))
	fakes["node-a"].run()
	fakes["node-b"].run()
	// Spares are picked on the next scheduling pass.
	c.advance(time.Second, "node-a", "node-b", "node-s")
	first := fakes["node-s"].next().GetPrepareStandby()
	require.NotNil(t, first)
	require.Greater(t, first.GetKeepFor().AsDuration(), controller.SpareStandbyRenew, "told again before it runs out")

	c.advance(controller.SpareStandbyRenew-time.Second, "node-a", "node-b", "node-s")
	fakes["node-s"].heartbeat(77) // what was sent before its answer has arrived
	require.Empty(t, fakes["node-s"].msgs, "not told again before it is due")
	// The scheduling loop's timer is armed again after each pass: a second
	// at a time, until a pass runs after the renewal is due.
	var again *rdzvv1.PrepareStandby
	for waited := time.Duration(0); again == nil; waited += time.Second {
		require.Less(t, waited, controller.SpareStandbyRenew, "never told again")
		c.advance(time.Second, "node-a", "node-b", "node-s")
		select {
		case m := <-fakes["node-s"].msgs:
			again = m.GetPrepareStandby()
			require.NotNil(t, again, "got %v", m)
		default:
		}
	}
	require.True(t, proto.Equal(first, again), "the same standby, told again")

	// A new connection replaces the old one.
	fakes["node-s"] = c.connectFake("node-s")
	fakes["node-s"].keepAlive()
	require.True(t, proto.Equal(first, fakes["node-s"].next().GetPrepareStandby()), "the new session is told")
}

// A job's end comes with its stop orders (job_ended), so that agents drop
// the standbys they keep for a next generation: for a warm job, to every
// node of its last round, the one whose workers failed too; for a
// torchrun job, only to the nodes whose workers still run.
func TestJobEndTold(t *testing.T) {
	for _, tc := range []struct {
		name string
		warm bool
	}{
		{name: "warm", warm: true},
		{name: "torchrun", warm: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			a, b := c.connectFake("node-a"), c.connectFake("node-b")
			a.keepAlive()
			b.keepAlive()
			spec := c.recoverable("once", 2, 0)
			if tc.warm {
				spec = c.warmJob("once", 2, 0)
				spec.RestartMaxRestarts = 0
			}
			c.startJob(spec)
			a1, b1 := a.nextAssignment(), b.nextAssignment()
			c.waitRunning("once")

			a.report(a1, rdzvv1.WorkerState_WORKER_STATE_FAILED, 1)
			c.waitJobState("once", rdzvv1.JobState_JOB_STATE_FAILED)
			require.True(t, b.expectStop(b1).GetJobEnded(), "the running node's stop says the job ended")
			if !tc.warm {
				a.heartbeat(99)
				select {
				case m := <-a.msgs:
					require.Failf(t, "the node whose workers exited was told something", "%v", m)
				default:
				}
				return
			}
			a.expectJobEnd(a1)
		})
	}
}

// expectJobEnd waits for the stop order that says a's job ended, past any
// standby requests.
func (f *fakeAgent) expectJobEnd(a *rdzvv1.Assignment) {
	f.t.Helper()
	m := f.nextPastStandby()
	end := m.GetStopWorkers()
	require.NotNil(f.t, end, "expected %s to be told the job ended, got %v", f.name, m)
	require.True(f.t, end.GetJobEnded(), "%s: %v", f.name, end)
	require.Equal(f.t, a.GetGeneration(), end.GetGeneration())
}

// An idle node matching a running warm job is told to keep a standby of
// it, as a spare is, though the job reserves no spares; a job that needs
// the node takes it as any idle node (its assignment comes, past the
// standby requests), and the node is no longer told to keep one.
func TestIdleNodeStandbys(t *testing.T) {
	c := newCluster(t)
	fakes := map[string]*fakeAgent{}
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		fakes[n] = c.connectFake(n)
		fakes[n].keepAlive()
	}
	spec := c.warmJob("big", 2, 0)
	spec.NodesMax = 2
	job := c.startJob(spec)
	fakes["node-a"].run()
	fakes["node-b"].run()
	c.waitRunning("big")

	p := fakes["node-c"].next().GetPrepareStandby()
	require.NotNil(t, p, "the idle node is told to keep a standby")
	require.Equal(t, "big", p.GetSpec().GetName())
	require.True(t, job.GetCreatedAt().AsTime().Equal(p.GetJobCreatedAt().AsTime()), "the job's run")
	j := c.waitJob("big", func(*rdzvv1.Job) bool { return true })
	require.Empty(t, j.GetSpares(), "not held: any job may take it")

	plain := c.recoverable("plain", 1, 0)
	c.startJob(plain)
	a := fakes["node-c"].nextAssignment()
	require.Equal(t, "plain", a.GetSpec().GetName(), "another job takes the idle node")
	c.waitRunning("plain")
}
