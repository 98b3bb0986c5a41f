package controller_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/agent"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// health reports one check's verdict, and waits until the controller has
// read it (a heartbeat sent after it is acknowledged).
func (f *fakeAgent) health(seq uint64, r *rdzvv1.HealthCheckResult) {
	f.t.Helper()
	r.Since = timestamppb.Now()
	f.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Health{Health: &rdzvv1.HealthReport{Results: []*rdzvv1.HealthCheckResult{r}}}})
	f.heartbeat(seq)
}

func failingChecks(n *rdzvv1.Node) []string {
	var out []string
	for _, r := range n.GetHealthChecks() {
		if !r.GetOk() {
			out = append(out, r.GetName())
		}
	}
	return out
}

// A node failing a health check takes no new work, the pending job says
// why, and the node takes work again by itself once the check passes.
func TestUnhealthyNodeWaitsUntilCheckPasses(t *testing.T) {
	c := newCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	b.health(1, &rdzvv1.HealthCheckResult{Name: "disk-check", Message: "exit status 1: /scratch read-only"})
	n := c.listNodes()["node-b"]
	require.Equal(t, []string{"disk-check"}, failingChecks(n))
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, n.GetState(), "unhealthy is not a node state: nothing to lift")
	require.False(t, n.GetCordoned())

	c.startJob(c.spec("two", 2, 2, "ok"))
	j := c.waitJob("two", func(j *rdzvv1.Job) bool { return strings.Contains(j.GetReason(), "failing health checks") })
	require.Equal(t, rdzvv1.JobState_JOB_STATE_PENDING, j.GetState())
	require.Contains(t, j.GetReason(), "1 of 2 nodes eligible")
	require.Contains(t, j.GetReason(), "node-b: disk-check: exit status 1: /scratch read-only")
	ev := c.waitEvent("", "node_unhealthy")
	require.Equal(t, "node-b", ev.GetNode())
	require.Contains(t, ev.GetMessage(), "disk-check failing: exit status 1")

	b.health(2, &rdzvv1.HealthCheckResult{Name: "disk-check", Ok: true})
	a1, b1 := a.run(), b.run()
	require.Equal(t, uint64(1), a1.GetGeneration())
	require.Equal(t, uint64(1), b1.GetGeneration())
	require.Contains(t, c.waitEvent("", "node_healthy").GetMessage(), "node node-b: health check disk-check passing again")
	require.Empty(t, failingChecks(c.listNodes()["node-b"]))
}

// A failing critical check ends the node's running job at once, like a
// critical GPU fault but without a cordon; a failing soft check leaves the
// job running and only keeps the node out of the next round.
func TestCriticalHealthCheckEndsRunningJob(t *testing.T) {
	c := newCluster(t)
	a, b, s := c.connectFake("node-a"), c.connectFake("node-b"), c.connectFake("node-s")
	a.keepAlive()
	b.keepAlive()
	s.keepAlive()
	spec := c.recoverable("hc", 2, 3)
	c.startJob(spec)
	a1, b1 := a.run(), b.run()
	c.waitRunning("hc")

	a.health(1, &rdzvv1.HealthCheckResult{Name: "storage", Message: "/ckpt: 1.0 MiB free"})
	j := c.getJob("hc")
	require.Equal(t, rdzvv1.JobState_JOB_STATE_RUNNING, j.GetState(), "a soft check leaves the job running")
	require.Equal(t, uint64(1), j.GetGeneration())

	b.health(2, &rdzvv1.HealthCheckResult{Name: "gpu", Critical: true, Message: "7 GPUs present, expected 8"})
	j = c.waitJobState("hc", recovering)
	require.Contains(t, j.GetReason(), "node node-b: health check gpu: 7 GPUs present, expected 8")
	require.False(t, c.listNodes()["node-b"].GetCordoned(), "a health check never cordons")
	a.expectStop(a1)
	b.expectStop(b1)

	// Neither unhealthy node is eligible: the job waits, naming both.
	j = c.waitJob("hc", func(j *rdzvv1.Job) bool { return strings.Contains(j.GetReason(), "2 failing health checks") })
	require.Contains(t, j.GetReason(), "node-a: storage: /ckpt: 1.0 MiB free; node-b: gpu: 7 GPUs present, expected 8")
	a.health(3, &rdzvv1.HealthCheckResult{Name: "storage", Ok: true})
	a2, s2 := a.run(), s.run()
	require.Equal(t, uint64(2), a2.GetGeneration())
	require.Equal(t, uint64(2), s2.GetGeneration())
}

// A real agent's operator check keeps its node out until it passes; the
// agent reruns it every interval.
func TestAgentOperatorCheckGatesWork(t *testing.T) {
	c := newCluster(t)
	flag := filepath.Join(t.TempDir(), "drain")
	require.NoError(t, os.WriteFile(flag, nil, 0o644))
	c.addAgent("node-a", 0, nil, func(cfg *agent.Config) {
		cfg.HealthChecks.Interval = wire.Duration{Duration: 100 * time.Millisecond}
		cfg.HealthChecks.Commands = []agent.CommandCheck{{Name: "drain", Path: "/bin/sh",
			Args: []string{"-c", "test ! -e " + flag + " || { echo drained by the operator >&2; exit 1; }"}}}
	})
	n := c.waitNode("node-a", func(n *rdzvv1.Node) bool { return len(failingChecks(n)) > 0 })
	require.Equal(t, []string{"drain"}, failingChecks(n))

	c.startJob(c.spec("gated", 1, 1, "ok"))
	j := c.waitJob("gated", func(j *rdzvv1.Job) bool { return strings.Contains(j.GetReason(), "failing health checks") })
	require.Contains(t, j.GetReason(), "node-a: drain: exit status 1: drained by the operator")
	require.Equal(t, rdzvv1.JobState_JOB_STATE_PENDING, c.getJob("gated").GetState())

	require.NoError(t, os.Remove(flag))
	c.waitJobState("gated", rdzvv1.JobState_JOB_STATE_SUCCEEDED)
	kinds := eventKinds(c.events(""))
	require.Contains(t, kinds, "node_unhealthy")
	require.Contains(t, kinds, "node_healthy")
}
