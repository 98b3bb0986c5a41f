package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/agent/gpu"
	"github.com/rdzv/rdzv/agent/netif"
	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/health"
	"github.com/rdzv/rdzv/internal/httpserve"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
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

// shutdownFlush bounds how long a stopping agent waits for its last worker
// reports to be sent.
const shutdownFlush = 2 * time.Second

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
	// client reaches the leading controller, with this node's certificate.
	client *client.Client
	// ready is closed once the agent supervises: leftover workers adopted,
	// their report endpoint open. Not registration, which waits for the
	// controller: a node must not count as failed to start, and be
	// restarted by systemd, through a controller outage.
	ready chan struct{}

	// metrics count what happens (metrics.go); registry is all the HTTP
	// listener exports; http is that listener, nil when off; run is what
	// the gauges and readiness read, once Run built it.
	metrics  *agentMetrics
	registry *prometheus.Registry
	http     *httpserve.Server
	run      atomic.Pointer[runState]
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
	a := &Agent{cfg: cfg, log: log, gpus: gpus, net: net, spawner: spawner, xids: xids, faults: make(chan *rdzvv1.GPUFault, faultQueue), ready: make(chan struct{}),
		metrics: newAgentMetrics(), registry: httpserve.NewRegistry()}
	for _, o := range opts {
		o(a)
	}
	a.registry.MustRegister(a.metrics.exits, a.metrics.gpuFaults, a.metrics.reports, agentCollector{stateDir: cfg.StateDir, run: &a.run})
	if cfg.HTTP.Enabled() {
		if a.http, err = httpserve.New(cfg.HTTP, a.registry, a.readiness, log.Named("http")); err != nil {
			return nil, err
		}
	}
	addrs, err := cfg.Controllers()
	if err != nil {
		return nil, err
	}
	cc := client.DefaultConfig()
	cc.Endpoints, cc.Insecure, cc.Logger = addrs, cfg.Insecure, log.Named("client")
	if cc.Relays, err = cfg.RelayAddrs(); err != nil {
		return nil, err
	}
	cc.DialOptions = []grpc.DialOption{grpc.WithKeepaliveParams(Keepalive)}
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
		cc.TLS = &client.TLS{Files: cfg.TLS, Identity: want}
	}
	if a.client, err = client.New(cc); err != nil {
		return nil, fmt.Errorf("loading the agent's tls files: %w", err)
	}
	return a, nil
}

// Ready is closed once the agent supervises its node (see Agent.ready).
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// Run discovers the node, then stays connected to the controller and runs
// what it is assigned until ctx ends; on the way out it stops its workers.
func (a *Agent) Run(ctx context.Context) error {
	// Metrics and health answer from the start: /readyz says why the
	// agent is not ready until it registers.
	if a.http != nil {
		stopHTTP, err := a.http.Start(ctx)
		if err != nil {
			return err
		}
		defer func() {
			if err := stopHTTP(); err != nil {
				a.log.Warn("http listener failed", zap.Error(err))
			}
		}()
	}
	info, err := a.Describe(ctx)
	if err != nil {
		return err
	}
	log := a.log.With(zap.String("node", info.GetName()))
	log.Info("node discovered", zap.Int("gpus", len(info.GetGpus())), zap.Bool("fake_gpus", info.GetFakeGpus()),
		zap.String("interface", info.GetNcclInterface()), zap.String("address", info.GetAddress()),
		zap.String("reason", info.GetNcclInterfaceReason()))

	if a.cfg.Insecure {
		log.Warn("insecure mode: no tls; this node runs whatever anyone who can pose as the controller sends (use only for local tests)",
			zap.String("controller", a.cfg.Controller))
	}
	defer a.client.Close()

	// The GPU discoverers (NVML's, and the fake one of CPU test hosts) read
	// GPU state too; another discoverer gets no gpu checks.
	states, _ := a.gpus.(GPUStateReader)
	nodeHealth, err := NewNodeHealth(a.cfg, HealthEnv{
		SysfsRoot: "/sys", FS: SystemFS{}, GPUs: states, Interface: info.GetNcclInterface(),
		DiscoveredGPUs: len(info.GetGpus()), Clock: clockwork.NewRealClock(),
	}, log.Named("node_health"))
	if err != nil {
		return err
	}

	found, err := a.spawner.Adopt()
	if err != nil {
		return fmt.Errorf("adopting workers left by the previous agent: %w", err)
	}
	live := false
	for _, f := range found {
		live = live || f.Live
	}
	ln, err := listenReports(a.cfg.StateDir, live, log.Named("reports"))
	if err != nil {
		// Left as found: their shims keep them for the orphan timeout, for
		// an agent that can listen where they report.
		for _, f := range found {
			_ = f.Proc.Detach(0)
		}
		return err
	}
	sup := NewSupervisor(a.cfg, info.GetName(), info.GetNcclInterface(), ln.Addr().String(), a.spawner, log.Named("supervisor"))
	sup.SetHealthGate(nodeHealth.Gate)
	sup.exits = a.metrics.exits
	// Before the first registration, which reports them.
	sup.Adopt(found)
	// Registration carries the verdicts: a node never takes work before
	// its checks ran. After adoption: the shims wait for an agent only so
	// long.
	nodeHealth.Run(ctx)
	reports := newReportServer(sup, a.metrics.reports, log.Named("reports"))
	var gossip *Gossip
	if a.cfg.GossipPort >= 0 {
		if gossip, err = StartGossip(info.GetName(), info.GetAddress(), a.cfg.GossipPort, log.Named("gossip")); err != nil {
			return err
		}
		defer gossip.Close()
		info.GossipAddr = gossip.Addr()
	}
	var peers *peerServer
	var peerLn net.Listener
	if !a.cfg.Insecure && a.cfg.PeerPort >= 0 {
		if peers, peerLn, err = a.listenPeers(info, sup.mem, log.Named("peers")); err != nil {
			return err
		}
		info.PeerAddr = peerLn.Addr().String()
	}
	sess := newSession(info, sup, a.client, a.cfg.Controller, a.faults, gossip, log.Named("session"))
	sess.health = nodeHealth
	if l, ok := a.spawner.(leased); ok {
		sess.leases = l.LeaseHolder()
	}
	if a.cfg.Relays != "" {
		sess.relayReturn = a.cfg.RelayReturn.Duration
	}
	a.run.Store(&runState{sup: sup, sess: sess, gossip: gossip, gpus: len(info.GetGpus())})
	a.metrics.gpusFound(info.GetGpus())
	close(a.ready)
	// The session outlives ctx a little: on shutdown the supervisor first
	// stops the workers, and their final status should reach the controller
	// rather than leave it to notice a silent node.
	sessCtx, endSession := context.WithCancel(context.WithoutCancel(ctx))
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return reports.serve(ln) })
	if peers != nil {
		g.Go(func() error { return peers.serve(peerLn) })
		g.Go(func() error {
			<-gctx.Done()
			peers.shutdown()
			sup.mem.clients.closeAll()
			return nil
		})
	}
	g.Go(func() error {
		defer endSession()
		err := sup.Run(gctx)
		sess.flush(shutdownFlush)
		sess.end(shutdownFlush)
		// Only now: workers report until they are gone.
		reports.shutdown()
		return err
	})
	g.Go(func() error { sess.loop(sessCtx); return nil })
	g.Go(func() error { sess.fenceLoop(gctx); return nil })
	g.Go(func() error { nodeHealth.Loop(gctx); return nil })
	if a.health != nil {
		g.Go(func() error { a.watchHealth(gctx, log.Named("health")); return nil })
	}
	return g.Wait()
}

