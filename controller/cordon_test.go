package controller_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/controller"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func (f *fakeAgent) gpuFault(xid uint64) {
	f.t.Helper()
	f.send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_GpuFault{GpuFault: &rdzvv1.GPUFault{
		GpuIndex: 2, GpuUuid: "GPU-2", Kind: "xid", Code: xid, Message: "GPU 2 (GPU-2): XID 79", At: timestamppb.Now(),
	}}})
}

// A critical GPU fault cordons the node and restarts its job on the other
// nodes at once; the node stays out until an operator uncordons it.
func TestGPUFaultCordonsNodeAndRecovers(t *testing.T) {
	c := newCluster(t)
	a, b, s := c.connectFake("node-a"), c.connectFake("node-b"), c.connectFake("node-s")
	a.keepAlive()
	b.keepAlive()
	s.keepAlive()
	spec := c.recoverable("gpu", 2, 3)
	spec.NodesMax = 2
	c.startJob(spec)
	a1, b1 := a.run(), b.run()
	c.waitRunning("gpu")

	b.gpuFault(79)
	j := c.waitJobState("gpu", recovering)
	require.Contains(t, j.GetReason(), "node node-b: GPU fault: GPU 2 (GPU-2): XID 79")
	n := c.listNodes()["node-b"]
	require.True(t, n.GetCordoned())
	require.Contains(t, n.GetCordonReason(), "XID 79")
	a.expectStop(a1)
	b.expectStop(b1)

	// The spare node takes node-b's place.
	a2, s2 := a.run(), s.run()
	require.Equal(t, uint64(2), a2.GetGeneration())
	require.Equal(t, uint64(2), s2.GetGeneration())
	require.Contains(t, eventKinds(c.events("")), "node_cordoned")
	require.Contains(t, eventKinds(c.events("gpu")), "gpu_fault")

	// A reconnect does not lift the cordon; an operator does.
	b.crash()
	b = c.connectFake("node-b")
	b.keepAlive()
	require.True(t, c.listNodes()["node-b"].GetCordoned(), "the cordon outlives a reconnect")
	resp, err := c.nodes.UncordonNode(rpcCtx(t), &rdzvv1.UncordonNodeRequest{Name: "node-b"})
	require.NoError(t, err)
	require.False(t, resp.GetNode().GetCordoned())
	require.Empty(t, resp.GetNode().GetCordonReason())
}

// An operator's cordon keeps new jobs off a node; bad requests change
// nothing.
func TestOperatorCordon(t *testing.T) {
	c := newCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	resp, err := c.nodes.CordonNode(rpcCtx(t), &rdzvv1.CordonNodeRequest{Name: "node-a", Reason: "bad DIMM"})
	require.NoError(t, err)
	require.True(t, resp.GetNode().GetCordoned())
	require.Equal(t, "bad DIMM", resp.GetNode().GetCordonReason())

	c.startJob(c.spec("two", 2, 2, "ok"))
	j := c.waitJob("two", func(j *rdzvv1.Job) bool { return j.GetReason() != "waiting for rendezvous" })
	require.Equal(t, rdzvv1.JobState_JOB_STATE_PENDING, j.GetState(), "only one node may take work")

	_, err = c.nodes.CordonNode(rpcCtx(t), &rdzvv1.CordonNodeRequest{Name: "no-such-node"})
	require.Equal(t, codes.NotFound, status.Code(err))
	_, err = c.nodes.CordonNode(rpcCtx(t), &rdzvv1.CordonNodeRequest{Name: "Bad_Name"})
	require.Equal(t, codes.InvalidArgument, status.Code(err))

	_, err = c.nodes.UncordonNode(rpcCtx(t), &rdzvv1.UncordonNodeRequest{Name: "node-a"})
	require.NoError(t, err)
	require.Equal(t, uint64(1), a.run().GetGeneration(), "uncordoned, node-a takes the pending job")
}

// TestFlakyNodeIsCordoned: a node lost while running jobs flaky_nodes.losses
// times within the window is cordoned, and takes no new work once back.
func TestFlakyNodeIsCordoned(t *testing.T) {
	c := newCluster(t, func(cfg *controller.Config) { cfg.FlakyNodes.Losses = 2 })
	c.addAgent("node-a", 0, nil)
	lost := func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST }
	for i, job := range []string{"first", "second"} {
		b := c.connectFake("node-b")
		c.startJob(c.spec(job, 2, 2, "hang"))
		b.run()
		c.waitRunning(job)
		b.crash()
		c.waitJobState(job, failed)
		n := c.waitNode("node-b", lost)
		require.Equal(t, i > 0, n.GetCordoned(), "after loss %d", i+1)
		c.waitIdle("node-a")
	}
	n := c.listNodes()["node-b"]
	require.Contains(t, n.GetCordonReason(), "lost 2 times within 1h0m0s while running jobs")
	require.Contains(t, kindsOf(c.events("")), controller.EventNodeCordoned)

	// Back, it registers but gets no work: a job needing it waits.
	c.connectFake("node-b")
	submitted := c.startJob(c.spec("third", 2, 2, "hang"))
	// Scheduling is woken by the job, not by time: once a pass has looked
	// at it (and said why it waits), with node-b registered, nothing else
	// would place it.
	j := c.waitJob("third", func(j *rdzvv1.Job) bool { return j.GetReason() != submitted.GetReason() })
	require.Equal(t, rdzvv1.JobState_JOB_STATE_PENDING, j.GetState())
	require.Contains(t, j.GetReason(), "1 of 2 nodes eligible, need 2 (1 cordoned or draining)")
	require.True(t, c.listNodes()["node-b"].GetCordoned(), "the cordon outlives the reconnect")
}

func kindsOf(events []*rdzvv1.Event) []string {
	var kinds []string
	for _, ev := range events {
		kinds = append(kinds, ev.GetKind())
	}
	return kinds
}
