package sim

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/rdzv/rdzv/agent"
	"github.com/rdzv/rdzv/agent/gpu"
	"github.com/rdzv/rdzv/agent/netif"
	"github.com/rdzv/rdzv/client"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// The simulated agent is agent/session.go's protocol without a supervisor:
// agent.agentSession drives a real Supervisor, which starts worker shims,
// owns a report endpoint and a state directory per node, and is not
// exported; 10,000 of those would measure the simulation, not the
// controller. What the simulation does share with the agent: the node
// description (agent.Agent.Describe over a simulated machine: gpu.Fake
// GPUs and the interfaces of a GPU node), the transport (package client,
// one connection per node, with the agent's keepalive), its reconnect
// backoff (agent.Reconnect), its window of heartbeats an acknowledgement
// may name (agent.Acks), how many finished workers it reports again when
// it registers (agent.HistorySize) and the message types. It answers like the supervisor does: RUNNING on an
// assignment, STOPPED on a stop order (at once: there is no torchrun to
// wait for), its running and recent workers when it registers again.

// EventKind says what an Event is.
type EventKind int

const (
	// Registered: a session got its Registered reply; First on the
	// agent's first.
	Registered EventKind = iota
	// Heartbeat: a heartbeat is about to be sent; Gap is the time since the
	// session's previous one (how late the simulation itself is).
	Heartbeat
	// HeartbeatAcked: the controller acknowledged a heartbeat this session
	// sent RTT ago.
	HeartbeatAcked
	// Assignment arrived; Taken unless it was stale (a generation no newer
	// than one this agent ran or was told to stop) and ignored.
	Assignment
	// StopOrder arrived; Taken when it ended running workers.
	StopOrder
	// WorkersEnded: the workers of Job and Gen stopped running here: by a
	// stop order, replaced by a newer generation, or with the node when it
	// was silenced.
	WorkersEnded
	// ReportAcked: the controller acknowledged Report (a worker status):
	// it acknowledged a heartbeat this session sent after it, and handles
	// a stream's messages in order.
	ReportAcked
	// SessionEnded: a session ended, with Err, while the agent was not
	// silenced or stopped.
	SessionEnded
	// Handshake: a TLS handshake with the controller finished; Resumed if
	// it resumed a session (no certificates exchanged).
	Handshake
)

// Event is something a simulated agent saw or did. Only the fields its
// Kind names are set.
type Event struct {
	Kind    EventKind
	Agent   *Agent
	At      time.Time
	First   bool          // Registered
	Gap     time.Duration // Heartbeat
	RTT     time.Duration // HeartbeatAcked
	Taken   bool          // Assignment, StopOrder
	Resumed bool          // Handshake
	// Job and Gen: Assignment, StopOrder, WorkersEnded, ReportAcked.
	Job        string
	Gen        uint64
	Assignment *rdzvv1.Assignment   // Assignment
	Stop       *rdzvv1.StopWorkers  // StopOrder
	Report     *rdzvv1.WorkerStatus // ReportAcked
	Err        error                // SessionEnded
}

// Observer is told every Event, synchronously from the agent's goroutines
// (sometimes under its lock): it must be safe for concurrent use, quick,
// and must not call the Agent back.
type Observer func(Event)

// Gate holds agents' new sessions while it is closed, so that a test sees
// a restarted controller before any agent reaches it. Open at first.
type Gate struct {
	mu   sync.Mutex
	open chan struct{} // closed while the gate is open
}

// NewGate returns an open gate.
func NewGate() *Gate {
	g := &Gate{open: make(chan struct{})}
	close(g.open)
	return g
}

// Close holds every session that starts from now on.
func (g *Gate) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

// Open lets the held sessions go.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

func (g *Gate) wait(ctx context.Context) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Machine is what a simulated GPU node looks like to the agent's
// discovery: the interfaces of a typical 8-GPU node, with the node's own
// loopback address standing in for its Ethernet address.
type Machine struct{ Addr netip.Addr }

