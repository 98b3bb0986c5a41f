//go:build bench

package scale

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/rdzv/rdzv/agent"
	"github.com/rdzv/rdzv/agent/gpu"
	"github.com/rdzv/rdzv/agent/netif"
	"github.com/rdzv/rdzv/client"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// The simulated agent is agent/session.go's protocol without a supervisor:
// agent.agentSession drives a real Supervisor, which starts worker shims,
// owns a report endpoint and a state directory per node, and is not
// exported; 10,000 of those would measure the benchmark, not the
// controller. What the sim does share with the agent: the node description
// (agent.Agent.Describe over a simulated machine: gpu.Fake GPUs and the
// interfaces of a GPU node), the transport (package client, one connection
// per node, with the agent's keepalive parameters) and the message types.
// It answers like the supervisor does: RUNNING on an assignment, STOPPED on
// a stop order (at once: there is no torchrun to wait for), its running and
// recent workers when it registers again.

// The agent's reconnect backoff and keepalive (agent/session.go, agent.New).
const (
	simMinBackoff    = 250 * time.Millisecond
	simMaxBackoff    = 10 * time.Second
	simStableSession = 30 * time.Second
	simKeepalive     = 10 * time.Second
	simKeepaliveWait = 5 * time.Second
	// simAckWindow is the agent's ackWindow.
	simAckWindow = 64
)

// What the ledger counts.
type kind int

const (
	kindRegistered kind = iota // first registration of a sim
	kindAssignment             // an assignment arrived (by generation)
	kindStop                   // a stop order for running workers arrived (by generation)
	kindReconnect              // a session ended while the sim was not silenced
)

type ledgerKey struct {
	kind kind
	gen  uint64
}

// ledger is what all sims saw, for the phases to wait on and report.
type ledger struct {
	mu      sync.Mutex
	n       map[ledgerKey]int
	first   map[ledgerKey]time.Time
	last    map[ledgerKey]time.Time
	reasons map[string]int // why sessions ended, for the report
	// maxGap is the longest time between two heartbeats of one session
	// (nanoseconds) since takeGap: how late the sims themselves were, on a
	// machine they share with the controller.
	maxGap atomic.Int64
}

func (l *ledger) gap(d time.Duration) {
	for {
		cur := l.maxGap.Load()
		if int64(d) <= cur || l.maxGap.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

func (l *ledger) takeGap() time.Duration { return time.Duration(l.maxGap.Swap(0)) }

func newLedger() *ledger {
	return &ledger{n: map[ledgerKey]int{}, first: map[ledgerKey]time.Time{}, last: map[ledgerKey]time.Time{}, reasons: map[string]int{}}
}

func (l *ledger) add(k kind, gen uint64, at time.Time) {
	key := ledgerKey{k, gen}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n[key] == 0 || at.Before(l.first[key]) {
		l.first[key] = at
	}
	if at.After(l.last[key]) {
		l.last[key] = at
	}
	l.n[key]++
}

func (l *ledger) reason(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reasons[err.Error()]++
}

// get returns how many, and the first and last time.
func (l *ledger) get(k kind, gen uint64) (int, time.Time, time.Time) {
	key := ledgerKey{k, gen}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[key], l.first[key], l.last[key]
}

// simMachine is what a simulated GPU node looks like to the agent's
// discovery: the interfaces of a typical 8-GPU node, with the sim's own
// loopback address standing in for its Ethernet address.
type simMachine struct{ addr netip.Addr }

func (m simMachine) Interfaces() ([]netif.Interface, error) {
	ifaces := []netif.Interface{
		{Name: "lo", Index: 1, Kind: netif.KindLoopback, Up: true, MTU: 65536, Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")}},
		{Name: "eth0", Index: 2, Kind: netif.KindEthernet, Up: true, MTU: 1500, SpeedMbps: 25000, Addrs: []netip.Prefix{netip.PrefixFrom(m.addr, 8)}},
	}
	b := m.addr.As4()
	for i := range 8 {
		ifaces = append(ifaces, netif.Interface{
			Name: "ib" + strconv.Itoa(i), Index: 3 + i, Kind: netif.KindInfiniBand, Up: true, MTU: 4092, SpeedMbps: 400000,
			Addrs:       []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(100 + i), b[2], b[3]}), 16)},
			RDMADevices: []string{"mlx5_" + strconv.Itoa(i)},
		})
	}
	return ifaces, nil
}

func (m simMachine) DefaultRouteInterface() (string, error) { return "eth0", nil }
func (m simMachine) InterfaceFacing(string) (string, error) { return "eth0", nil }

// simAddr is sim i's source address: 127.20.0.1 upwards, skipping .0 and
// .255 so that no address looks like a network or broadcast address.
func simAddr(i int) netip.Addr {
	hi, lo := i/250, i%250+1
	return netip.AddrFrom4([4]byte{127, byte(20 + hi/256), byte(hi % 256), byte(lo)})
}

