package controller_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const (
	phaseStartup = rdzvv1.TrainingPhase_TRAINING_PHASE_STARTUP
	phaseSteps   = rdzvv1.TrainingPhase_TRAINING_PHASE_STEPS
	phaseSaving  = rdzvv1.TrainingPhase_TRAINING_PHASE_SAVING
	phaseDone    = rdzvv1.TrainingPhase_TRAINING_PHASE_DONE
)

// progress sends a step report with a phase and metrics, as the agent
// forwards the workers' reports.
func (f *fakeAgent) progress(a *rdzvv1.Assignment, step uint64, phase rdzvv1.TrainingPhase, metrics map[string]float64) {
	f.t.Helper()
	f.progressAged(a, step, phase, metrics, 0)
}

// progressAged is progress for a step the workers reported age before.
func (f *fakeAgent) progressAged(a *rdzvv1.Assignment, step uint64, phase rdzvv1.TrainingPhase, metrics map[string]float64, age time.Duration) {
	f.t.Helper()
	f.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Progress{Progress: &rdzvv1.Progress{
		Job: a.GetSpec().GetName(), Generation: a.GetGeneration(), Step: step, At: timestamppb.Now(), Phase: phase, Metrics: metrics,
		Age: durationpb.New(age),
	}}})
}

// A hang is declared when progress_timeout has passed since the last step
// came, dated by the report's age (it rode on a heartbeat), and at once:
// not from the report's arrival, nor at the liveness loop's next tick.
func TestHangDeclaredWhenItsTimeoutRunsOut(t *testing.T) {
	c := newFakeClockCluster(t, func(cfg *controller.Config) {
		// Ticks a minute apart: only the wake at the deadline finds it.
		cfg.Heartbeat.Interval.Duration, cfg.Heartbeat.Timeout.Duration = 2*time.Minute, 5*time.Minute
	})
	a := c.connectFake("node-a")
	a.keepAlive()
	spec := c.recoverable("dated", 1, 2)
	spec.HealthProgressTimeout = durationpb.New(2 * time.Second)
	c.startJob(spec)
	a1 := a.run()
	a.progressAged(a1, 10, phaseSteps, nil, 1500*time.Millisecond)
	c.inPhase("dated", 10, phaseSteps)

	c.clock.Advance(400 * time.Millisecond)
	c.checkLiveness()
	require.Equal(t, running, c.getJob("dated").GetState(), "1.9 s since the step")
	c.clock.Advance(100 * time.Millisecond)
	j := c.waitJobState("dated", recovering)
	require.Contains(t, j.GetReason(), "hang: no training progress for 2s (last step 10, health.progress_timeout 2s)")
}

// inPhase waits for job's view to be in phase at step.
func (c *cluster) inPhase(job string, step uint64, phase rdzvv1.TrainingPhase) *rdzvv1.Job {
	c.t.Helper()
	return c.waitJob(job, func(j *rdzvv1.Job) bool { return j.GetStep() == step && j.GetPhase() == phase })
}

// A job past its last step that takes longer than progress_timeout to save
// and exit is not hung: it succeeds without a restart.
func TestFinalSaveIsNoHang(t *testing.T) {
	c := newFakeClockCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	spec := c.recoverable("final", 1, 1)
	spec.HealthProgressTimeout = durationpb.New(2 * time.Second)
	c.startJob(spec)
	a1 := a.run()
	a.progress(a1, 119, phaseSteps, nil)
	c.inPhase("final", 119, phaseSteps)
	a.progress(a1, 120, phaseDone, map[string]float64{"loss": 0.25})
	j := c.inPhase("final", 120, phaseDone)
	require.Nil(t, j.GetHangTimeout(), "done is never a hang")
	require.Equal(t, map[string]float64{"loss": 0.25}, j.GetMetrics())

	c.advance(10*spec.GetHealthProgressTimeout().AsDuration(), "node-a") // a long final save
	require.Equal(t, running, c.getJob("final").GetState())
	a.report(a1, rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED, 0)
	j = c.waitJobState("final", succeeded)
	require.Zero(t, j.GetRestarts())
	require.EqualValues(t, 1, j.GetGeneration())
}

