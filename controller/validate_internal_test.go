package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

func goodNodeInfo() *rdzvv1.NodeInfo {
	return &rdzvv1.NodeInfo{
		Name: "gpu-01", Labels: map[string]string{"pool": "train"}, Address: "10.0.0.5", GossipAddr: "10.0.0.5:7946",
		NcclInterface: "eth0", AgentVersion: "0.1.0", NcclInterfaceReason: "routes to the controller",
		Gpus:       []*rdzvv1.GPU{{Index: 0, Uuid: "GPU-1", Name: "H100", PciBusId: "0000:01:00.0"}},
		Interfaces: []*rdzvv1.NetworkInterface{{Name: "eth0", Addresses: []string{"10.0.0.5/24"}, RdmaDevices: []string{"mlx5_0"}}},
	}
}

func revokeSerial(s string) *rdzvv1.RevokeCertificateRequest {
	return &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Serial{Serial: s}}
}

func revokeIdentity(id string) *rdzvv1.RevokeCertificateRequest {
	return &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Identity{Identity: id}}
}

func connect(m any) *rdzvv1.ConnectRequest {
	switch m := m.(type) {
	case *rdzvv1.Register:
		return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: m}}
	case *rdzvv1.WorkerStatus:
		return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_WorkerStatus{WorkerStatus: m}}
	case *rdzvv1.Progress:
		return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Progress{Progress: m}}
	case *rdzvv1.CheckpointReport:
		return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Checkpoint{Checkpoint: m}}
	case *rdzvv1.PortProbeResult:
		return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_PortProbeResult{PortProbeResult: m}}
	case *rdzvv1.LogChunk:
		return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_LogChunk{LogChunk: m}}
	case *rdzvv1.GossipView:
		return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_GossipView{GossipView: m}}
	case *rdzvv1.GPUFault:
		return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_GpuFault{GpuFault: m}}
	case *rdzvv1.HealthReport:
		return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Health{Health: m}}
	}
	panic("not a stream message")
}

func withNode(edit func(*rdzvv1.NodeInfo)) *rdzvv1.ConnectRequest {
	n := goodNodeInfo()
	edit(n)
	return connect(&rdzvv1.Register{Node: n})
}

func goodSpec() *rdzvv1.JobSpec {
	s := &jobspec.Spec{Name: "train", Nodes: jobspec.NodeRange{Min: 1}, Command: []string{"train.py"}}
	s.Default()
	return s.ToProto()
}