// Interfaces implements the agent's view of the host's interfaces.
func (m Machine) Interfaces() ([]netif.Interface, error) {
	ifaces := []netif.Interface{
		{Name: "lo", Index: 1, Kind: netif.KindLoopback, Up: true, MTU: 65536, Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")}},
		{Name: "eth0", Index: 2, Kind: netif.KindEthernet, Up: true, MTU: 1500, SpeedMbps: 25000, Addrs: []netip.Prefix{netip.PrefixFrom(m.Addr, 8)}},
	}
	b := m.Addr.As4()
	for i := range 8 {
		ifaces = append(ifaces, netif.Interface{
			Name: "ib" + strconv.Itoa(i), Index: 3 + i, Kind: netif.KindInfiniBand, Up: true, MTU: 4092, SpeedMbps: 400000,
			Addrs:       []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + i), b[2], b[3]}), 16)},
			RDMADevices: []string{"mlx5_" + strconv.Itoa(i)},
		})
	}
	return ifaces, nil
}

// DefaultRouteInterface implements the agent's view of the routes.
func (m Machine) DefaultRouteInterface() (string, error) { return "eth0", nil }

// InterfaceFacing implements the agent's view of the routes.
func (m Machine) InterfaceFacing(string) (string, error) { return "eth0", nil }

// Addr is agent i's source address: 127.20.0.1 upwards, skipping .0 and
// .255 so that no address looks like a network or broadcast address.
func Addr(i int) netip.Addr {
	hi, lo := i/250, i%250+1
	return netip.AddrFrom4([4]byte{127, byte(20 + hi/256), byte(hi % 256), byte(lo)})
}

// Name is agent i's node name.
func Name(i int) string { return fmt.Sprintf("sim-%05d", i) }

// describe builds a node's registration with the agent's own discovery.
func describe(ctx context.Context, name string, addr netip.Addr, controller string) (*rdzvv1.NodeInfo, error) {
	cfg := agent.DefaultConfig()
	cfg.Controller, cfg.NodeName, cfg.FakeGPUs, cfg.GossipPort, cfg.Insecure = controller, name, 8, -1, true
	cfg.HTTP.Listen = ""
	a, err := agent.New(cfg, zap.NewNop(), gpu.Fake{Count: cfg.FakeGPUs, Node: name}, Machine{addr}, agent.ExecSpawner{})
	if err != nil {
		return nil, err
	}
	return a.Describe(ctx)
}

// AgentConfig is one simulated agent's.
type AgentConfig struct {
	// Index picks its name (Name) and source address (Addr).
	Index int
	// Controller is the controller's address.
	Controller string
	// Relay, if set, is a relay's address, tried before the controller as
	// the agent's relays setting does.
	Relay string
	// Cert is its agent certificate (Certs.Agents[Index]); Roots verifies
	// the controller.
	Cert  tls.Certificate
	Roots *tls.Config
	// Observe, if not nil, is told what it sees and does.
	Observe Observer
	// Gate, if not nil, holds its sessions while closed.
	Gate *Gate
	// Gossip makes the node say it runs gossip (on port 7946 of its
	// address). No memberlist runs: its peers never report it
	// unreachable, so the controller must assume they vouch for it.
	Gossip bool
}

// Agent is one simulated agent.
type Agent struct {
	name    string
	addr    netip.Addr
	info    *rdzvv1.NodeInfo
	cl      *client.Client
	observe Observer
	gate    *Gate

	// cancel silences the agent: its stream ends and it does not reconnect.
	cancel   context.CancelFunc
	silenced atomic.Bool
	done     chan struct{}

	mu         sync.Mutex
	registered bool
	lastGen    uint64                 // the newest generation assigned or stopped here (the supervisor's lastGen)
	cur        *rdzvv1.WorkerStatus   // the running workers, if any
	history    []*rdzvv1.WorkerStatus // recent outcomes, re-sent on registration
	// lastSent is when the agent last sent anything (unix nanoseconds): the
	// controller's last sight of a silenced agent is no earlier.
	lastSent atomic.Int64
}

