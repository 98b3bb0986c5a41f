package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/keepalive"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const (
	minBackoff = 250 * time.Millisecond
	// maxBackoff bounds how long a healthy agent takes to come back after a
	// controller outage (a restart, an upgrade, a failover): every node
	// registers again within it of the controller's return. A reconnect
	// resumes its TLS session, so thousands of them at once are cheap, and
	// a dial to a controller that is down costs a refused SYN.
	maxBackoff = 4 * time.Second
	// stableSession is how long a session must last before a disconnect is
	// treated as new trouble rather than a continuing outage.
	stableSession = 30 * time.Second
)

// Reconnect is the agent's reconnect backoff: jittered, doubling from
// minBackoff to maxBackoff, and back to the start after a session that
// lasted stableSession. Jitter keeps a cluster's agents from reconnecting
// in lockstep after a controller restart. Exported for test/sim, whose
// simulated agents must come back as the agent does. The zero value is
// ready to use.
type Reconnect struct{ backoff time.Duration }

// After is how long to wait before connecting again after a session that
// lasted lasted; fresh says the backoff started over (a stable session
// ended: new trouble, not a continuing outage).
func (r *Reconnect) After(lasted time.Duration) (wait time.Duration, fresh bool) {
	if r.backoff == 0 || lasted > stableSession {
		r.backoff, fresh = minBackoff, true
	}
	wait = r.backoff/2 + rand.N(r.backoff/2+1)
	r.backoff = min(r.backoff*2, maxBackoff)
	return wait, fresh
}

// Keepalive is the agent's gRPC keepalive: the stream lives for weeks, and
// keepalives find a dead connection even when nothing is sent.
var Keepalive = keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}

// agentSession keeps the agent connected to the leading controller,
// carries the supervisor's reports to it and its orders to the
// supervisor, and fences the workers when this node is cut off.
type agentSession struct {
	info *rdzvv1.NodeInfo
	sup  *Supervisor
	// client opens the stream on whichever controller leads (client.Client
	// follows the leader).
	client rdzvv1.AgentServiceClient
	// controllers is the configured address list, for log lines.
	controllers string
	// faults are critical GPU faults to report.
	faults <-chan *rdzvv1.GPUFault
	log    *zap.Logger
	// gossip is nil when disabled (gossip_port -1).
	gossip *Gossip
	// heartbeat is the controller's liveness timing as of the last
	// registration (health.Unregistered before the first): what
	// self-fencing goes by.
	heartbeat atomic.Pointer[health.Heartbeat]
	// lastHeard (nanoseconds on the boot clock, which wall clock changes
	// do not move) is when the controller last showed it hears us: the
	// sending of the latest heartbeat it acknowledged, or of the
	// registration it answered (see Acks).
	lastHeard atomic.Int64
	// leases, if the workers run under leases (ShimSpawner), is renewed by
	// fenceLoop once a controller has been heard (registered), and at once
	// whenever lastHeard moves (renew).
	leases     *Leases
	registered atomic.Bool
	renew      chan struct{}
	// connected is set while registered with a controller (readiness);
	// viaRelay while that registration went through a relay.
	connected, viaRelay atomic.Bool
	// fencing is set while a self-fencing stop is queued or under way.
	fencing atomic.Bool
	// health is the node health checks; nil in tests that need none.
	health *NodeHealth
	// relayReturn is how often, while direct although relays are
	// configured, the agent tries to come back through one (relay_return);
	// 0 never.
	relayReturn time.Duration
	// farewells carries the last word of an agent that leaves (see say);
	// unbuffered, so a send succeeds only while connected.
	farewells chan farewell
	// ending is set once the agent leaves (end): loop reconnects no more.
	// ended is closed when loop has returned.
	ending atomic.Bool
	ended  chan struct{}
}