// validationCases are requests and stream messages with the field each
// error must name ("" for a valid one). The fuzz targets seed from them.
var validationCases = []struct {
	name      string
	req       any
	wantField string
}{
	{"start job", &rdzvv1.StartJobRequest{Spec: goodSpec()}, ""},
	{"start job without spec", &rdzvv1.StartJobRequest{}, "spec: required"},
	{"start job with bad spec", &rdzvv1.StartJobRequest{Spec: &rdzvv1.JobSpec{Name: "x"}}, "nodes.min"},
	{"get job", &rdzvv1.GetJobRequest{Name: "train"}, ""},
	{"get job traversal", &rdzvv1.GetJobRequest{Name: "../etc"}, "name: must be a DNS-1123 label"},
	{"stop job empty", &rdzvv1.StopJobRequest{}, "name:"},
	{"delete job", &rdzvv1.DeleteJobRequest{Name: "train"}, ""},
	{"delete job bad name", &rdzvv1.DeleteJobRequest{Name: "train/x"}, "name: must be a DNS-1123 label"},
	{"list jobs", &rdzvv1.ListJobsRequest{}, ""},
	{"list jobs filtered, a page", &rdzvv1.ListJobsRequest{PageSize: 5000, PageToken: pageToken{List: jobsToken, After: "x"}.encode(),
		States: []rdzvv1.JobState{rdzvv1.JobState_JOB_STATE_RUNNING}, View: rdzvv1.JobView_JOB_VIEW_FULL}, ""},
	{"list jobs negative page size", &rdzvv1.ListJobsRequest{PageSize: -1}, "page_size: must be 0 (the default) or more, got -1"},
	{"list jobs bad token", &rdzvv1.ListJobsRequest{PageToken: "bm9wZQ"}, "page_token: \"bm9wZQ\" is not the next_page_token"},
	{"list jobs with a nodes token", &rdzvv1.ListJobsRequest{PageToken: pageToken{List: nodesToken, After: "x"}.encode()}, "page_token:"},
	{"list jobs huge token", &rdzvv1.ListJobsRequest{PageToken: strings.Repeat("x", maxPageTokenBytes+1)}, "page_token: at most 1024 bytes"},
	{"list jobs unspecified state", &rdzvv1.ListJobsRequest{States: []rdzvv1.JobState{0}}, "states: 0 is not a state"},
	{"list jobs unknown state", &rdzvv1.ListJobsRequest{States: []rdzvv1.JobState{42}}, "states: 42 is not a state; want one of [JOB_STATE_PENDING"},
	{"list jobs unknown view", &rdzvv1.ListJobsRequest{View: 7}, "view: 7 is not a view"},
	{"list nodes", &rdzvv1.ListNodesRequest{}, ""},
	{"list nodes filtered", &rdzvv1.ListNodesRequest{States: []rdzvv1.NodeState{rdzvv1.NodeState_NODE_STATE_LOST}, Selector: map[string]string{"pool": "train"}}, ""},
	{"list nodes bad selector", &rdzvv1.ListNodesRequest{Selector: map[string]string{"pool": "a b"}}, "selector.pool:"},
	{"list nodes unknown state", &rdzvv1.ListNodesRequest{States: []rdzvv1.NodeState{9}}, "states: 9 is not a state"},
	{"list nodes negative page size", &rdzvv1.ListNodesRequest{PageSize: -5}, "page_size:"},
	{"cluster events", &rdzvv1.ListEventsRequest{}, ""},
	{"events next page", &rdzvv1.ListEventsRequest{Job: "train", PageToken: pageToken{List: eventsToken + "train", After: "x", Left: 5}.encode()}, ""},
	{"events token of another job", &rdzvv1.ListEventsRequest{Job: "other", PageToken: pageToken{List: eventsToken + "train", After: "x", Left: 5}.encode()}, "page_token:"},
	{"events token beyond the limit", &rdzvv1.ListEventsRequest{PageToken: pageToken{List: eventsToken + "_cluster", After: "x", Left: maxEventLimit + 1}.encode()}, "page_token:"},
	{"events negative page size", &rdzvv1.ListEventsRequest{PageSize: -1}, "page_size:"},
	{"events bad job", &rdzvv1.ListEventsRequest{Job: "A"}, "job:"},
	{"events over limit", &rdzvv1.ListEventsRequest{Limit: maxEventLimit + 1}, "limit: at most 10000"},
	{"logs", &rdzvv1.StreamLogsRequest{Job: "train", Node: "gpu-01", TailBytes: 1 << 20, Follow: true}, ""},
	{"logs bad node", &rdzvv1.StreamLogsRequest{Job: "train", Node: "gpu/01"}, "node:"},
	{"logs huge tail", &rdzvv1.StreamLogsRequest{Job: "train", TailBytes: wire.MaxLogTailBytes + 1}, "tail_bytes: at most"},
	{"cordon", &rdzvv1.CordonNodeRequest{Name: "gpu-01", Reason: "disk"}, ""},
	{"cordon long reason", &rdzvv1.CordonNodeRequest{Name: "gpu-01", Reason: strings.Repeat("x", maxReasonBytes+1)}, "reason: at most 1024 bytes"},
	{"uncordon bad name", &rdzvv1.UncordonNodeRequest{Name: "gpu_01"}, "name:"},
	{"revoke serial", revokeSerial("1f2e3d"), ""},
	{"revoke serial openssl style", revokeSerial("0x1F:2E:3D"), ""},
	{"revoke serial not hex", revokeSerial("xyz"), "serial: want a certificate serial number in hex"},
	{"revoke serial zero", revokeSerial("00"), "serial: a certificate serial number is positive"},
	{"revoke serial too long", revokeSerial(strings.Repeat("f", 41)), "serial: a certificate serial number is positive and at most 20 bytes"},
	{"revoke serial huge", revokeSerial(strings.Repeat("f", 1000)), "serial: at most 20 bytes"},
	{"revoke identity", revokeIdentity("agent/gpu-01"), ""},
	{"revoke identity without role", revokeIdentity("gpu-01"), "identity: want ROLE/NAME"},
	{"revoke identity bad role", revokeIdentity("admin/bob"), "role: want controller, agent, operator, viewer or relay"},
	{"revoke identity traversal", revokeIdentity("agent/../x"), "name: must be a DNS-1123 label"},
	{"revoke identity with not_after", &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Identity{Identity: "agent/gpu-01"},
		NotAfter: timestamppb.Now()}, "not_after: only with a serial"},
	{"revoke serial bad not_after", &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Serial{Serial: "1f"},
		NotAfter: &timestamppb.Timestamp{Nanos: -1}}, "not_after:"},
	{"revoke nothing", &rdzvv1.RevokeCertificateRequest{}, "serial, identity: give one"},
	{"revoke long reason", &rdzvv1.RevokeCertificateRequest{Target: &rdzvv1.RevokeCertificateRequest_Serial{Serial: "1f"},
		Reason: strings.Repeat("x", maxReasonBytes+1)}, "reason: at most 1024 bytes"},
	{"list revocations", &rdzvv1.ListRevocationsRequest{}, ""},

	{"register", connect(&rdzvv1.Register{Node: goodNodeInfo()}), ""},
	{"register without node", connect(&rdzvv1.Register{}), "node: required"},
	{"register bad name", withNode(func(n *rdzvv1.NodeInfo) { n.Name = "GPU 01" }), "node.name:"},
	{"register bad label", withNode(func(n *rdzvv1.NodeInfo) { n.Labels = map[string]string{"pool": "a b"} }), "node.labels.pool:"},
	{"register hostname address", withNode(func(n *rdzvv1.NodeInfo) { n.Address = "gpu-01.local" }), "node.address: must be the IP address"},
	{"register bad gossip addr", withNode(func(n *rdzvv1.NodeInfo) { n.GossipAddr = "10.0.0.5" }), "node.gossip_addr:"},
	{"register too many gpus", withNode(func(n *rdzvv1.NodeInfo) { n.Gpus = make([]*rdzvv1.GPU, 65) }), "node.gpus: at most 64"},
	{"register long gpu name", withNode(func(n *rdzvv1.NodeInfo) { n.Gpus[0].Name = strings.Repeat("x", 257) }), "node.gpus[0].name:"},
	{"register too many interfaces", withNode(func(n *rdzvv1.NodeInfo) {
		n.Interfaces = make([]*rdzvv1.NetworkInterface, maxNodeInterfaces+1)
	}), "node.interfaces: at most"},
	{"register too many addresses", withNode(func(n *rdzvv1.NodeInfo) { n.Interfaces[0].Addresses = make([]string, 65) }), "node.interfaces[0].addresses:"},
	{"register long reason", withNode(func(n *rdzvv1.NodeInfo) { n.NcclInterfaceReason = strings.Repeat("x", 5000) }), "node.nccl_interface_reason:"},
	{"register bad worker", connect(&rdzvv1.Register{Node: goodNodeInfo(), Workers: []*rdzvv1.WorkerStatus{{Job: "x/y", State: 2}}}), "register.workers[0].job:"},
	{"register too many workers", connect(&rdzvv1.Register{Node: goodNodeInfo(), Workers: make([]*rdzvv1.WorkerStatus, 65)}), "register.workers: at most 64"},
	{"register memory of too many jobs", connect(&rdzvv1.Register{Node: goodNodeInfo(), Memory: make([]*rdzvv1.JobMemoryHeld, 65)}), "register.memory: at most 64 jobs"},
	{"register memory of a bad job name", connect(&rdzvv1.Register{Node: goodNodeInfo(), Memory: []*rdzvv1.JobMemoryHeld{{Job: "x/y"}}}), "register.memory[0].job:"},
	{"register memory of too many steps", connect(&rdzvv1.Register{Node: goodNodeInfo(), Memory: []*rdzvv1.JobMemoryHeld{{Job: "train", Held: make([]*rdzvv1.MemoryHeld, 65)}}}), "register.memory[0].held: at most 64 entries"},
	{"heartbeat", &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: 1}}}, ""},
	{"heartbeat with a ready standby", &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: 1, StandbyReady: "train"}}}, ""},
	{"heartbeat standby of a bad job name", &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: 1, StandbyReady: "x/y"}}}, "heartbeat.standby_ready:"},
	{"unknown message kind", &rdzvv1.ConnectRequest{}, ""},
	{"worker status", connect(&rdzvv1.WorkerStatus{Job: "train", Generation: 1, State: rdzvv1.WorkerState_WORKER_STATE_FAILED, Signal: "killed"}), ""},
	{"worker status unknown state", connect(&rdzvv1.WorkerStatus{Job: "train", State: 99}), "worker_status.state: unknown worker state 99"},
	{"worker status unspecified state", connect(&rdzvv1.WorkerStatus{Job: "train"}), "worker_status.state"},
	{"worker status long message", connect(&rdzvv1.WorkerStatus{Job: "train", State: 4, Message: strings.Repeat("x", wire.MaxTextBytes+1)}), "worker_status.message: at most 4096"},
	{"worker status too many holdings", connect(&rdzvv1.WorkerStatus{Job: "train", State: 4, Memory: make([]*rdzvv1.MemoryHeld, 65)}), "worker_status.memory: at most 64 entries"},
	{"register worker with holdings", connect(&rdzvv1.Register{Node: goodNodeInfo(), Workers: []*rdzvv1.WorkerStatus{{Job: "train", State: 4,
		Memory: []*rdzvv1.MemoryHeld{{Generation: 1, Step: 3, Ranks: []uint32{0}}}}}}), "register.workers[0].memory: must be empty"},
	{"progress bad job", connect(&rdzvv1.Progress{Job: ""}), "progress.job:"},
	{"progress metrics", connect(&rdzvv1.Progress{Job: "train", Metrics: map[string]float64{"loss": 1, "train/lr": 0.1}}), ""},
	{"progress too many metrics", connect(&rdzvv1.Progress{Job: "train", Metrics: manyMetrics(wire.MaxMetrics + 1)}), "progress.metrics: at most 16 are allowed, got 17"},
	{"progress bad metric name", connect(&rdzvv1.Progress{Job: "train", Metrics: map[string]float64{"a\nb": 1}}), `progress.metrics: name "a\nb" must be`},
	{"checkpoint", connect(&rdzvv1.CheckpointReport{Job: "train", Path: "/ckpt/step-10", Source: "scan"}), ""},
	{"checkpoint relative", connect(&rdzvv1.CheckpointReport{Job: "train", Path: "step-10", Source: "scan"}), "checkpoint.path:"},
	{"checkpoint traversal", connect(&rdzvv1.CheckpointReport{Job: "train", Path: "/ckpt/../etc", Source: "scan"}), "checkpoint.path:"},
	{"checkpoint long path", connect(&rdzvv1.CheckpointReport{Job: "train", Path: "/" + strings.Repeat("a", 4096), Source: "scan"}), "checkpoint.path:"},
	{"checkpoint bad source", connect(&rdzvv1.CheckpointReport{Job: "train", Path: "/ckpt/1", Source: "me"}), "checkpoint.source:"},
	{"port probe result", connect(&rdzvv1.PortProbeResult{RequestId: "0123456789abcdef", Port: 29500}), ""},
	{"port probe result bad port", connect(&rdzvv1.PortProbeResult{RequestId: "a", Port: 70000}), "port_probe_result.port:"},
	{"port probe result long id", connect(&rdzvv1.PortProbeResult{RequestId: strings.Repeat("a", 65)}), "port_probe_result.request_id:"},
	{"log chunk", connect(&rdzvv1.LogChunk{RequestId: "a", Data: make([]byte, wire.MaxLogChunkBytes)}), ""},
	{"log chunk too big", connect(&rdzvv1.LogChunk{RequestId: "a", Data: make([]byte, wire.MaxLogChunkBytes+1)}), "log_chunk.data: at most"},
	{"log chunk long error", connect(&rdzvv1.LogChunk{RequestId: "a", Error: strings.Repeat("e", 5000)}), "log_chunk.error:"},
	{"gossip view", connect(&rdzvv1.GossipView{Unreachable: []string{"gpu-02"}, AliveMembers: 3}), ""},
	{"gossip view bad name", connect(&rdzvv1.GossipView{Unreachable: []string{"gpu-02", "../x"}}), "gossip_view.unreachable[1]:"},
	{"health", connect(&rdzvv1.HealthReport{Results: []*rdzvv1.HealthCheckResult{{Name: "gpu", Message: "7 GPUs present"}}}), ""},
	{"health bad name", connect(&rdzvv1.HealthReport{Results: []*rdzvv1.HealthCheckResult{{Name: "gpu"}, {Name: "Disk Check"}}}), "health.results[1].name:"},
	{"health long message", connect(&rdzvv1.HealthReport{Results: []*rdzvv1.HealthCheckResult{{Name: "gpu", Message: strings.Repeat("x", wire.MaxTextBytes+1)}}}), "health.results[0].message:"},
	{"health too many", connect(&rdzvv1.HealthReport{Results: make([]*rdzvv1.HealthCheckResult, maxHealthChecks+1)}), "health.results: at most 64 checks"},
	{"register bad health", connect(&rdzvv1.Register{Node: goodNodeInfo(), Health: []*rdzvv1.HealthCheckResult{{Name: ""}}}), "register.health[0].name:"},
	{"gossip view too big", connect(&rdzvv1.GossipView{Unreachable: make([]string, maxViewSize+1)}), "gossip_view.unreachable: at most"},
	{"gossip view of watched peers", connect(&rdzvv1.GossipView{Unreachable: []string{"gpu-02"}, AliveMembers: 3, WatchJob: "train", WatchGeneration: 4, WatchedUnreachable: []string{"gpu-02"}}), ""},
	{"gossip view watching too many", connect(&rdzvv1.GossipView{WatchedUnreachable: []string{"gpu-01", "gpu-02", "gpu-03"}}), "gossip_view.watched_unreachable: at most 2"},
	{"gossip view watched bad name", connect(&rdzvv1.GossipView{WatchedUnreachable: []string{"../x"}}), "gossip_view.watched_unreachable[0]:"},
	{"gossip view bad watch job", connect(&rdzvv1.GossipView{WatchJob: "a b"}), "gossip_view.watch_job:"},
	{"gpu fault", connect(&rdzvv1.GPUFault{GpuIndex: 3, GpuUuid: "GPU-3", Kind: "xid", Code: 79, Message: "fell off the bus"}), ""},
	{"gpu fault bad index", connect(&rdzvv1.GPUFault{GpuIndex: 64, Kind: "xid"}), "gpu_fault.gpu_index:"},
	{"gpu fault long message", connect(&rdzvv1.GPUFault{Kind: "xid", Message: strings.Repeat("m", 5000)}), "gpu_fault.message:"},
}