// reportAddrFile keeps the report endpoint's address across agent
// restarts: adopted workers still have it in RDZV_AGENT_ADDR.
const reportAddrFile = "report.addr"

// errReportAddrLost marks a recorded report address the agent cannot
// listen on again while adopted workers still report there.
var errReportAddrLost = errors.New("cannot listen on the recorded worker report address")

// listenReports opens the workers' report endpoint. Loopback only: workers
// report from this node. The OS picks the port the first time, so agents
// sharing a host cannot collide; later starts take the same one back. When
// that fails while adopted workers may still report (keep), the agent
// refuses to start: on another port, their reports, tokens included, would
// go to whoever holds the old one.
func listenReports(stateDir string, keep bool, log *zap.Logger) (net.Listener, error) {
	path := filepath.Join(stateDir, reportAddrFile)
	prev, err := os.ReadFile(path)
	switch {
	case err == nil:
		addr := strings.TrimSpace(string(prev))
		ln, err := listenLoopback(addr)
		if err == nil {
			return ln, nil
		}
		if keep {
			return nil, fmt.Errorf("%w %s (recorded in %s): %w; the workers adopted from the previous agent report there, so the agent does not move elsewhere: "+
				"stop whatever took the port and start the agent again, or stop those workers", errReportAddrLost, addr, path, err)
		}
		log.Warn("recorded worker report address unusable, no adopted workers report there, moving", zap.String("address", addr), zap.Error(err))
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("reading the worker report address: %w", err)
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

// listenLoopback listens on addr, a recorded report address, which must be
// a loopback one: the file is no way to open the endpoint to the network.
func listenLoopback(addr string) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("%q is not a loopback address", addr)
	}
	return net.Listen("tcp", addr)
}

// watchHealth forwards critical GPU faults; the controller cordons the node
// and moves its job on. A broken watcher is logged, not fatal: the node
// still runs work, and operators see why its health is not watched.
func (a *Agent) watchHealth(ctx context.Context, log *zap.Logger) {
	log.Info("watching gpu health", zap.Stringer("policy", a.xids))
	err := a.health.Watch(ctx, func(f health.Fault) {
		critical := a.xids.Critical(f)
		a.metrics.gpuFaults.WithLabelValues(strconv.FormatUint(uint64(f.GPUIndex), 10), strconv.FormatBool(critical)).Inc()
		if !critical {
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

// listenPeers opens the listener where agents exchange in-memory
// checkpoint shards (memckpt_peer.go), on the node's address, with the
// agent's own certificate and the cluster CA, and gives mem the way to
// dial its peers.
func (a *Agent) listenPeers(info *rdzvv1.NodeInfo, mem *memStore, log *zap.Logger) (*peerServer, net.Listener, error) {
	name := info.GetName()
	r, err := pki.NewReloader(a.cfg.TLS, func(id pki.Identity) error {
		if id != (pki.Identity{Role: pki.RoleAgent, Name: name}) {
			return fmt.Errorf("is the certificate of %s, but this is node %q", id, name)
		}
		return nil
	}, log.Named("tls"))
	if err != nil {
		return nil, nil, fmt.Errorf("loading the agent's tls files for its peers: %w", err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(info.GetAddress(), strconv.Itoa(a.cfg.PeerPort)))
	if err != nil {
		return nil, nil, fmt.Errorf("listening for agent peers (peer_port): %w", err)
	}
	mem.peerTLS = r.AgentPeerClientConfig
	return newPeerServer(mem, r.AgentPeerServerConfig(), log), ln, nil
}