func newSession(info *rdzvv1.NodeInfo, sup *Supervisor, client rdzvv1.AgentServiceClient, controllers string, faults <-chan *rdzvv1.GPUFault, gossip *Gossip, log *zap.Logger) *agentSession {
	s := &agentSession{info: info, sup: sup, client: client, controllers: controllers, faults: faults, gossip: gossip, log: log, farewells: make(chan farewell),
		renew: make(chan struct{}, 1), ended: make(chan struct{})}
	sup.OnHandover(s.announceRestart)
	s.heardAt(time.Now())
	unregistered := health.Unregistered
	s.heartbeat.Store(&unregistered)
	return s
}

// farewell is a last word for the send loop: msg, or when msg is nil
// every status update and checkpoint report queued so far; with end, the
// end of what this agent sends (CloseSend). sent is closed once it is on
// the stream.
type farewell struct {
	msg  *rdzvv1.ConnectRequest
	end  bool
	sent chan struct{}
}

// announceRestart tells the controller that this agent is exiting and its
// workers run on for hold; false if the controller could not be told, in
// which case it goes by heartbeats and the workers must not outlive them.
func (s *agentSession) announceRestart(hold time.Duration) bool {
	return s.say(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Restarting{
		Restarting: &rdzvv1.AgentRestarting{HoldMs: uint32(hold.Milliseconds())},
	}}, shutdownFlush)
}

// flush sends what the supervisor has queued (its workers' final status
// on shutdown), waiting up to timeout; false if it could not be sent.
func (s *agentSession) flush(timeout time.Duration) bool { return s.say(nil, timeout) }

// end closes the stream from this side, once what was said before is
// sent, and waits up to timeout for the controller to close its own: a
// message whose Send has returned may still be in the transport's buffers,
// and cancelling the stream drops it. An agent's last words (its restart
// announcement, its workers' final status) were lost so. From then on the
// session does not reconnect.
func (s *agentSession) end(timeout time.Duration) {
	s.ending.Store(true)
	if !s.connected.Load() {
		return // no stream to close; loop stops at its next turn
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case s.farewells <- farewell{end: true, sent: make(chan struct{})}:
	case <-s.ended:
		return
	case <-t.C:
		return
	}
	select {
	case <-s.ended:
	case <-t.C:
	}
}

// say hands msg (nil: the queued updates) to the send loop and waits up
// to timeout for it to be sent.
func (s *agentSession) say(msg *rdzvv1.ConnectRequest, timeout time.Duration) bool {
	f := farewell{sent: make(chan struct{}), msg: msg}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case s.farewells <- f:
	case <-t.C:
		return false
	}
	select {
	case <-f.sent:
		return true
	case <-t.C:
		return false
	}
}

// relayed is the part of client.Client that says whether a relay carries
// the stream.
type relayed interface{ Relayed() bool }