func simName(i int) string { return fmt.Sprintf("sim-%05d", i) }

// describe builds a sim's registration with the agent's own discovery.
func describe(ctx context.Context, name string, addr netip.Addr, controller string) (*rdzvv1.NodeInfo, error) {
	cfg := agent.DefaultConfig()
	cfg.Controller, cfg.NodeName, cfg.FakeGPUs, cfg.GossipPort, cfg.Insecure = controller, name, 8, -1, true
	cfg.HTTP.Listen = ""
	a, err := agent.New(cfg, zap.NewNop(), gpu.Fake{Count: cfg.FakeGPUs, Node: name}, simMachine{addr}, agent.ExecSpawner{})
	if err != nil {
		return nil, err
	}
	return a.Describe(ctx)
}

// sim is one simulated agent.
type sim struct {
	name string
	addr netip.Addr
	info *rdzvv1.NodeInfo
	cl   *client.Client
	led  *ledger
	// recording turns RTT collection on (the steady phase).
	recording *atomic.Bool

	// cancel silences the sim: its stream ends and it does not reconnect.
	cancel   context.CancelFunc
	silenced atomic.Bool
	done     chan struct{}

	mu         sync.Mutex
	registered bool
	lastGen    uint64                 // the newest generation assigned or stopped here (the supervisor's lastGen)
	cur        *rdzvv1.WorkerStatus   // the running workers, if any
	history    []*rdzvv1.WorkerStatus // recent outcomes, re-sent on registration
	rtts       []time.Duration
	// lastSent is when the sim last sent anything (unix nanoseconds): the
	// controller's last sight of a silenced sim is no earlier.
	lastSent atomic.Int64
}

func newSim(ctx context.Context, i int, controller string, cert tls.Certificate, roots *tls.Config, led *ledger, recording *atomic.Bool) (*sim, error) {
	s := &sim{name: simName(i), addr: simAddr(i), led: led, recording: recording, done: make(chan struct{})}
	var err error
	if s.info, err = describe(ctx, s.name, s.addr, controller); err != nil {
		return nil, fmt.Errorf("describing %s: %w", s.name, err)
	}
	tc := roots.Clone()
	tc.Certificates = []tls.Certificate{cert}
	local := &net.TCPAddr{IP: s.addr.AsSlice()}
	cc := client.DefaultConfig()
	cc.Endpoints = []string{controller}
	cc.TLS = &client.TLS{Config: tc}
	cc.DialOptions = []grpc.DialOption{
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: simKeepalive, Timeout: simKeepaliveWait, PermitWithoutStream: true}),
		// Its own source address, as if from its own host: Linux routes all
		// of 127.0.0.0/8 to lo.
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: local}
			return d.DialContext(ctx, "tcp", addr)
		}),
	}
	if s.cl, err = client.New(cc); err != nil {
		return nil, fmt.Errorf("client of %s: %w", s.name, err)
	}
	return s, nil
}

// start runs the sim until ctx ends or it is silenced.
func (s *sim) start(ctx context.Context) {
	ctx, s.cancel = context.WithCancel(ctx)
	go func() {
		defer close(s.done)
		defer s.cl.Close()
		s.loop(ctx)
	}()
}

// silence stops the sim's heartbeats and drops its stream, as a node that
// died would; it returns when the sim has stopped.
func (s *sim) silence() {
	s.silenced.Store(true)
	s.cancel()
	<-s.done
}

func (s *sim) stop() {
	if s.cancel != nil {
		s.cancel()
		<-s.done
	}
}

// loop is the agent's reconnect loop: jittered exponential backoff,
// reset after a stable session.
func (s *sim) loop(ctx context.Context) {
	backoff := simMinBackoff
	for ctx.Err() == nil {
		started := time.Now()
		err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		s.led.add(kindReconnect, 0, time.Now())
		s.led.reason(err)
		if time.Since(started) > simStableSession {
			backoff = simMinBackoff
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		}
		backoff = min(backoff*2, simMaxBackoff)
	}
}

