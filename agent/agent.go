package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/agent/gpu"
	"github.com/rdzv/rdzv/agent/netif"
	"github.com/rdzv/rdzv/health"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// GPUDiscoverer lists this node's GPUs.
type GPUDiscoverer interface {
	Discover(ctx context.Context) ([]gpu.GPU, error)
}

// NetworkDetector reads this node's interfaces and routes.
type NetworkDetector interface {
	Interfaces() ([]netif.Interface, error)
	DefaultRouteInterface() (string, error)
	InterfaceFacing(target string) (string, error)
}

const (
	minBackoff = 250 * time.Millisecond
	maxBackoff = 10 * time.Second
	// stableSession is how long a session must last before a disconnect is
	// treated as new trouble rather than a continuing outage.
	stableSession = 30 * time.Second
	// shutdownFlush bounds how long a stopping agent waits for its last
	// worker reports to be sent.
	shutdownFlush = 2 * time.Second
)

// GPUHealthWatcher reports GPU faults until ctx ends.
type GPUHealthWatcher interface {
	Watch(ctx context.Context, report func(health.Fault)) error
}

// Agent is the rdzv-agent daemon.
type Agent struct {
	cfg     Config
	log     *zap.Logger
	gpus    GPUDiscoverer
	net     NetworkDetector
	spawner Spawner
	health  GPUHealthWatcher
	// xids says which GPU faults are critical (gpu_health).
	xids health.XIDPolicy
	// faults carries critical GPU faults to the controller session.
	faults chan *rdzvv1.GPUFault
	// tls is this node's certificate and the cluster CA; nil when insecure.
	tls *pki.Reloader
}

// Option adjusts an Agent.
type Option func(*Agent)

// WithGPUHealth watches GPU faults with w (NVML's XID and ECC events in
// production).
func WithGPUHealth(w GPUHealthWatcher) Option { return func(a *Agent) { a.health = w } }

// faultQueue bounds GPU faults waiting for the controller; one critical
// fault is enough to cordon the node, so dropping later ones loses nothing.
const faultQueue = 16

// New builds an agent. gpus is the NVML discoverer in production, or
// gpu.Fake when cfg.FakeGPUs is set.
func New(cfg Config, log *zap.Logger, gpus GPUDiscoverer, net NetworkDetector, spawner Spawner, opts ...Option) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid agent config: %w", err)
	}
	xids, err := cfg.GPUHealth.Policy("gpu_health")
	if err != nil {
		return nil, fmt.Errorf("invalid agent config: %w", err)
	}
	a := &Agent{cfg: cfg, log: log, gpus: gpus, net: net, spawner: spawner, xids: xids, faults: make(chan *rdzvv1.GPUFault, faultQueue)}
	for _, o := range opts {
		o(a)
	}
	if !cfg.Insecure {
		name, err := cfg.nodeName()
		if err != nil {
			return nil, err
		}
		// A certificate for another node would be refused by the
		// controller at every attempt; say so at start instead.
		want := func(id pki.Identity) error {
			if id != (pki.Identity{Role: pki.RoleAgent, Name: name}) {
				return fmt.Errorf("is the certificate of %s, but this is node %q: issue one with `rdzvctl pki issue agent %s`", id, name, name)
			}
			return nil
		}
		r, err := pki.NewReloader(cfg.TLS, want, log.Named("tls"))
		if err != nil {
			return nil, fmt.Errorf("loading the agent's tls files: %w", err)
		}
		a.tls = r
	}
	return a, nil
}

// credentials are mutual TLS with this node's certificate, or none (and a
// warning) when insecure.
func (a *Agent) credentials(addr string) (credentials.TransportCredentials, error) {
	if a.tls == nil {
		return insecure.NewCredentials(), nil
	}
	conf, err := a.tls.ClientConfig(addr)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(conf), nil
}

