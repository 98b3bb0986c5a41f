package controller_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func (c *cluster) drain(name string, now bool) *rdzvv1.Node {
	c.t.Helper()
	resp, err := c.nodes.DrainNode(rpcCtx(c.t), &rdzvv1.DrainNodeRequest{Name: name, Reason: "hardware swap", Now: now})
	require.NoError(c.t, err)
	return resp.GetNode()
}

func drained(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_DRAINED }

// A drained node keeps its job until the job ends, then is listed DRAINED
// (and found by that state) until uncordoned; new work stays off it.
func TestDrainLetsTheJobFinish(t *testing.T) {
	c := newCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	c.startJob(c.spec("train", 2, 2, "hang"))
	a1, b1 := a.run(), b.run()
	a.report(a1, rdzvv1.WorkerState_WORKER_STATE_RUNNING, 0)
	b.report(b1, rdzvv1.WorkerState_WORKER_STATE_RUNNING, 0)
	c.waitRunning("train")

	n := c.drain("node-b", false)
	require.True(t, n.GetCordoned())
	require.True(t, n.GetDraining())
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_BUSY, n.GetState(), "the job runs on")
	require.Equal(t, rdzvv1.JobState_JOB_STATE_RUNNING, c.getJob("train").GetState())
	require.Contains(t, kindsOf(c.events("")), controller.EventNodeDraining)

	a.report(a1, rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED, 0)
	b.report(b1, rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED, 0)
	c.waitJobState("train", succeeded)
	n = c.waitNode("node-b", drained)
	require.Equal(t, "hardware swap", n.GetCordonReason())
	resp, err := c.nodes.ListNodes(rpcCtx(t), &rdzvv1.ListNodesRequest{States: []rdzvv1.NodeState{rdzvv1.NodeState_NODE_STATE_DRAINED}})
	require.NoError(t, err)
	require.Len(t, resp.GetNodes(), 1)
	require.Equal(t, "node-b", resp.GetNodes()[0].GetInfo().GetName())

	// A new job does not go there, and says why.
	c.startJob(c.spec("next", 2, 2, "hang"))
	j := c.waitJob("next", func(j *rdzvv1.Job) bool { return j.GetReason() != "waiting for rendezvous" })
	require.Equal(t, rdzvv1.JobState_JOB_STATE_PENDING, j.GetState())
	require.Contains(t, j.GetReason(), "1 of 2 nodes eligible, need 2 (1 cordoned or draining)")
	require.NotContains(t, j.GetReason(), "busy", "an idle cordoned node is not busy")

	un, err := c.nodes.UncordonNode(rpcCtx(t), &rdzvv1.UncordonNodeRequest{Name: "node-b"})
	require.NoError(t, err)
	require.False(t, un.GetNode().GetDraining(), "uncordon ends the drain")
	require.Equal(t, uint64(1), b.run().GetGeneration(), "back in service, node-b takes the pending job")
}

// drain --now stops the node's workers at once and the job recovers on
// the other nodes.
func TestDrainNowMovesTheJob(t *testing.T) {
	c := newCluster(t)
	a, b, s := c.connectFake("node-a"), c.connectFake("node-b"), c.connectFake("node-s")
	a.keepAlive()
	b.keepAlive()
	s.keepAlive()
	c.startJob(c.recoverable("train", 2, 3))
	// Nodes are placed in name order: node-s is the spare.
	a1, b1 := a.run(), b.run()
	c.waitRunning("train")

	c.drain("node-b", true)
	j := c.waitJobState("train", recovering)
	require.Contains(t, j.GetReason(), "node node-b drained now by an operator")
	a.expectStop(a1)
	b.expectStop(b1)
	require.Equal(t, uint64(2), a.run().GetGeneration())
	require.Equal(t, uint64(2), s.run().GetGeneration(), "the spare takes the drained node's place")
	c.waitNode("node-b", drained)

	_, err := c.nodes.DrainNode(rpcCtx(t), &rdzvv1.DrainNodeRequest{Name: "no-such-node"})
	require.Equal(t, codes.NotFound, status.Code(err))
	_, err = c.nodes.DrainNode(rpcCtx(t), &rdzvv1.DrainNodeRequest{Name: "Bad_Name"})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
}

