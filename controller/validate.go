package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// Every request and every agent stream message passes validateRequest
// before a handler sees it (the interceptors below), so a bad one is
// refused with InvalidArgument naming the field and changes nothing. The
// validators are pure, and fuzzed in validate_fuzz_test.go.

// Bounds on what an agent describes about its node; real values are far
// smaller.
const (
	maxNodeInterfaces = 256
	maxInterfaceAddrs = 64
	maxRDMADevices    = 64
	maxShortText      = 256
	// maxRegisterWorkers bounds the statuses a registering agent reports: its
	// recent history plus what runs now.
	maxRegisterWorkers = 64
	// maxHealthChecks bounds a node's health checks: the agent's built-ins
	// and its at most 32 commands.
	maxHealthChecks = 64
)

// errNoValidator refuses a request type nobody wrote a validator for, so a
// new RPC cannot reach a handler unchecked.
var errNoValidator = errors.New("no validator for this request type")

// validateRequest checks one request or stream message.
func validateRequest(m any) error {
	var err error
	switch r := m.(type) {
	case *rdzvv1.StartJobRequest:
		err = validateStartJob(r)
	case *rdzvv1.GetJobRequest:
		err = nameErr("name", r.GetName())
	case *rdzvv1.StopJobRequest:
		err = nameErr("name", r.GetName())
	case *rdzvv1.DeleteJobRequest:
		err = nameErr("name", r.GetName())
	case *rdzvv1.ListJobsRequest:
		err = validateListJobs(r)
	case *rdzvv1.ListNodesRequest:
		err = validateListNodes(r)
	case *rdzvv1.SummarizeNodesRequest:
		err = nodeFiltersErr(r.GetStates(), r.GetSelector())
	case *rdzvv1.ListEventsRequest:
		err = validateListEvents(r)
	case *rdzvv1.StreamLogsRequest:
		err = validateStreamLogs(r)
	case *rdzvv1.WatchEventsRequest:
		err = validateWatchEvents(r)
	case *rdzvv1.CordonNodeRequest:
		err = errors.Join(nameErr("name", r.GetName()), textErr("reason", r.GetReason(), maxReasonBytes))
	case *rdzvv1.UncordonNodeRequest:
		err = nameErr("name", r.GetName())
	case *rdzvv1.DrainNodeRequest:
		err = errors.Join(nameErr("name", r.GetName()), textErr("reason", r.GetReason(), maxReasonBytes))
	case *rdzvv1.GetServerInfoRequest:
	case *rdzvv1.ConnectRequest:
		err = validateConnectRequest(r)
	case *rdzvv1.CarryRequest:
		// Frame by frame as the carrier handles them (carry.go), so that
		// one agent's bad message ends its own stream, not the relay's.
	case *rdzvv1.RevokeCertificateRequest:
		err = validateRevokeCertificate(r)
	case *rdzvv1.ListRevocationsRequest:
	case *healthpb.HealthCheckRequest:
		// Public (see publicMethod): only a service name, which only
		// "" answers.
		err = textErr("service", r.GetService(), maxShortText)
	default:
		err = fmt.Errorf("%T: %w", m, errNoValidator)
	}
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return nil
}

func validateStartJob(r *rdzvv1.StartJobRequest) error {
	if r.GetSpec() == nil {
		return errors.New("spec: required")
	}
	// The spec's own limits, including its total size, are jobspec's.
	return jobspec.FromProto(r.GetSpec()).Validate()
}

func validateListJobs(r *rdzvv1.ListJobsRequest) error {
	errs := []error{pageSizeErr(r.GetPageSize()), statesErr("states", r.GetStates(), rdzvv1.JobState_name)}
	if _, err := decodePageToken(r.GetPageToken(), jobsToken); err != nil {
		errs = append(errs, err)
	}
	if _, ok := rdzvv1.JobView_name[int32(r.GetView())]; !ok {
		errs = append(errs, fmt.Errorf("view: %d is not a view; want JOB_VIEW_SUMMARY or JOB_VIEW_FULL", r.GetView()))
	}
	return errors.Join(errs...)
}