// Run discovers the node, then stays connected to the controller and runs
// what it is assigned until ctx ends; on the way out it stops its workers.
func (a *Agent) Run(ctx context.Context) error {
	info, err := a.Describe(ctx)
	if err != nil {
		return err
	}
	log := a.log.With(zap.String("node", info.GetName()))
	log.Info("node discovered", zap.Int("gpus", len(info.GetGpus())), zap.Bool("fake_gpus", info.GetFakeGpus()),
		zap.String("interface", info.GetNcclInterface()), zap.String("address", info.GetAddress()),
		zap.String("reason", info.GetNcclInterfaceReason()))

	if a.tls == nil {
		log.Warn("insecure mode: no tls; this node runs whatever anyone who can pose as the controller sends (use only for local tests)",
			zap.String("controller", a.cfg.Controller))
	}
	addrs, err := a.cfg.Controllers()
	if err != nil {
		return err
	}
	ctl := newControllers(addrs, a.credentials,
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wire.MaxMessageBytes), grpc.MaxCallSendMsgSize(wire.MaxMessageBytes)),
	)
	defer ctl.close()

	ln, err := listenReports(a.cfg.StateDir)
	if err != nil {
		return err
	}
	sup := NewSupervisor(a.cfg, info.GetName(), info.GetNcclInterface(), ln.Addr().String(), a.spawner, log.Named("supervisor"))
	if ad, ok := a.spawner.(adopter); ok {
		found, err := ad.Adopt()
		if err != nil {
			return fmt.Errorf("adopting workers left by the previous agent: %w", err)
		}
		// Before the first registration, which reports them.
		sup.Adopt(found)
	}
	reports := newReportServer(sup, log.Named("reports"))
	sess := &agentSession{agent: a, info: info, sup: sup, ctl: ctl, log: log.Named("session"), farewells: make(chan farewell)}
	sup.OnHandover(sess.announceRestart)
	sess.lastHeard.Store(time.Now().UnixNano())
	unregistered := health.Unregistered
	sess.heartbeat.Store(&unregistered)
	if a.cfg.GossipPort >= 0 {
		g, err := StartGossip(info.GetName(), info.GetAddress(), a.cfg.GossipPort, log.Named("gossip"))
		if err != nil {
			return err
		}
		defer g.Close()
		sess.gossip = g
		info.GossipAddr = g.Addr()
	}
	// The session outlives ctx a little: on shutdown the supervisor first
	// stops the workers, and their final status should reach the controller
	// rather than leave it to notice a silent node.
	sessCtx, endSession := context.WithCancel(context.WithoutCancel(ctx))
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return reports.serve(ln) })
	g.Go(func() error {
		defer endSession()
		err := sup.Run(gctx)
		sup.drain(shutdownFlush)
		// Only now: workers report until they are gone.
		reports.shutdown()
		return err
	})
	g.Go(func() error { sess.loop(sessCtx); return nil })
	g.Go(func() error { sess.fenceLoop(gctx); return nil })
	if a.health != nil {
		g.Go(func() error { a.watchHealth(gctx, log.Named("health")); return nil })
	}
	return g.Wait()
}

// adopter finds the workers a previous agent left running.
type adopter interface {
	Adopt() ([]Adopted, error)
}

// reportAddrFile keeps the report endpoint's address across agent
// restarts: adopted workers still have it in RDZV_AGENT_ADDR.
const reportAddrFile = "report.addr"

