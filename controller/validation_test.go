package controller_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// Hostile and malformed input over real gRPC: each call is refused with a
// status naming what is wrong, and neither etcd nor anything the API shows
// changes.
func TestAdversarialInputChangesNothing(t *testing.T) {
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)
	c.startJob(c.spec("train", 1, 1, "ok"))
	c.waitJobState("train", succeeded)

	rev := c.etcdRevision()
	jobsBefore, nodesBefore, jobBefore := c.listJobs(), c.listNodes(), c.getJob("train")

	spec := func(edit func(*rdzvv1.JobSpec)) *rdzvv1.StartJobRequest {
		s := c.spec("evil", 1, 1, "ok")
		edit(s)
		return &rdzvv1.StartJobRequest{Spec: s}
	}
	api := []struct {
		name string
		call func() error
		code codes.Code
		// want is what the error must name.
		want string
	}{
		{"spec over its size limit", start(c, spec(func(s *rdzvv1.JobSpec) {
			for range 200 {
				s.Command = append(s.Command, strings.Repeat("a", 4000))
			}
		})), codes.InvalidArgument, "job: is larger than"},
		{"message over the gRPC limit", start(c, spec(func(s *rdzvv1.JobSpec) {
			s.Command = append(s.Command, strings.Repeat("a", wire.MaxMessageBytes))
		})), codes.ResourceExhausted, ""},
		{"name with traversal", start(c, spec(func(s *rdzvv1.JobSpec) { s.Name = "../../etc/passwd" })), codes.InvalidArgument, "name:"},
		{"workdir with traversal", start(c, spec(func(s *rdzvv1.JobSpec) { s.Workdir = "/srv/../etc" })), codes.InvalidArgument, "workdir: must be a clean path"},
		{"checkpoint dir relative", start(c, spec(func(s *rdzvv1.JobSpec) { s.CheckpointDir = "ckpt" })), codes.InvalidArgument, "checkpoint.dir:"},
		{"env file relative", start(c, spec(func(s *rdzvv1.JobSpec) { s.EnvFiles = map[string]string{"TOKEN": "token"} })), codes.InvalidArgument, "env_files.TOKEN:"},
		{"secret overriding rdzv", start(c, spec(func(s *rdzvv1.JobSpec) { s.SecretEnv = map[string]string{"RDZV_NODE": "x"} })), codes.InvalidArgument, "secret_env.RDZV_NODE:"},
		{"env name with '='", start(c, spec(func(s *rdzvv1.JobSpec) { s.Env = map[string]string{"A=B": "x"} })), codes.InvalidArgument, "env:"},
		{"run_as shell", start(c, spec(func(s *rdzvv1.JobSpec) { s.RunAs = "root;id" })), codes.InvalidArgument, "run_as:"},
		{"nul in argument", start(c, spec(func(s *rdzvv1.JobSpec) { s.Command = []string{"x.py", "a\x00b"} })), codes.InvalidArgument, "command[1]:"},
		{"marker escaping", start(c, spec(func(s *rdzvv1.JobSpec) { s.CheckpointMarkers = []string{"../../x"} })), codes.InvalidArgument, "checkpoint.markers[0]:"},
		{"get traversal", func() error {
			_, err := c.jobs.GetJob(rpcCtx(t), &rdzvv1.GetJobRequest{Name: "../train"})
			return err
		}, codes.InvalidArgument, "name:"},
		{"stop uppercase", func() error {
			_, err := c.jobs.StopJob(rpcCtx(t), &rdzvv1.StopJobRequest{Name: "TRAIN"})
			return err
		}, codes.InvalidArgument, "name:"},
		{"logs tail too far back", func() error {
			s, err := c.jobs.StreamLogs(rpcCtx(t), &rdzvv1.StreamLogsRequest{Job: "train", TailBytes: 1 << 40})
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}, codes.InvalidArgument, "tail_bytes:"},
		{"cordon with a huge reason", func() error {
			_, err := c.nodes.CordonNode(rpcCtx(t), &rdzvv1.CordonNodeRequest{Name: "node-a", Reason: strings.Repeat("r", 2000)})
			return err
		}, codes.InvalidArgument, "reason:"},
		{"uncordon bad name", func() error {
			_, err := c.nodes.UncordonNode(rpcCtx(t), &rdzvv1.UncordonNodeRequest{Name: "node a"})
			return err
		}, codes.InvalidArgument, "name:"},
	}
	for _, tt := range api {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			require.Equal(t, tt.code, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tt.want)
		})
	}

	good := &rdzvv1.NodeInfo{Name: "node-x", Address: "127.0.0.1", NcclInterface: "lo"}
	register := func(edit func(*rdzvv1.NodeInfo)) *rdzvv1.ConnectRequest {
		n := proto.Clone(good).(*rdzvv1.NodeInfo)
		edit(n)
		return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: n}}}
	}
	agents := []struct {
		name string
		msgs []*rdzvv1.ConnectRequest
		want string
	}{
		{"register with a path for a name", []*rdzvv1.ConnectRequest{register(func(n *rdzvv1.NodeInfo) { n.Name = "../x" })}, "node.name:"},
		{"register with a hostname address", []*rdzvv1.ConnectRequest{register(func(n *rdzvv1.NodeInfo) { n.Address = "node-x" })}, "node.address:"},
		{"register with a huge version", []*rdzvv1.ConnectRequest{register(func(n *rdzvv1.NodeInfo) { n.AgentVersion = strings.Repeat("v", 1000) })}, "node.agent_version:"},
		{"register with a bad worker report", []*rdzvv1.ConnectRequest{{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{
			Node: good, Workers: []*rdzvv1.WorkerStatus{{Job: "train", Generation: 1, State: rdzvv1.WorkerState_WORKER_STATE_FAILED, Message: strings.Repeat("m", 5000)}},
		}}}}, "register.workers[0].message:"},
		{"no register first", []*rdzvv1.ConnectRequest{{Msg: &rdzvv1.ConnectRequest_Checkpoint{Checkpoint: &rdzvv1.CheckpointReport{
			Job: "train", Generation: 1, Step: 9, Path: "/ckpt/../etc", Source: "scan"}}}}, "checkpoint.path:"},
		{"oversized log chunk first", []*rdzvv1.ConnectRequest{{Msg: &rdzvv1.ConnectRequest_LogChunk{LogChunk: &rdzvv1.LogChunk{
			RequestId: "x", Data: make([]byte, wire.MaxLogChunkBytes+1)}}}}, "log_chunk.data:"},
	}
	for _, tt := range agents {
		t.Run(tt.name, func(t *testing.T) {
			err := streamUntilRefused(t, c, tt.msgs)
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tt.want)
		})
	}

	require.Equal(t, rev, c.etcdRevision(), "a refused request wrote to etcd")
	require.Equal(t, len(jobsBefore), len(c.listJobs()))
	require.True(t, proto.Equal(jobBefore, c.getJob("train")), "a refused request changed the job")
	require.Equal(t, len(nodesBefore), len(c.listNodes()), "a refused registration added a node")
	require.False(t, c.listNodes()["node-a"].GetCordoned())

	// A registered agent that then sends something bad loses its stream,
	// and the bad message is not applied.
	t.Run("bad message after register", func(t *testing.T) {
		err := streamUntilRefused(t, c, []*rdzvv1.ConnectRequest{register(func(*rdzvv1.NodeInfo) {}),
			{Msg: &rdzvv1.ConnectRequest_WorkerStatus{WorkerStatus: &rdzvv1.WorkerStatus{Job: "train", Generation: 1, State: 99}}}})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		require.Contains(t, status.Convert(err).Message(), "worker_status.state:")
		require.True(t, proto.Equal(jobBefore, c.getJob("train")))
	})
}

func start(c *cluster, req *rdzvv1.StartJobRequest) func() error {
	return func() error {
		_, err := c.jobs.StartJob(rpcCtx(c.t), req)
		return err
	}
}

// streamUntilRefused opens an agent stream, sends msgs and returns the
// status the controller ends it with.
func streamUntilRefused(t *testing.T, c *cluster, msgs []*rdzvv1.ConnectRequest) error {
	t.Helper()
	conn := c.dial(c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-x"}))
	stream, err := rdzvv1.NewAgentServiceClient(conn).Connect(rpcCtx(t))
	require.NoError(t, err)
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			break // the controller already ended the stream; Recv says why
		}
	}
	for {
		if _, err := stream.Recv(); err != nil {
			return err
		}
	}
}