func validateListNodes(r *rdzvv1.ListNodesRequest) error {
	errs := []error{pageSizeErr(r.GetPageSize()), nodeFiltersErr(r.GetStates(), r.GetSelector())}
	if _, err := decodePageToken(r.GetPageToken(), nodesToken); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// nodeFiltersErr checks the filters that node lists and summaries share.
func nodeFiltersErr(states []rdzvv1.NodeState, selector map[string]string) error {
	errs := []error{statesErr("states", states, rdzvv1.NodeState_name)}
	for _, fe := range wire.ValidateLabels("selector", selector) {
		errs = append(errs, fe)
	}
	return errors.Join(errs...)
}

func validateListEvents(r *rdzvv1.ListEventsRequest) error {
	errs := []error{pageSizeErr(r.GetPageSize())}
	scope := store.ClusterScope
	if r.GetJob() != "" {
		errs = append(errs, nameErr("job", r.GetJob()))
		scope = r.GetJob()
	}
	if r.GetLimit() > maxEventLimit {
		errs = append(errs, fmt.Errorf("limit: at most %d, got %d", maxEventLimit, r.GetLimit()))
	}
	if _, err := decodePageToken(r.GetPageToken(), eventsToken+scope); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func validateWatchEvents(r *rdzvv1.WatchEventsRequest) error {
	var errs []error
	if r.GetJob() != "" {
		errs = append(errs, nameErr("job", r.GetJob()))
	}
	if r.GetTail() > maxEventLimit {
		errs = append(errs, fmt.Errorf("tail: at most %d, got %d", maxEventLimit, r.GetTail()))
	}
	return errors.Join(errs...)
}

func validateStreamLogs(r *rdzvv1.StreamLogsRequest) error {
	errs := []error{nameErr("job", r.GetJob())}
	if r.GetNode() != "" {
		errs = append(errs, nameErr("node", r.GetNode()))
	}
	if r.GetTailBytes() > wire.MaxLogTailBytes {
		errs = append(errs, fmt.Errorf("tail_bytes: at most %d, got %d", wire.MaxLogTailBytes, r.GetTailBytes()))
	}
	if r.GetTailLines() > wire.MaxLogTailLines {
		errs = append(errs, fmt.Errorf("tail_lines: at most %d, got %d", wire.MaxLogTailLines, r.GetTailLines()))
	}
	if r.GetAllNodes() && r.GetNode() != "" {
		errs = append(errs, fmt.Errorf("node: must be empty with all_nodes, got %q", r.GetNode()))
	}
	if r.GetSince() != nil {
		if err := r.GetSince().CheckValid(); err != nil {
			errs = append(errs, fmt.Errorf("since: %w", err))
		}
	}
	return errors.Join(errs...)
}

// validateConnectRequest checks one message on an agent's stream. A message
// of a kind this controller does not know (a newer agent) passes: the
// stream ignores it.
func validateConnectRequest(m *rdzvv1.ConnectRequest) error {
	switch msg := m.GetMsg().(type) {
	case *rdzvv1.ConnectRequest_Register:
		return validateRegister(msg.Register)
	case *rdzvv1.ConnectRequest_WorkerStatus:
		return validateWorkerStatus("worker_status", msg.WorkerStatus)
	case *rdzvv1.ConnectRequest_Progress:
		return errors.Join(nameErr("progress.job", msg.Progress.GetJob()), wire.CheckMetrics("progress.metrics", msg.Progress.GetMetrics()),
			validateMemoryHeld("progress.memory", msg.Progress.GetMemory()))
	case *rdzvv1.ConnectRequest_Checkpoint:
		return validateCheckpointReport(msg.Checkpoint)
	case *rdzvv1.ConnectRequest_Heartbeat:
		if job := msg.Heartbeat.GetStandbyReady(); job != "" {
			return nameErr("heartbeat.standby_ready", job)
		}
	case *rdzvv1.ConnectRequest_PortProbeResult:
		r := msg.PortProbeResult
		var errs []error
		errs = append(errs, textErr("port_probe_result.request_id", r.GetRequestId(), wire.MaxRequestIDBytes))
		errs = append(errs, textErr("port_probe_result.error", r.GetError(), wire.MaxTextBytes))
		if r.GetPort() > 65535 {
			errs = append(errs, fmt.Errorf("port_probe_result.port: must be a TCP port, got %d", r.GetPort()))
		}
		return errors.Join(errs...)
	case *rdzvv1.ConnectRequest_LogChunk:
		c := msg.LogChunk
		var errs []error
		errs = append(errs, textErr("log_chunk.request_id", c.GetRequestId(), wire.MaxRequestIDBytes))
		errs = append(errs, textErr("log_chunk.error", c.GetError(), wire.MaxTextBytes))
		if len(c.GetData()) > wire.MaxLogChunkBytes {
			errs = append(errs, fmt.Errorf("log_chunk.data: at most %d bytes, got %d", wire.MaxLogChunkBytes, len(c.GetData())))
		}
		return errors.Join(errs...)
	case *rdzvv1.ConnectRequest_GossipView:
		return validateGossipView(msg.GossipView)
	case *rdzvv1.ConnectRequest_Health:
		return validateHealth("health.results", msg.Health.GetResults())
	case *rdzvv1.ConnectRequest_GpuFault:
		f := msg.GpuFault
		var errs []error
		if f.GetGpuIndex() >= wire.MaxGPUsPerNode {
			errs = append(errs, fmt.Errorf("gpu_fault.gpu_index: must be below %d, got %d", wire.MaxGPUsPerNode, f.GetGpuIndex()))
		}
		errs = append(errs, textErr("gpu_fault.gpu_uuid", f.GetGpuUuid(), maxShortText))
		errs = append(errs, textErr("gpu_fault.kind", f.GetKind(), maxShortText))
		errs = append(errs, textErr("gpu_fault.message", f.GetMessage(), wire.MaxTextBytes))
		return errors.Join(errs...)
	}
	return nil
}

func validateRegister(r *rdzvv1.Register) error {
	errs := []error{validateNodeInfo(r.GetNode()), validateHealth("register.health", r.GetHealth())}
	if len(r.GetWorkers()) > maxRegisterWorkers {
		errs = append(errs, fmt.Errorf("register.workers: at most %d, got %d", maxRegisterWorkers, len(r.GetWorkers())))
	} else {
		for i, w := range r.GetWorkers() {
			field := fmt.Sprintf("register.workers[%d]", i)
			errs = append(errs, validateWorkerStatus(field, w))
			if n := len(w.GetMemory()); n > 0 {
				errs = append(errs, fmt.Errorf("%s.memory: must be empty (a registration's holdings are register.memory), got %d entries", field, n))
			}
		}
	}
	if len(r.GetMemory()) > wire.MaxRegisterMemoryJobs {
		errs = append(errs, fmt.Errorf("register.memory: at most %d jobs, got %d", wire.MaxRegisterMemoryJobs, len(r.GetMemory())))
	} else {
		for i, m := range r.GetMemory() {
			field := fmt.Sprintf("register.memory[%d]", i)
			errs = append(errs, nameErr(field+".job", m.GetJob()), validateMemoryHeld(field+".held", m.GetHeld()))
		}
	}
	return errors.Join(errs...)
}

func validateNodeInfo(n *rdzvv1.NodeInfo) error {
	if n == nil {
		return errors.New("node: required")
	}
	var errs []error
	if fe := wire.ValidateName("node.name", n.GetName()); fe != nil {
		errs = append(errs, fe)
	}
	for _, fe := range wire.ValidateLabels("node.labels", n.GetLabels()) {
		errs = append(errs, fe)
	}
	if len(n.GetGpus()) > wire.MaxGPUsPerNode {
		errs = append(errs, fmt.Errorf("node.gpus: at most %d GPUs are supported, got %d", wire.MaxGPUsPerNode, len(n.GetGpus())))
	} else {
		for i, g := range n.GetGpus() {
			f := fmt.Sprintf("node.gpus[%d]", i)
			errs = append(errs, textErr(f+".uuid", g.GetUuid(), maxShortText), textErr(f+".name", g.GetName(), maxShortText),
				textErr(f+".pci_bus_id", g.GetPciBusId(), maxShortText))
		}
	}
	if len(n.GetInterfaces()) > maxNodeInterfaces {
		errs = append(errs, fmt.Errorf("node.interfaces: at most %d, got %d", maxNodeInterfaces, len(n.GetInterfaces())))
	} else {
		for i, ifc := range n.GetInterfaces() {
			errs = append(errs, validateInterface(fmt.Sprintf("node.interfaces[%d]", i), ifc))
		}
	}
	if _, err := netip.ParseAddr(n.GetAddress()); err != nil {
		errs = append(errs, fmt.Errorf("node.address: must be the IP address of the agent's NCCL interface, got %q", clip(n.GetAddress())))
	}
	if a := n.GetGossipAddr(); a != "" {
		if _, err := netip.ParseAddrPort(a); err != nil {
			errs = append(errs, fmt.Errorf("node.gossip_addr: must be empty or ip:port, got %q", clip(a)))
		}
	}
	if a := n.GetPeerAddr(); a != "" {
		if _, err := netip.ParseAddrPort(a); err != nil {
			errs = append(errs, fmt.Errorf("node.peer_addr: must be empty or ip:port, got %q", clip(a)))
		}
	}
	errs = append(errs, textErr("node.nccl_interface", n.GetNcclInterface(), maxShortText),
		textErr("node.nccl_interface_reason", n.GetNcclInterfaceReason(), wire.MaxTextBytes),
		textErr("node.agent_version", n.GetAgentVersion(), maxShortText))
	return errors.Join(errs...)
}

func validateInterface(field string, ifc *rdzvv1.NetworkInterface) error {
	errs := []error{textErr(field+".name", ifc.GetName(), maxShortText)}
	if len(ifc.GetAddresses()) > maxInterfaceAddrs {
		errs = append(errs, fmt.Errorf("%s.addresses: at most %d, got %d", field, maxInterfaceAddrs, len(ifc.GetAddresses())))
	} else {
		for i, a := range ifc.GetAddresses() {
			errs = append(errs, textErr(fmt.Sprintf("%s.addresses[%d]", field, i), a, maxShortText))
		}
	}
	if len(ifc.GetRdmaDevices()) > maxRDMADevices {
		errs = append(errs, fmt.Errorf("%s.rdma_devices: at most %d, got %d", field, maxRDMADevices, len(ifc.GetRdmaDevices())))
	} else {
		for i, d := range ifc.GetRdmaDevices() {
			errs = append(errs, textErr(fmt.Sprintf("%s.rdma_devices[%d]", field, i), d, maxShortText))
		}
	}
	return errors.Join(errs...)
}

func validateWorkerStatus(field string, w *rdzvv1.WorkerStatus) error {
	errs := []error{nameErr(field+".job", w.GetJob())}
	if _, known := rdzvv1.WorkerState_name[int32(w.GetState())]; !known || w.GetState() == rdzvv1.WorkerState_WORKER_STATE_UNSPECIFIED {
		errs = append(errs, fmt.Errorf("%s.state: unknown worker state %d", field, w.GetState()))
	}
	errs = append(errs, textErr(field+".signal", w.GetSignal(), maxShortText), textErr(field+".message", w.GetMessage(), wire.MaxTextBytes),
		validateMemoryHeld(field+".memory", w.GetMemory()))
	return errors.Join(errs...)
}

// validateCheckpointReport checks the report's form; whether the path lies
// in the job's checkpoint directory is checked against the job when the
// report is applied (checkpointPathOK).
func validateCheckpointReport(r *rdzvv1.CheckpointReport) error {
	errs := []error{nameErr("checkpoint.job", r.GetJob())}
	p := r.GetPath()
	if len(p) > 4096 {
		errs = append(errs, fmt.Errorf("checkpoint.path: must be at most 4096 bytes, got %d", len(p)))
	} else if fe := wire.CheckPath("checkpoint.path", p, ""); fe != nil {
		errs = append(errs, fe)
	}
	if s := r.GetSource(); s != "helper" && s != "scan" {
		errs = append(errs, fmt.Errorf("checkpoint.source: must be helper or scan, got %q", clip(s)))
	}
	return errors.Join(errs...)
}

func validateHealth(field string, results []*rdzvv1.HealthCheckResult) error {
	if len(results) > maxHealthChecks {
		return fmt.Errorf("%s: at most %d checks, got %d", field, maxHealthChecks, len(results))
	}
	var errs []error
	for i, r := range results {
		errs = append(errs, nameErr(fmt.Sprintf("%s[%d].name", field, i), r.GetName()),
			textErr(fmt.Sprintf("%s[%d].message", field, i), r.GetMessage(), wire.MaxTextBytes))
	}
	return errors.Join(errs...)
}

func validateGossipView(v *rdzvv1.GossipView) error {
	if n := len(v.GetUnreachable()); n > maxViewSize {
		return fmt.Errorf("gossip_view.unreachable: at most %d nodes, got %d", maxViewSize, n)
	}
	if n := len(v.GetWatchedUnreachable()); n > maxWatched {
		return fmt.Errorf("gossip_view.watched_unreachable: at most %d nodes (an agent watches its two ring neighbours), got %d", maxWatched, n)
	}
	var errs []error
	for i, name := range v.GetUnreachable() {
		errs = append(errs, nameErr(fmt.Sprintf("gossip_view.unreachable[%d]", i), name))
	}
	for i, name := range v.GetWatchedUnreachable() {
		errs = append(errs, nameErr(fmt.Sprintf("gossip_view.watched_unreachable[%d]", i), name))
	}
	if v.GetWatchJob() != "" {
		errs = append(errs, nameErr("gossip_view.watch_job", v.GetWatchJob()))
	}
	return errors.Join(errs...)
}

// nameErr checks a job or node name, which ends up in etcd keys, file paths
// on the nodes and log fields.
func nameErr(field, name string) error {
	if fe := wire.ValidateName(field, name); fe != nil {
		return fe
	}
	return nil
}

func textErr(field, s string, limit int) error {
	if len(s) > limit {
		return fmt.Errorf("%s: at most %d bytes, got %d", field, limit, len(s))
	}
	return nil
}

// clip shortens a value quoted in an error.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// unaryGuard validates each request and turns a handler's panic into an
// Internal error, so neither a bad request nor a bug reaches a caller as a
// crashed controller.
func unaryGuard(log *zap.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer recoverPanic(log, info.FullMethod, &err)
		if err := validateRequest(req); err != nil {
			log.Debug("request rejected", zap.String("method", info.FullMethod), zap.Error(err))
			return nil, err
		}
		return handler(ctx, req)
	}
}

// streamGuard does the same for streams: every message received is
// validated before the handler gets it.
func streamGuard(log *zap.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer recoverPanic(log, info.FullMethod, &err)
		return handler(srv, &validatingStream{ServerStream: ss})
	}
}

type validatingStream struct{ grpc.ServerStream }

func (s *validatingStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return validateRequest(m)
}

func recoverPanic(log *zap.Logger, method string, err *error) {
	if r := recover(); r != nil {
		log.Error("panic serving request", zap.String("method", method), zap.String("panic", fmt.Sprint(r)), zap.Stack("stack"))
		*err = status.Error(codes.Internal, "internal error serving "+method+"; the controller log has details")
	}
}

// Bounds of a progress report's in-memory checkpoint holdings: a node holds
// the steps its bound allows, of its own ranks and its peers'.
const (
	maxMemoryHeld      = 64
	maxMemoryHeldRanks = 1024
)

func validateMemoryHeld(field string, held []*rdzvv1.MemoryHeld) error {
	if len(held) > maxMemoryHeld {
		return fmt.Errorf("%s: at most %d entries are allowed, got %d", field, maxMemoryHeld, len(held))
	}
	for i, h := range held {
		if n := len(h.GetRanks()); n > maxMemoryHeldRanks {
			return fmt.Errorf("%s[%d].ranks: at most %d ranks are allowed, got %d", field, i, maxMemoryHeldRanks, n)
		}
	}
	return nil
}