// NewAgent builds an agent; Start runs it.
func NewAgent(ctx context.Context, cfg AgentConfig) (*Agent, error) {
	a := &Agent{name: Name(cfg.Index), addr: Addr(cfg.Index), observe: cfg.Observe, gate: cfg.Gate, done: make(chan struct{})}
	if a.observe == nil {
		a.observe = func(Event) {}
	}
	if a.gate == nil {
		a.gate = NewGate()
	}
	var err error
	if a.info, err = describe(ctx, a.name, a.addr, cfg.Controller); err != nil {
		return nil, fmt.Errorf("describing %s: %w", a.name, err)
	}
	if cfg.Gossip {
		a.info.GossipAddr = net.JoinHostPort(a.addr.String(), "7946")
	}
	tc := cfg.Roots.Clone()
	tc.Certificates = []tls.Certificate{cfg.Cert}
	// As the agent's own (pki.Reloader.ClientConfig): a reconnect resumes
	// its TLS session.
	tc.ClientSessionCache = tls.NewLRUClientSessionCache(1)
	own := tc.VerifyConnection
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		if own != nil {
			if err := own(cs); err != nil {
				return err
			}
		}
		a.observe(Event{Kind: Handshake, Agent: a, At: time.Now(), Resumed: cs.DidResume})
		return nil
	}
	local := &net.TCPAddr{IP: a.addr.AsSlice()}
	cc := client.DefaultConfig()
	cc.Endpoints = []string{cfg.Controller}
	if cfg.Relay != "" {
		cc.Relays = []string{cfg.Relay}
	}
	cc.TLS = &client.TLS{Config: tc}
	cc.DialOptions = []grpc.DialOption{grpc.WithKeepaliveParams(agent.Keepalive)}
	// Its own source address, as if from its own host: Linux routes all of
	// 127.0.0.0/8 to lo.
	cc.Dialer = func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: local}
		return d.DialContext(ctx, "tcp", addr)
	}
	if a.cl, err = client.New(cc); err != nil {
		return nil, fmt.Errorf("client of %s: %w", a.name, err)
	}
	return a, nil
}

// Via is the address that last served the agent: its relay's, or the
// controller's when it went around the relay.
func (a *Agent) Via() string { return a.cl.Leader() }

// Name is the agent's node name.
func (a *Agent) Name() string { return a.name }

// LastSent is when the agent last sent the controller anything.
func (a *Agent) LastSent() time.Time { return time.Unix(0, a.lastSent.Load()) }

// Running is the status of the workers running here, nil if none.
func (a *Agent) Running() *rdzvv1.WorkerStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cur
}

// Start runs the agent until ctx ends or it is silenced or stopped.
func (a *Agent) Start(ctx context.Context) {
	ctx, a.cancel = context.WithCancel(ctx)
	go func() {
		defer close(a.done)
		defer a.cl.Close()
		a.loop(ctx)
	}()
}

// Silence stops the agent's heartbeats and drops its stream, as a node that
// died would, its workers with it; it returns when the agent has stopped.
func (a *Agent) Silence() {
	// The workers end first, as with the node: nothing can have noticed
	// the node's silence before it is silent.
	a.mu.Lock()
	a.silenced.Store(true)
	if c := a.cur; c != nil {
		a.cur = nil
		a.observe(Event{Kind: WorkersEnded, Agent: a, At: time.Now(), Job: c.GetJob(), Gen: c.GetGeneration()})
	}
	a.mu.Unlock()
	a.cancel()
	<-a.done
}

// Stop ends the agent (if started) and waits for it.
func (a *Agent) Stop() {
	if a.cancel != nil {
		a.cancel()
		<-a.done
	}
}