// A checkpoint save is bounded by checkpoint_timeout, not progress_timeout,
// and the steps' clock starts again when it ends.
func TestCheckpointSaveHasItsOwnTimeout(t *testing.T) {
	c := newFakeClockCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	spec := c.recoverable("saver", 1, 1)
	spec.HealthProgressTimeout = durationpb.New(2 * time.Second)
	spec.HealthCheckpointTimeout = durationpb.New(6 * time.Second)
	c.startJob(spec)
	a1 := a.run()
	a.progress(a1, 10, phaseSteps, nil)
	require.Equal(t, 2*time.Second, c.inPhase("saver", 10, phaseSteps).GetHangTimeout().AsDuration())

	a.progress(a1, 20, phaseSaving, nil)
	require.Equal(t, 6*time.Second, c.inPhase("saver", 20, phaseSaving).GetHangTimeout().AsDuration())
	c.advance(4*time.Second, "node-a") // longer than progress_timeout
	require.Equal(t, running, c.getJob("saver").GetState())

	a.progress(a1, 20, phaseSteps, nil) // the save ended
	c.inPhase("saver", 20, phaseSteps)
	c.advance(1500*time.Millisecond, "node-a")
	require.Equal(t, running, c.getJob("saver").GetState(), "the save's time counted as a step's")

	a.progress(a1, 30, phaseSaving, nil)
	c.inPhase("saver", 30, phaseSaving)
	c.advance(7*time.Second, "node-a")
	j := c.waitJobState("saver", recovering)
	require.Contains(t, j.GetReason(), "hang: checkpoint save not complete after")
	require.Contains(t, j.GetReason(), "health.checkpoint_timeout 6s")
}

// A generation of a job that reported steps before is hung when it reports
// none within startup_timeout; the first generation, not known to report
// steps, is not bounded.
func TestStartupTimeout(t *testing.T) {
	c := newFakeClockCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	spec := c.recoverable("slowstart", 1, 2)
	spec.HealthProgressTimeout = durationpb.New(2 * time.Second)
	spec.HealthStartupTimeout = durationpb.New(4 * time.Second)
	c.startJob(spec)
	a1 := a.run()
	c.advance(6*time.Second, "node-a")
	j := c.getJob("slowstart")
	require.Equal(t, running, j.GetState(), "not known to report steps yet")
	require.Equal(t, rdzvv1.TrainingPhase_TRAINING_PHASE_UNSPECIFIED, j.GetPhase())

	a.progress(a1, 5, phaseSteps, nil)
	c.inPhase("slowstart", 5, phaseSteps)
	a.report(a1, rdzvv1.WorkerState_WORKER_STATE_FAILED, 1)
	// The first restart has no backoff: the job may be running generation 2
	// before RECOVERING is ever seen.
	c.advanceToCommit("slowstart", 2, "node-a")
	a2 := a.run()
	require.EqualValues(t, 2, a2.GetGeneration())
	j = c.inPhase("slowstart", 0, phaseStartup)
	require.Equal(t, 4*time.Second, j.GetHangTimeout().AsDuration())
	c.advance(3*time.Second, "node-a")
	require.Equal(t, running, c.getJob("slowstart").GetState())
	c.advance(2*time.Second, "node-a")
	j = c.waitJobState("slowstart", recovering)
	require.Contains(t, j.GetReason(), "hang: no training step")
	require.Contains(t, j.GetReason(), "health.startup_timeout 4s")
}

// Without progress_timeout the step timeout is derived; the latest metrics
// of the highest step show in the job.
func TestDerivedStepTimeoutAndMetrics(t *testing.T) {
	c := newFakeClockCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	spec := c.recoverable("derived", 1, 1)
	spec.HealthProgressTimeout = nil
	c.startJob(spec)
	a1 := a.run()
	a.progress(a1, 10, phaseSteps, map[string]float64{"loss": 2, "lr": 0.1})
	j := c.inPhase("derived", 10, phaseSteps)
	require.Equal(t, health.StepTimeoutFloor, j.GetHangTimeout().AsDuration())
	require.Equal(t, map[string]float64{"loss": 2, "lr": 0.1}, j.GetMetrics())

	a.progress(a1, 9, phaseSteps, map[string]float64{"loss": 9}) // a slower node's older step
	a.progress(a1, 11, phaseSteps, nil)
	j = c.inPhase("derived", 11, phaseSteps)
	require.Equal(t, map[string]float64{"loss": 2, "lr": 0.1}, j.GetMetrics(), "older metrics, and none, keep the latest")
	a.progress(a1, 12, phaseSteps, map[string]float64{"loss": 1.5})
	j = c.waitJob("derived", func(j *rdzvv1.Job) bool { return j.GetStep() == 12 })
	require.Equal(t, map[string]float64{"loss": 1.5}, j.GetMetrics())
}