// loop connects, and reconnects with the Reconnect backoff, until ctx
// ends. Finding the leader among the controllers, and following a
// standby's redirect at once, is the client's part.
func (s *agentSession) loop(ctx context.Context) {
	defer close(s.ended)
	var backoff Reconnect
	failures := 0
	var next *opened
	for ctx.Err() == nil && !s.ending.Load() {
		started := time.Now()
		moved, err := s.connect(ctx, next)
		if next = moved; next != nil {
			s.log.Info("back through a relay, direct stream dropped")
			continue
		}
		if ctx.Err() != nil || s.ending.Load() {
			return
		}
		wait, fresh := backoff.After(time.Since(started))
		if fresh {
			failures = 0
		}
		failures++
		if failures == 1 || failures%10 == 0 {
			s.log.Warn("controller connection lost, reconnecting", zap.String("controller", s.controllers), zap.Error(err), zap.Int("attempt", failures), zap.Duration("backoff", wait))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// opened is a stream on which the controller registered this agent.
type opened struct {
	stream     rdzvv1.AgentService_ConnectClient
	registered *rdzvv1.Registered
	// registering is when the register was sent.
	registering time.Time
	viaRelay    bool
	cancel      context.CancelFunc
}

// open opens a stream under ctx and registers on it.
func (s *agentSession) open(ctx context.Context) (_ *opened, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		if err != nil {
			cancel()
		}
	}()
	stream, err := s.client.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("opening stream: %w", err)
	}
	reg := &rdzvv1.Register{Node: s.info, Workers: s.sup.Statuses(), Health: s.healthResults(), Memory: s.sup.mem.heldAll()}
	registering := time.Now()
	if err := stream.Send(&rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Register{Register: reg}}); err != nil {
		return nil, fmt.Errorf("sending register: %w", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("registering: %w", err)
	}
	o := &opened{stream: stream, registered: first.GetRegistered(), registering: registering, cancel: cancel}
	if r, ok := s.client.(relayed); ok {
		o.viaRelay = r.Relayed()
	}
	return o, nil
}

// relayTryTimeout bounds a try to come back through a relay
// (throughRelay), and so does a quarter of the heartbeat timeout: the
// heartbeats of the direct stream wait for it, and a relay that serves
// registers an agent in milliseconds.
const relayTryTimeout = time.Second

// throughRelay registers this agent through one of its relays, and only
// a relay (client.RelaysOnly), within timeout. It runs on the
// sending goroutine of the direct stream, so no report is taken from the
// supervisor meanwhile: the new registration carries them all, and the
// controller, which replaces the direct stream with this one, loses none.
func (s *agentSession) throughRelay(ctx context.Context, timeout time.Duration) (*opened, error) {
	tctx, cancel := context.WithCancel(client.RelaysOnly(ctx))
	timer := time.AfterFunc(timeout, cancel)
	o, err := s.open(tctx)
	if !timer.Stop() && err == nil {
		o.cancel()
		err = fmt.Errorf("no relay registered the agent within %s", timeout)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	stream := o.cancel
	o.cancel = func() { stream(); cancel() }
	return o, nil
}

// jittered is d give or take half: agents that went around the same relay
// do not all come back at once.
func jittered(d time.Duration) time.Duration { return d/2 + rand.N(d) }

// connect serves a stream until it ends: next's, or a new one if nil. It
// returns a stream to go on with at once (moved) when the agent came back
// through a relay (relayReturn), or why the stream ended.
func (s *agentSession) connect(ctx context.Context, next *opened) (moved *opened, _ error) {
	o := next
	if o == nil {
		var err error
		if o, err = s.open(ctx); err != nil {
			return nil, err
		}
	}
	defer o.cancel()
	stream, registered := o.stream, o.registered
	ms := func(v uint32) time.Duration { return time.Duration(v) * time.Millisecond }
	hb := s.heartbeat.Load().Learn(ms(registered.GetHeartbeatIntervalMs()), ms(registered.GetHeartbeatTimeoutMs()), ms(registered.GetVouchedTimeoutMs()))
	s.heartbeat.Store(&hb)
	interval := hb.Interval
	if registered.GetHeartbeatTimeoutMs() > 0 {
		// A crashed agent's workers must be gone before the controller gives
		// up on us.
		s.sup.SetOrphanTimeout(hb.OrphanTimeout())
	}
	s.heardAt(o.registering)
	s.registered.Store(true)
	s.connected.Store(true)
	defer s.connected.Store(false)
	s.viaRelay.Store(o.viaRelay)
	defer s.viaRelay.Store(false)
	s.log.Info("registered with controller", zap.Duration("heartbeat_interval", interval), zap.Duration("heartbeat_timeout", ms(registered.GetHeartbeatTimeoutMs())))
	var healthChanged <-chan struct{}
	if s.health != nil {
		healthChanged = s.health.Changed()
	}
	var gossipChanged <-chan struct{}
	if s.gossip != nil {
		gossipChanged = s.gossip.Changed()
		go s.gossip.Join(registered.GetGossipSeeds())
	}

	// Only the sender goroutine calls stream.Send after registration.
	out := make(chan *rdzvv1.ConnectRequest, 256)
	var sent Acks
	logs := newLogTails(s.sup, out, s.log.Named("logs"))
	defer logs.cancelAll()
	// Only while direct although relays are configured: try to come back
	// through one, now and then.
	var relayTry <-chan time.Time
	tryTimeout := relayTryTimeout
	if hb.Timeout > 0 {
		tryTimeout = min(tryTimeout, hb.Timeout/4)
	}
	if s.relayReturn > 0 && !o.viaRelay {
		t := time.NewTimer(jittered(s.relayReturn))
		defer t.Stop()
		relayTry = t.C
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		beat := NewBeat(interval)
		defer beat.Stop()
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
			case <-beat.C():
				beat.Next()
				seq++
				sent.Sending(seq, time.Now())
				hb := &rdzvv1.Heartbeat{Seq: seq, StandbyReady: s.sup.ReadyStandby()}
				msgs = append(msgs, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: hb}})
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
				// A start refused by the health gate: the controller learns
				// the verdict before the failure, so that it does not pick
				// the node again for the next round.
				select {
				case <-healthChanged:
					msgs = append([]*rdzvv1.ConnectRequest{s.healthMsg()}, msgs...)
				default:
				}
			case c := <-s.sup.Checkpoints():
				msgs = append(msgs, checkpointMsg(c))
			case m := <-out:
				msgs = append(msgs, m)
			case <-gossipChanged:
				msgs = append(msgs, s.gossipViewMsg())
			case <-healthChanged:
				msgs = append(msgs, s.healthMsg())
			case f := <-s.faults:
				msgs = append(msgs, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_GpuFault{GpuFault: f}})
			case f := <-s.farewells:
				if f.end {
					// The receiver goes on until the controller, having
					// read everything, ends the stream.
					close(f.sent)
					if err := stream.CloseSend(); err != nil {
						return fmt.Errorf("closing the stream to the controller: %w", err)
					}
					return nil
				}
				last := []*rdzvv1.ConnectRequest{f.msg}
				if f.msg == nil {
					last = s.queued()
				}
				for _, m := range last {
					if err := stream.Send(m); err != nil {
						return fmt.Errorf("sending to controller: %w", err)
					}
				}
				close(f.sent)
			case <-relayTry:
				back, err := s.throughRelay(ctx, tryTimeout)
				if err != nil {
					s.log.Debug("no relay serves, staying direct", zap.Error(err))
					relayTry = time.After(jittered(s.relayReturn))
					continue
				}
				// The controller replaced the direct stream with back
				// (the newer stream of a node wins); drop it.
				moved = back
				o.cancel()
				return errMoved
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
				if at, ok := sent.Acked(ack.GetSeq()); ok {
					s.heardAt(at)
				}
			}
			s.handle(gctx, m, out, logs)
		}
	})
	err := g.Wait()
	if moved != nil {
		return moved, nil
	}
	return nil, err
}