func TestValidateRequest(t *testing.T) {
	for _, tt := range validationCases {
		t.Run(tt.name, func(t *testing.T) {
			err := validateRequest(tt.req)
			if tt.wantField == "" {
				require.NoError(t, err)
				return
			}
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tt.wantField)
		})
	}
}

func TestValidateRequestRefusesUnknownTypes(t *testing.T) {
	err := validateRequest(&rdzvv1.Job{})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.Contains(t, err.Error(), "no validator")
}

func TestUnaryGuard(t *testing.T) {
	guard := unaryGuard(zaptest.NewLogger(t))
	info := &grpc.UnaryServerInfo{FullMethod: "/rdzv.v1.JobService/GetJob"}
	called := false
	handler := func(context.Context, any) (any, error) { called = true; return &rdzvv1.GetJobResponse{}, nil }

	_, err := guard(context.Background(), &rdzvv1.GetJobRequest{Name: "../x"}, info, handler)
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.False(t, called, "an invalid request reached the handler")

	_, err = guard(context.Background(), &rdzvv1.GetJobRequest{Name: "x"}, info, handler)
	require.NoError(t, err)
	require.True(t, called)

	_, err = guard(context.Background(), &rdzvv1.GetJobRequest{Name: "x"}, info, func(context.Context, any) (any, error) {
		var m map[string]int
		m["boom"]++ // a nil map write: a handler bug
		return nil, nil
	})
	require.Equal(t, codes.Internal, status.Code(err), "a handler panic must become an error, not a crash")
}