func (s *sim) session(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.cl.Connect(ctx)
	if err != nil {
		return fmt.Errorf("opening stream: %w", err)
	}
	if err := stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: &rdzvv1.Register{Node: s.info, Workers: s.statuses()}}}); err != nil {
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
	s.mu.Lock()
	firstTime := !s.registered
	s.registered = true
	s.mu.Unlock()
	if firstTime {
		s.led.add(kindRegistered, 0, time.Now())
	}
	interval := time.Duration(reg.GetHeartbeatIntervalMs()) * time.Millisecond

	// Only the sender calls stream.Send after registration, as in the agent.
	out := make(chan *rdzvv1.ConnectRequest, 256)
	var sent [simAckWindow]struct {
		seq uint64
		at  time.Time
	}
	var sentMu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		var seq uint64
		last := time.Now()
		for {
			var m *rdzvv1.ConnectRequest
			select {
			case <-gctx.Done():
				return gctx.Err()
			case now := <-ticker.C:
				s.led.gap(time.Since(last))
				last = now
				seq++
				sentMu.Lock()
				sent[seq%simAckWindow].seq, sent[seq%simAckWindow].at = seq, time.Now()
				sentMu.Unlock()
				m = &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: seq}}}
			case m = <-out:
			}
			if err := stream.Send(m); err != nil {
				return fmt.Errorf("sending to controller: %w", err)
			}
			s.lastSent.Store(time.Now().UnixNano())
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
				sentMu.Lock()
				e := sent[seq%simAckWindow]
				sentMu.Unlock()
				if e.seq == seq && s.recording.Load() {
					s.mu.Lock()
					s.rtts = append(s.rtts, now.Sub(e.at))
					s.mu.Unlock()
				}
			case *rdzvv1.ConnectResponse_Assignment:
				replies = s.assign(msg.Assignment, now)
			case *rdzvv1.ConnectResponse_StopWorkers:
				replies = s.stopWorkers(msg.StopWorkers, now)
			case *rdzvv1.ConnectResponse_PortProbe:
				replies = append(replies, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_PortProbeResult{PortProbeResult: s.probePort(msg.PortProbe)}})
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

// statuses is what the sim runs and recently ran (Supervisor.Statuses).
func (s *sim) statuses() []*rdzvv1.WorkerStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := append([]*rdzvv1.WorkerStatus(nil), s.history...)
	if s.cur != nil {
		out = append(out, s.cur)
	}
	return out
}

// finishedLocked records an outcome as the supervisor does.
func (s *sim) finishedLocked(st *rdzvv1.WorkerStatus) {
	s.history = append(s.history, st)
	if len(s.history) > 4 {
		s.history = s.history[len(s.history)-4:]
	}
}

// assign is Supervisor.assign: a stale generation is ignored, running
// workers of another generation are stopped first, and the new ones run.
func (s *sim) assign(a *rdzvv1.Assignment, now time.Time) []*rdzvv1.ConnectRequest {
	job, gen := a.GetSpec().GetName(), a.GetGeneration()
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen <= s.lastGen {
		return nil
	}
	var out []*rdzvv1.ConnectRequest
	if s.cur != nil {
		st := &rdzvv1.WorkerStatus{Job: s.cur.GetJob(), Generation: s.cur.GetGeneration(), State: rdzvv1.WorkerState_WORKER_STATE_STOPPED,
			Message: fmt.Sprintf("replaced by generation %d of job %s", gen, job)}
		s.finishedLocked(st)
		out = append(out, statusMsg(st))
	}
	s.lastGen = gen
	s.cur = &rdzvv1.WorkerStatus{Job: job, Generation: gen, State: rdzvv1.WorkerState_WORKER_STATE_RUNNING}
	s.led.add(kindAssignment, gen, now)
	return append(out, statusMsg(s.cur))
}

// stopWorkers is Supervisor.stop.
func (s *sim) stopWorkers(st *rdzvv1.StopWorkers, now time.Time) []*rdzvv1.ConnectRequest {
	job, gen := st.GetJob(), st.GetGeneration()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastGen = max(s.lastGen, gen)
	if c := s.cur; c != nil && c.GetJob() == job && c.GetGeneration() == gen {
		s.cur = nil
		done := &rdzvv1.WorkerStatus{Job: job, Generation: gen, State: rdzvv1.WorkerState_WORKER_STATE_STOPPED, Message: st.GetReason()}
		s.finishedLocked(done)
		s.led.add(kindStop, gen, now)
		return []*rdzvv1.ConnectRequest{statusMsg(done)}
	}
	for i := len(s.history) - 1; i >= 0; i-- {
		if h := s.history[i]; h.GetJob() == job && h.GetGeneration() == gen {
			return []*rdzvv1.ConnectRequest{statusMsg(h)}
		}
	}
	done := &rdzvv1.WorkerStatus{Job: job, Generation: gen, State: rdzvv1.WorkerState_WORKER_STATE_STOPPED, Message: "not running on this node: " + st.GetReason()}
	s.finishedLocked(done)
	return []*rdzvv1.ConnectRequest{statusMsg(done)}
}

func statusMsg(st *rdzvv1.WorkerStatus) *rdzvv1.ConnectRequest {
	return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_WorkerStatus{WorkerStatus: st}}
}

// probePort finds a port in the range that binds on the sim's address, as
// the agent's probe does on its own.
func (s *sim) probePort(req *rdzvv1.PortProbe) *rdzvv1.PortProbeResult {
	res := &rdzvv1.PortProbeResult{RequestId: req.GetRequestId()}
	for port := req.GetPortMin(); port <= req.GetPortMax() && port-req.GetPortMin() < 64; port++ {
		l, err := net.Listen("tcp", net.JoinHostPort(s.addr.String(), strconv.Itoa(int(port))))
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

// takeRTTs returns and clears the recorded round trips.
func (s *sim) takeRTTs() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rtts
	s.rtts = nil
	return r
}