// listenReports opens the workers' report endpoint. Loopback only: workers
// report from this node, and nothing else should be able to move a job's
// progress. The OS picks the port the first time, so agents sharing a host
// cannot collide; later starts take the same one back.
func listenReports(stateDir string) (net.Listener, error) {
	path := filepath.Join(stateDir, reportAddrFile)
	if prev, err := os.ReadFile(path); err == nil {
		if ln, err := net.Listen("tcp", strings.TrimSpace(string(prev))); err == nil {
			return ln, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for worker reports: %w", err)
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		ln.Close()
		return nil, fmt.Errorf("creating state directory: %w", err)
	}
	if err := os.WriteFile(path, []byte(ln.Addr().String()), 0o644); err != nil {
		ln.Close()
		return nil, fmt.Errorf("recording the report address: %w", err)
	}
	return ln, nil
}

// watchHealth forwards critical GPU faults; the controller cordons the node
// and moves its job on. A broken watcher is logged, not fatal: the node
// still runs work, and operators see why its health is not watched.
func (a *Agent) watchHealth(ctx context.Context, log *zap.Logger) {
	log.Info("watching gpu health", zap.Stringer("policy", a.xids))
	err := a.health.Watch(ctx, func(f health.Fault) {
		if !a.xids.Critical(f) {
			log.Info("gpu fault not critical, only logged", zap.Uint32("gpu", f.GPUIndex), zap.String("fault", f.String()))
			return
		}
		log.Error("critical gpu fault", zap.Uint32("gpu", f.GPUIndex), zap.String("fault", f.String()))
		msg := &rdzvv1.GPUFault{GpuIndex: f.GPUIndex, GpuUuid: f.UUID, Kind: string(f.Kind), Code: f.Code, Message: f.String(), At: timestamppb.New(f.At)}
		select {
		case a.faults <- msg:
		default:
			log.Warn("gpu fault queue full, dropping fault", zap.String("fault", f.String()))
		}
	})
	if err != nil {
		log.Error("gpu health watch failed; gpu faults will not be detected", zap.Error(err))
	}
}

// Describe discovers GPUs and interfaces and picks the NCCL interface.
func (a *Agent) Describe(ctx context.Context) (*rdzvv1.NodeInfo, error) {
	name, err := a.cfg.nodeName()
	if err != nil {
		return nil, err
	}
	info := &rdzvv1.NodeInfo{Name: name, Labels: a.cfg.Labels, AgentVersion: Version, FakeGpus: a.cfg.FakeGPUs > 0}

	gpus, err := a.gpus.Discover(ctx)
	if err != nil {
		// A broken driver leaves the GPUs unusable; the node still registers
		// (with none) so operators see it and the reason in the log.
		a.log.Error("gpu discovery failed, reporting zero gpus", zap.Error(err))
	}
	for _, g := range gpus {
		info.Gpus = append(info.Gpus, &rdzvv1.GPU{Index: g.Index, Uuid: g.UUID, Name: g.Name, MemoryBytes: g.MemoryBytes, PciBusId: g.PCIBusID})
	}

	ifaces, err := a.net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing network interfaces: %w", err)
	}
	opts := netif.SelectOptions{Explicit: a.cfg.NCCLInterface}
	// Controller replicas share a management network: the first one's
	// route stands for all.
	if addrs, err := a.cfg.Controllers(); err == nil {
		if opts.ControllerFacing, err = a.net.InterfaceFacing(addrs[0]); err != nil {
			a.log.Warn("no route to the controller found", zap.String("controller", addrs[0]), zap.Error(err))
		}
	}
	if opts.DefaultRoute, err = a.net.DefaultRouteInterface(); err != nil {
		a.log.Warn("reading default route failed", zap.Error(err))
	}
	choice, err := netif.Select(ifaces, opts)
	if err != nil {
		return nil, fmt.Errorf("choosing the NCCL interface: %w", err)
	}
	info.NcclInterface, info.Address, info.NcclInterfaceReason = choice.Interface.Name, choice.Address.String(), choice.Reason
	for _, ifc := range ifaces {
		pi := &rdzvv1.NetworkInterface{Name: ifc.Name, Kind: interfaceKind(ifc.Kind), Mtu: uint32(ifc.MTU), Up: ifc.Up,
			SpeedMbps: uint32(max(ifc.SpeedMbps, 0)), RdmaDevices: ifc.RDMADevices}
		for _, p := range ifc.Addrs {
			pi.Addresses = append(pi.Addresses, p.String())
		}
		info.Interfaces = append(info.Interfaces, pi)
	}
	return info, nil
}

func interfaceKind(k netif.Kind) rdzvv1.InterfaceKind {
	switch k {
	case netif.KindLoopback:
		return rdzvv1.InterfaceKind_INTERFACE_KIND_LOOPBACK
	case netif.KindInfiniBand:
		return rdzvv1.InterfaceKind_INTERFACE_KIND_INFINIBAND
	case netif.KindVirtual:
		return rdzvv1.InterfaceKind_INTERFACE_KIND_VIRTUAL
	case netif.KindEthernet:
		return rdzvv1.InterfaceKind_INTERFACE_KIND_ETHERNET
	}
	return rdzvv1.InterfaceKind_INTERFACE_KIND_UNSPECIFIED
}

// agentSession keeps the agent connected to the controller.
type agentSession struct {
	agent *Agent
	info  *rdzvv1.NodeInfo
	sup   *Supervisor
	ctl   *controllers
	log   *zap.Logger
	// gossip is nil when disabled (gossip_port -1).
	gossip *Gossip
	// heartbeat is the controller's liveness timing as of the last
	// registration (health.Unregistered before the first): what
	// self-fencing goes by.
	heartbeat atomic.Pointer[health.Heartbeat]
	// lastHeard (unix nanoseconds) is when the controller last showed it
	// hears us: the sending of the latest heartbeat it acknowledged, or of
	// the registration it answered (see acks).
	lastHeard atomic.Int64
	// fencing is set while a self-fencing stop is queued or under way.
	fencing atomic.Bool
	// farewells carries the last word of an agent that leaves its workers
	// running; unbuffered, so a send succeeds only while connected.
	farewells chan farewell
}

type farewell struct {
	msg  *rdzvv1.ConnectRequest
	sent chan struct{}
}