// Streams are bounded per job and per controller, and viewers hold at most
// half of either, so that operators can always follow a job.
func TestLogStreamLimit(t *testing.T) {
	type open struct {
		job    string
		viewer bool
		n      int
	}
	tests := []struct {
		name string
		// held are opened first, and must all be granted.
		held []open
		// then is refused when wantRefused is set, granted otherwise.
		then        open
		wantRefused string
	}{
		{"a job's places", []open{{"a", false, maxLogStreamsPerJob}}, open{"a", false, 1}, "of job a are open, the most allowed"},
		{"a job's places taken by operators keep viewers out", []open{{"a", false, maxLogStreamsPerJob}}, open{"a", true, 1}, "of job a are open"},
		{"viewers hold half of a job's places", []open{{"a", true, maxLogStreamsPerJob / 2}}, open{"a", true, 1}, "viewers hold 4 log streams of job a"},
		{"operators follow where viewers hold half", []open{{"a", true, maxLogStreamsPerJob / 2}, {"a", false, maxLogStreamsPerJob/2 - 1}}, open{"a", false, 1}, ""},
		{"viewers follow other jobs", []open{{"a", true, maxLogStreamsPerJob / 2}}, open{"b", true, 1}, ""},
		{"the controller's places", []open{{"a", false, maxLogStreamsPerJob}, {"b", false, maxLogStreamsPerJob}, {"c", false, maxLogStreamsPerJob},
			{"d", false, maxLogStreamsPerJob}, {"e", false, maxLogStreamsPerJob}, {"f", false, maxLogStreamsPerJob}, {"g", false, maxLogStreamsPerJob},
			{"h", false, maxLogStreamsPerJob}}, open{"i", false, 1}, "on this controller are open"},
		{"viewers hold half of the controller's places", []open{{"a", true, 4}, {"b", true, 4}, {"c", true, 4}, {"d", true, 4},
			{"e", true, 4}, {"f", true, 4}, {"g", true, 4}, {"h", true, 4}}, open{"i", true, 1}, "viewers hold 32 log streams on this controller"},
		{"operators follow where viewers hold half of the controller's", []open{{"a", true, 4}, {"b", true, 4}, {"c", true, 4}, {"d", true, 4},
			{"e", true, 4}, {"f", true, 4}, {"g", true, 4}, {"h", true, 4}}, open{"i", false, 1}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l logStreamLimit
			var releases []func()
			for _, o := range tt.held {
				for range o.n {
					r, err := l.acquire(o.job, o.viewer)
					require.NoError(t, err)
					releases = append(releases, r)
				}
			}
			r, err := l.acquire(tt.then.job, tt.then.viewer)
			if tt.wantRefused == "" {
				require.NoError(t, err)
				releases = append(releases, r)
			} else {
				require.Equal(t, codes.ResourceExhausted, status.Code(err))
				require.Contains(t, err.Error(), tt.wantRefused)
				// A released place is free again.
				releases[0]()
				r, err := l.acquire(tt.held[0].job, tt.held[0].viewer)
				require.NoError(t, err)
				releases[0] = r
			}
			for _, r := range releases {
				r()
			}
			require.Zero(t, l.total)
			require.Empty(t, l.perJob)
		})
	}
}

func manyMetrics(n int) map[string]float64 {
	m := make(map[string]float64, n)
	for i := range n {
		m[fmt.Sprintf("m%d", i)] = float64(i)
	}
	return m
}