// loop is the agent's reconnect loop, with the agent's backoff.
func (a *Agent) loop(ctx context.Context) {
	var backoff agent.Reconnect
	for a.gate.wait(ctx) == nil {
		started := time.Now()
		err := a.session(ctx)
		if ctx.Err() != nil {
			return
		}
		a.observe(Event{Kind: SessionEnded, Agent: a, At: time.Now(), Err: err})
		wait, _ := backoff.After(time.Since(started))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// unacked is a worker report waiting for the acknowledgement of heartbeat
// seq, the first sent after it.
type unacked struct {
	seq    uint64
	report *rdzvv1.WorkerStatus
}

func (a *Agent) session(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := a.cl.Connect(ctx)
	if err != nil {
		return fmt.Errorf("opening stream: %w", err)
	}
	workers := a.statuses()
	if err := stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: a.info, Workers: workers}}}); err != nil {
		return fmt.Errorf("sending register: %w", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("registering: %w", err)
	}
	reg := first.GetRegistered()
	if reg == nil {
		return errors.New("registering: the first message is not registered")
	}
	a.mu.Lock()
	firstTime := !a.registered
	a.registered = true
	a.mu.Unlock()
	a.observe(Event{Kind: Registered, Agent: a, At: time.Now(), First: firstTime})
	interval := time.Duration(reg.GetHeartbeatIntervalMs()) * time.Millisecond

	// Only the sender calls stream.Send after registration, as in the agent.
	out := make(chan *rdzvv1.ConnectRequest, 256)
	// What the sender sent and the acknowledgements have not covered yet:
	// the workers the registration reported first.
	var (
		sent    agent.Acks
		ackMu   sync.Mutex
		lastSeq uint64
		reports []unacked
	)
	for _, w := range workers {
		reports = append(reports, unacked{seq: 1, report: w})
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		beat := agent.NewBeat(interval)
		defer beat.Stop()
		last := time.Now()
		for {
			var m *rdzvv1.ConnectRequest
			select {
			case <-gctx.Done():
				return gctx.Err()
			case now := <-beat.C():
				beat.Next()
				a.observe(Event{Kind: Heartbeat, Agent: a, At: now, Gap: time.Since(last)})
				last = now
				ackMu.Lock()
				lastSeq++
				seq := lastSeq
				sent.Sending(seq, time.Now())
				ackMu.Unlock()
				m = &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: seq}}}
			case m = <-out:
				if st := m.GetWorkerStatus(); st != nil {
					ackMu.Lock()
					reports = append(reports, unacked{seq: lastSeq + 1, report: st})
					ackMu.Unlock()
				}
			}
			if err := stream.Send(m); err != nil {
				return fmt.Errorf("sending to controller: %w", err)
			}
			a.lastSent.Store(time.Now().UnixNano())
		}
	})
	g.Go(func() error {
		for {
			m, err := stream.Recv()
			if err != nil {
				return fmt.Errorf("receiving from controller: %w", err)
			}
			now := time.Now()
			var replies []*rdzvv1.ConnectRequest
			switch msg := m.GetMsg().(type) {
			case *rdzvv1.ConnectResponse_HeartbeatAck:
				seq := msg.HeartbeatAck.GetSeq()
				at, known := sent.Acked(seq)
				ackMu.Lock()
				var acked []*rdzvv1.WorkerStatus
				for len(reports) > 0 && reports[0].seq <= seq {
					acked = append(acked, reports[0].report)
					reports = reports[1:]
				}
				ackMu.Unlock()
				if known {
					a.observe(Event{Kind: HeartbeatAcked, Agent: a, At: now, RTT: now.Sub(at)})
				}
				for _, r := range acked {
					a.observe(Event{Kind: ReportAcked, Agent: a, At: now, Job: r.GetJob(), Gen: r.GetGeneration(), Report: r})
				}
			case *rdzvv1.ConnectResponse_Assignment:
				replies = a.assign(msg.Assignment, now)
			case *rdzvv1.ConnectResponse_StopWorkers:
				replies = a.stopWorkers(msg.StopWorkers, now)
			case *rdzvv1.ConnectResponse_PortProbe:
				replies = append(replies, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_PortProbeResult{PortProbeResult: a.probePort(msg.PortProbe)}})
			case *rdzvv1.ConnectResponse_LogTail:
				replies = append(replies, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_LogChunk{LogChunk: &rdzvv1.LogChunk{
					RequestId: msg.LogTail.GetRequestId(), Eof: true, Error: "a simulated agent keeps no logs",
				}}})
			}
			for _, r := range replies {
				select {
				case out <- r:
				case <-gctx.Done():
					return gctx.Err()
				}
			}
		}
	})
	return g.Wait()
}

// statuses is what the agent runs and recently ran (Supervisor.Statuses).
func (a *Agent) statuses() []*rdzvv1.WorkerStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := append([]*rdzvv1.WorkerStatus(nil), a.history...)
	if a.cur != nil {
		out = append(out, a.cur)
	}
	return out
}

// finishedLocked records an outcome as the supervisor does.
func (a *Agent) finishedLocked(st *rdzvv1.WorkerStatus) {
	a.history = append(a.history, st)
	if len(a.history) > agent.HistorySize {
		a.history = a.history[len(a.history)-agent.HistorySize:]
	}
}