// A dry run validates like StartJob and previews the placement from the
// scheduler's own logic, storing nothing.
func TestStartDryRun(t *testing.T) {
	c := newCluster(t)
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		c.connectFake(n).keepAlive()
	}
	_, err := c.nodes.CordonNode(rpcCtx(t), &rdzvv1.CordonNodeRequest{Name: "node-c", Reason: "fan"})
	require.NoError(t, err)
	before := c.etcdRevision()

	resp, err := c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: c.spec("train", 1, 3), DryRun: true})
	require.NoError(t, err)
	var placed []string
	for _, a := range resp.GetPlacement().GetNodes() {
		placed = append(placed, a.GetNode())
	}
	require.ElementsMatch(t, []string{"node-a", "node-b"}, placed, "the cordoned node is not chosen")
	require.Equal(t, uint32(0), resp.GetPlacement().GetNodes()[0].GetNodeRank())
	require.Contains(t, resp.GetPlacement().GetReason(), "would run on 2 nodes now")

	resp, err = c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: c.spec("big", 3, 3), DryRun: true})
	require.NoError(t, err)
	require.Empty(t, resp.GetPlacement().GetNodes())
	require.Contains(t, resp.GetPlacement().GetReason(), "would wait for nodes: 2 of 3 nodes eligible, need 3 (1 cordoned or draining)")

	bad := c.spec("bad", 3, 1)
	_, err = c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: bad, DryRun: true})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), "nodes.max")

	c.settle()
	require.Equal(t, before, c.etcdRevision(), "a dry run stores nothing")
	require.Empty(t, c.listJobs())
	_, err = c.jobs.GetJob(rpcCtx(t), &rdzvv1.GetJobRequest{Name: "train"})
	require.Equal(t, codes.NotFound, status.Code(err))

	require.Empty(t, resp.GetWarnings(), "the nodes have no GPUs")

	// What StartJob would refuse, a dry run refuses.
	c.startJob(c.spec("dup", 1, 1, "hang"))
	_, err = c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: c.spec("dup", 1, 1), DryRun: true})
	require.Equal(t, codes.AlreadyExists, status.Code(err))
}

// A job that leaves out gpus_per_node while its nodes have GPUs is taken,
// with a warning: its workers would see none.
func TestStartWarnsGPUsLeftOut(t *testing.T) {
	c := newCluster(t)
	c.fakeGPUs = 4
	c.connectFake("node-a").keepAlive()
	for _, dry := range []bool{true, false} {
		resp, err := c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: c.spec(fmt.Sprintf("cpu-%v", dry), 1, 1, "hang"), DryRun: dry})
		require.NoError(t, err)
		require.Len(t, resp.GetWarnings(), 1)
		require.Contains(t, resp.GetWarnings()[0], "gpus_per_node is not set, but 1 of the 1 nodes the job may run on have GPUs (up to 4 each)")
	}
	spec := c.spec("gpu", 1, 1)
	spec.GpusPerNode = 4
	resp, err := c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: spec, DryRun: true})
	require.NoError(t, err)
	require.Empty(t, resp.GetWarnings())
}

// events of a job the controller does not know are NotFound, as GetJob.
func TestEventsOfUnknownJob(t *testing.T) {
	c := newCluster(t)
	_, err := c.jobs.ListEvents(rpcCtx(t), &rdzvv1.ListEventsRequest{Job: "nosuchjob"})
	require.Equal(t, codes.NotFound, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), "job nosuchjob not found")
}

// GetServerInfo is the leader's build and address.
func TestGetServerInfo(t *testing.T) {
	c := newCluster(t)
	conn := c.dial(c.issue(pki.Identity{Role: pki.RoleViewer, Name: "watcher"}))
	resp, err := rdzvv1.NewServerServiceClient(conn).GetServerInfo(rpcCtx(t), &rdzvv1.GetServerInfoRequest{})
	require.NoError(t, err)
	require.NotEmpty(t, resp.GetVersion())
	require.NotEmpty(t, resp.GetGoVersion())
	require.Equal(t, c.cfg.Advertised(), resp.GetLeaderAddr())
}