// errMoved ends the serving of a direct stream that a stream through a
// relay replaced.
var errMoved = errors.New("moved to a relay")

// queued takes every checkpoint report and status update queued so far,
// checkpoints first (as the loop sends them).
func (s *agentSession) queued() []*rdzvv1.ConnectRequest {
	msgs := s.pendingCheckpoints()
	for {
		select {
		case st := <-s.sup.Updates():
			msgs = append(msgs, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_WorkerStatus{WorkerStatus: st}})
		default:
			return msgs
		}
	}
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
		if s.gossip != nil {
			s.gossip.Watch(msg.Assignment.GetSpec().GetName(), msg.Assignment.GetGeneration(), msg.Assignment.GetWatch())
		}
		s.sup.Assign(msg.Assignment)
	case *rdzvv1.ConnectResponse_StopWorkers:
		s.sup.Ordered(msg.StopWorkers)
	case *rdzvv1.ConnectResponse_PrepareStandby:
		s.sup.PrepareStandby(msg.PrepareStandby)
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

// heardAt records at (a time.Now reading) as the last word from the
// controller, on the boot clock, and has the lease renewed from it.
func (s *agentSession) heardAt(at time.Time) {
	s.lastHeard.Store(int64(bootTime() - time.Since(at)))
	select {
	case s.renew <- struct{}{}:
	default:
	}
}