// endedLocked ends the running workers with the outcome st.
func (a *Agent) endedLocked(st *rdzvv1.WorkerStatus, now time.Time) {
	a.cur = nil
	a.finishedLocked(st)
	a.observe(Event{Kind: WorkersEnded, Agent: a, At: now, Job: st.GetJob(), Gen: st.GetGeneration()})
}

// assign is Supervisor.assign: a stale generation is ignored, running
// workers of another generation are stopped first, and the new ones run.
func (a *Agent) assign(asg *rdzvv1.Assignment, now time.Time) []*rdzvv1.ConnectRequest {
	job, gen := asg.GetSpec().GetName(), asg.GetGeneration()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.silenced.Load() {
		return nil // a dead node's stream, not yet torn down
	}
	ev := Event{Kind: Assignment, Agent: a, At: now, Job: job, Gen: gen, Assignment: asg}
	if gen <= a.lastGen {
		a.observe(ev)
		return nil
	}
	var out []*rdzvv1.ConnectRequest
	if a.cur != nil {
		st := &rdzvv1.WorkerStatus{Job: a.cur.GetJob(), Generation: a.cur.GetGeneration(), State: rdzvv1.WorkerState_WORKER_STATE_STOPPED,
			Message: fmt.Sprintf("replaced by generation %d of job %s", gen, job)}
		a.endedLocked(st, now)
		out = append(out, statusMsg(st))
	}
	a.lastGen = gen
	a.cur = &rdzvv1.WorkerStatus{Job: job, Generation: gen, State: rdzvv1.WorkerState_WORKER_STATE_RUNNING}
	ev.Taken = true
	a.observe(ev)
	return append(out, statusMsg(a.cur))
}

// stopWorkers is Supervisor.stop.
func (a *Agent) stopWorkers(st *rdzvv1.StopWorkers, now time.Time) []*rdzvv1.ConnectRequest {
	job, gen := st.GetJob(), st.GetGeneration()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.silenced.Load() {
		return nil
	}
	ev := Event{Kind: StopOrder, Agent: a, At: now, Job: job, Gen: gen, Stop: st}
	a.lastGen = max(a.lastGen, gen)
	if c := a.cur; c != nil && c.GetJob() == job && c.GetGeneration() == gen {
		ev.Taken = true
		a.observe(ev)
		done := &rdzvv1.WorkerStatus{Job: job, Generation: gen, State: rdzvv1.WorkerState_WORKER_STATE_STOPPED, Message: st.GetReason()}
		a.endedLocked(done, now)
		return []*rdzvv1.ConnectRequest{statusMsg(done)}
	}
	a.observe(ev)
	for i := len(a.history) - 1; i >= 0; i-- {
		if h := a.history[i]; h.GetJob() == job && h.GetGeneration() == gen {
			return []*rdzvv1.ConnectRequest{statusMsg(h)}
		}
	}
	done := &rdzvv1.WorkerStatus{Job: job, Generation: gen, State: rdzvv1.WorkerState_WORKER_STATE_STOPPED, Message: "not running on this node: " + st.GetReason()}
	a.finishedLocked(done)
	return []*rdzvv1.ConnectRequest{statusMsg(done)}
}

func statusMsg(st *rdzvv1.WorkerStatus) *rdzvv1.ConnectRequest {
	return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_WorkerStatus{WorkerStatus: st}}
}

// probePort finds a port in the range that binds on the agent's address,
// as the agent's probe does on its own.
func (a *Agent) probePort(req *rdzvv1.PortProbe) *rdzvv1.PortProbeResult {
	res := &rdzvv1.PortProbeResult{RequestId: req.GetRequestId()}
	for port := req.GetPortMin(); port <= req.GetPortMax() && port-req.GetPortMin() < 64; port++ {
		l, err := net.Listen("tcp", net.JoinHostPort(a.addr.String(), strconv.Itoa(int(port))))
		if err != nil {
			continue
		}
		_ = l.Close()
		res.Port = port
		return res
	}
	res.Error = fmt.Sprintf("no free port in %d-%d", req.GetPortMin(), req.GetPortMax())
	return res
}
