package controller_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// A node the round smoke test leaves out ends the generation without
// counting a restart, and the round is planned again without it: its
// spare takes its place.
func TestPreflightExcludedNodeIsReplaced(t *testing.T) {
	c := newCluster(t)
	a, b, s := c.connectFake("node-a"), c.connectFake("node-b"), c.connectFake("node-s")
	a.keepAlive()
	b.keepAlive()
	s.keepAlive()
	spec := c.recoverable("pf", 2, 1)
	spec.NodesSpares = 1
	spec.HealthPreflight = &rdzvv1.PreflightSpec{MinBandwidthMbps: 1000, Bytes: 1 << 20, Timeout: durationpb.New(time.Minute)}
	c.startJob(spec)
	a1 := a.run()
	b.run()
	require.NotNil(t, a1.GetSpec().GetHealthPreflight(), "agents learn the test's settings")

	const verdict = "rdzv preflight: rank 1 of 2: excluded: links below 1000 Mbit/s; to rank 0 9 Mbit/s"
	b.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_WorkerStatus{WorkerStatus: &rdzvv1.WorkerStatus{
		Job: "pf", Generation: 1, State: rdzvv1.WorkerState_WORKER_STATE_FAILED, ExitCode: 87, Message: verdict, PreflightExcluded: true,
	}}})
	a.expectStop(a1)
	a2, s2 := a.run(), s.run()
	require.Equal(t, uint64(2), a2.GetGeneration())
	require.Equal(t, uint64(2), s2.GetGeneration())
	j := c.waitRunning("pf")
	require.Zero(t, j.GetRestarts(), "a re-plan is no restart")
	ev := c.waitEvent("pf", "preflight_excluded")
	require.Equal(t, "node-b", ev.GetNode())
	require.Contains(t, ev.GetMessage(), verdict)

	// node-b stays out of this job: when node-s fails its GPU check, the
	// job waits rather than take node-b back.
	s.health(1, &rdzvv1.HealthCheckResult{Name: "gpu", Critical: true, Message: "7 GPUs present, expected 8"})
	a.expectStop(a2)
	s.expectStop(s2)
	j = c.waitJob("pf", func(j *rdzvv1.Job) bool { return strings.Contains(j.GetReason(), "left out by the preflight test") })
	require.Equal(t, uint32(1), j.GetRestarts(), "a real failure counts")
	require.Contains(t, j.GetReason(), "1 of 2 nodes eligible, need 2")
	require.Contains(t, j.GetReason(), "; 1 node(s) left out by the preflight test")
}

// Only the smoke test's own verdict leaves a node out: the same exit code
// without it is an ordinary failure.
func TestPreflightFlagNeedsPreflight(t *testing.T) {
	c := newCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	c.startJob(c.recoverable("plain", 2, 0))
	a.run()
	b1 := b.run()
	b.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_WorkerStatus{WorkerStatus: &rdzvv1.WorkerStatus{
		Job: "plain", Generation: b1.GetGeneration(), State: rdzvv1.WorkerState_WORKER_STATE_FAILED, ExitCode: 87, PreflightExcluded: true,
	}}})
	j := c.waitJobState("plain", rdzvv1.JobState_JOB_STATE_FAILED)
	require.True(t, strings.Contains(j.GetReason(), "no restarts left"), j.GetReason())
}