// silent is how long since the last word from the controller.
func (s *agentSession) silent() time.Duration {
	return bootTime() - time.Duration(s.lastHeard.Load())
}

// healthResults is the health verdicts to register with.
func (s *agentSession) healthResults() []*rdzvv1.HealthCheckResult {
	if s.health == nil {
		return nil
	}
	return healthProto(s.health.Results())
}

// healthMsg reports the verdicts, sent only when one changed.
func (s *agentSession) healthMsg() *rdzvv1.ConnectRequest {
	return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Health{Health: &rdzvv1.HealthReport{Results: s.healthResults()}}}
}

func (s *agentSession) gossipViewMsg() *rdzvv1.ConnectRequest {
	if s.gossip == nil {
		return nil
	}
	unreachable, alive := s.gossip.View()
	job, generation, down := s.gossip.WatchView()
	return &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_GossipView{GossipView: &rdzvv1.GossipView{
		Unreachable: unreachable, AliveMembers: uint32(alive),
		WatchJob: job, WatchGeneration: generation, WatchedUnreachable: down,
	}}}
}

// fenceLoop stops this node's workers when it is cut off, by health's
// SelfFence: the controller has not been heard for longer than it waits
// before declaring the node lost (so it has moved the job on, or will), and
// gossip cannot reach the peers either (so the controller is not merely
// restarting); sooner when none of the peers it watches answers, whose
// word the controller has then had. A cut-off node must never keep training or write a
// checkpoint after the job moved on; when it is back it registers as a
// fresh, idle node. On the same ticks, and whenever the controller is
// heard, it renews the workers' lease, which holds them to the same bound
// when this agent stops running.
func (s *agentSession) fenceLoop(ctx context.Context) {
	ticker := time.NewTicker(health.FenceCheckEvery)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.renew:
			s.renewLease()
			continue
		case <-ticker.C:
		}
		s.renewLease()
		silent := s.silent()
		cutoff := health.Cutoff{Isolated: true}
		if s.gossip != nil {
			cutoff = health.Cutoff{Isolated: s.gossip.Isolated(), Unwatched: s.gossip.Unwatched()}
		}
		if !s.sup.Busy() || !s.heartbeat.Load().SelfFence(silent, cutoff) || s.fencing.Swap(true) {
			continue
		}
		reason := fmt.Sprintf("self-fenced: controller silent for %s and peers unreachable", silent.Round(100*time.Millisecond))
		s.log.Warn("fencing own workers", zap.Duration("controller_silent", silent), zap.Bool("gossip", s.gossip != nil))
		s.sup.Fence(reason, func() { s.fencing.Store(false) })
	}
}

// renewLease grants the shims the lease health.LeaseUntil allows as of
// now: from the last word of a controller and, if this node watches peers,
// their latest answers, all on the boot clock. Before any controller has
// been heard there is no such word: the workers a previous agent left keep
// the lease it granted them.
func (s *agentSession) renewLease() {
	if s.leases == nil || !s.registered.Load() {
		return
	}
	heard := time.Unix(0, s.lastHeard.Load())
	var answered time.Time
	watching := false
	if s.gossip != nil {
		var at time.Time
		if at, watching = s.gossip.Answered(); !at.IsZero() {
			answered = time.Unix(0, int64(bootTime()-time.Since(at)))
		}
	}
	until := s.heartbeat.Load().LeaseUntil(heard, answered, watching)
	if until.IsZero() {
		return
	}
	s.leases.Renew(time.Duration(until.UnixNano()))
}