// announceRestart tells the controller that this agent is exiting and its
// workers run on for hold; false if the controller could not be told, in
// which case it goes by heartbeats and the workers must not outlive them.
func (s *agentSession) announceRestart(hold time.Duration) bool {
	f := farewell{sent: make(chan struct{}), msg: &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Restarting{
		Restarting: &rdzvv1.AgentRestarting{HoldMs: uint32(hold.Milliseconds())},
	}}}
	timeout := time.After(shutdownFlush)
	select {
	case s.farewells <- f:
	case <-timeout:
		return false
	}
	select {
	case <-f.sent:
		return true
	case <-timeout:
		return false
	}
}

// loop connects, and reconnects with jittered exponential backoff, until
// ctx ends. Jitter keeps 10,000 agents from reconnecting in lockstep after
// a controller restart.
func (s *agentSession) loop(ctx context.Context) {
	backoff := minBackoff
	failures := 0
	for ctx.Err() == nil {
		started := time.Now()
		addr, client, err := s.ctl.pick()
		if err == nil {
			err = s.connect(ctx, client)
		}
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > stableSession {
			backoff, failures = minBackoff, 0
		}
		if s.ctl.failed(addr, err) {
			// A standby named the leader: go there at once.
			s.log.Info("redirected to the leading controller", zap.String("from", addr), zap.String("to", s.ctl.hint))
			continue
		}
		failures++
		wait := backoff/2 + rand.N(backoff/2+1)
		if failures == 1 || failures%10 == 0 {
			s.log.Warn("controller connection lost, reconnecting", zap.String("controller", addr), zap.Error(err), zap.Int("attempt", failures), zap.Duration("backoff", wait))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

func (s *agentSession) connect(ctx context.Context, client rdzvv1.AgentServiceClient) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Connect(ctx)
	if err != nil {
		return fmt.Errorf("opening stream: %w", err)
	}
	reg := &rdzvv1.Register{Node: s.info, Workers: s.sup.Statuses()}
	registering := time.Now()
	if err := stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: reg}}); err != nil {
		return fmt.Errorf("sending register: %w", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("registering: %w", err)
	}
	registered := first.GetRegistered()
	ms := func(v uint32) time.Duration { return time.Duration(v) * time.Millisecond }
	hb := s.heartbeat.Load().Learn(ms(registered.GetHeartbeatIntervalMs()), ms(registered.GetHeartbeatTimeoutMs()), ms(registered.GetVouchedTimeoutMs()))
	s.heartbeat.Store(&hb)
	interval := hb.Interval
	if registered.GetHeartbeatTimeoutMs() > 0 {
		// A crashed agent's workers must be gone before the controller gives
		// up on us.
		s.sup.SetOrphanTimeout(hb.OrphanTimeout())
	}
	s.heardAt(registering)
	s.log.Info("registered with controller", zap.Duration("heartbeat_interval", interval), zap.Duration("heartbeat_timeout", ms(registered.GetHeartbeatTimeoutMs())))
	var gossipChanged <-chan struct{}
	if s.gossip != nil {
		gossipChanged = s.gossip.Changed()
		go s.gossip.Join(registered.GetGossipSeeds())
	}

	// Only the sender goroutine calls stream.Send after registration.
	out := make(chan *rdzvv1.ConnectRequest, 256)
	var sent acks
	logs := newLogTails(s.sup, out, s.log.Named("logs"))
	defer logs.cancelAll()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		var seq uint64
		// Per session: a controller that restarted learns the current
		// progress on the first tick.
		var progress progressFilter
		// A new controller (or a new stream) learns the current view at once.
		first := s.gossipViewMsg()
		for {
			var msgs []*rdzvv1.ConnectRequest
			if first != nil {
				msgs, first = append(msgs, first), nil
			}
			select {
			case <-gctx.Done():
				return gctx.Err()
			case <-ticker.C:
				seq++
				sent.sending(seq, time.Now())
				msgs = append(msgs, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: seq}}})
				// Riding on the heartbeat bounds progress messages to one per
				// interval however often the workers report.
				if p := s.sup.Progress(); progress.changed(p) {
					msgs = append(msgs, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Progress{Progress: p}})
				}
			case st := <-s.sup.Updates():
				// Checkpoints queued before the workers exited go first: the
				// controller picks the one to resume from when it learns of
				// the exit.
				msgs = append(s.pendingCheckpoints(), &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_WorkerStatus{WorkerStatus: st}})
			case c := <-s.sup.Checkpoints():
				msgs = append(msgs, checkpointMsg(c))
			case m := <-out:
				msgs = append(msgs, m)
			case <-gossipChanged:
				msgs = append(msgs, s.gossipViewMsg())
			case f := <-s.agent.faults:
				msgs = append(msgs, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_GpuFault{GpuFault: f}})
			case f := <-s.farewells:
				if err := stream.Send(f.msg); err != nil {
					return fmt.Errorf("sending to controller: %w", err)
				}
				close(f.sent)
			}
			for _, m := range msgs {
				if err := stream.Send(m); err != nil {
					return fmt.Errorf("sending to controller: %w", err)
				}
			}
		}
	})
	g.Go(func() error {
		for {
			m, err := stream.Recv()
			if err != nil {
				return fmt.Errorf("receiving from controller: %w", err)
			}
			if ack := m.GetHeartbeatAck(); ack != nil {
				if at, ok := sent.acked(ack.GetSeq()); ok {
					s.heardAt(at)
				}
			}
			s.handle(gctx, m, out, logs)
		}
	})
	return g.Wait()
}

// pendingCheckpoints takes every checkpoint report queued so far.
func (s *agentSession) pendingCheckpoints() []*rdzvv1.ConnectRequest {
	var msgs []*rdzvv1.ConnectRequest
	for {
		select {
		case c := <-s.sup.Checkpoints():
			msgs = append(msgs, checkpointMsg(c))
		default:
			return msgs
		}
	}
}

func checkpointMsg(c *rdzvv1.CheckpointReport) *rdzvv1.ConnectRequest {
	return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Checkpoint{Checkpoint: c}}
}

func (s *agentSession) handle(ctx context.Context, m *rdzvv1.ConnectResponse, out chan<- *rdzvv1.ConnectRequest, logs *logTails) {
	switch msg := m.GetMsg().(type) {
	case *rdzvv1.ConnectResponse_Assignment:
		s.sup.Assign(msg.Assignment)
	case *rdzvv1.ConnectResponse_StopWorkers:
		s.sup.Stop(msg.StopWorkers.GetJob(), msg.StopWorkers.GetGeneration(), msg.StopWorkers.GetReason())
	case *rdzvv1.ConnectResponse_PortProbe:
		res := probePort(msg.PortProbe)
		select {
		case out <- &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_PortProbeResult{PortProbeResult: res}}:
		case <-ctx.Done():
		}
	case *rdzvv1.ConnectResponse_LogTail:
		logs.start(ctx, msg.LogTail)
	case *rdzvv1.ConnectResponse_LogCancel:
		logs.cancel(msg.LogCancel.GetRequestId())
	case *rdzvv1.ConnectResponse_HeartbeatAck:
		// Taken into account on arrival: see heardAt.
	case *rdzvv1.ConnectResponse_Registered:
		s.log.Warn("ignoring repeated registered message")
	default:
		s.log.Warn("ignoring unknown message from controller", zap.String("type", fmt.Sprintf("%T", m.GetMsg())))
	}
}

var errNoFreePort = errors.New("no free port")

func (s *agentSession) heardAt(at time.Time) { s.lastHeard.Store(at.UnixNano()) }

func (s *agentSession) gossipViewMsg() *rdzvv1.ConnectRequest {
	if s.gossip == nil {
		return nil
	}
	unreachable, alive := s.gossip.View()
	return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_GossipView{GossipView: &rdzvv1.GossipView{
		Unreachable: unreachable, AliveMembers: uint32(alive),
	}}}
}

// fenceLoop stops this node's workers when it is cut off, by health's
// SelfFence: the controller has not been heard for longer than it waits
// before declaring the node lost (so it has moved the job on, or will), and
// gossip cannot reach the peers either (so the controller is not merely
// restarting). A cut-off node must never keep training or write a
// checkpoint after the job moved on; when it is back it registers as a
// fresh, idle node.
func (s *agentSession) fenceLoop(ctx context.Context) {
	ticker := time.NewTicker(health.FenceCheckEvery)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		silent := time.Since(time.Unix(0, s.lastHeard.Load()))
		isolated := s.gossip == nil || s.gossip.Isolated()
		if !s.sup.Busy() || !s.heartbeat.Load().SelfFence(silent, isolated) || s.fencing.Swap(true) {
			continue
		}
		reason := fmt.Sprintf("self-fenced: controller silent for %s and peers unreachable", silent.Round(100*time.Millisecond))
		s.log.Warn("fencing own workers", zap.Duration("controller_silent", silent), zap.Bool("gossip", s.gossip != nil))
		s.sup.Fence(reason, func() { s.fencing.Store(false) })
	}
}
