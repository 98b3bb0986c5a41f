package controller

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// sendQueue bounds what may wait for one agent's stream. An agent that
// falls this far behind is disconnected and re-synchronises when it
// reconnects, so a stuck agent never blocks the controller.
const sendQueue = wire.AgentBacklog

// sender is the sending half of an agent stream.
type sender interface {
	Send(*rdzvv1.ConnectResponse) error
}

// session is one connected agent stream.
type session struct {
	node     string
	ctx      context.Context
	cancel   context.CancelFunc
	lastSeen atomic.Int64 // unix nanos of the last message from the agent
	// heartbeated is set at the stream's first heartbeat: until then the
	// controller has heard only the registration (health.Silence).
	heartbeated atomic.Bool
	// certNotAfter is when the agent's certificate expires (zero when
	// insecure); expiryWarned is set, under the controller's lock, once an
	// operator has been warned of it.
	certNotAfter time.Time
	expiryWarned bool
	// relayed is set when a relay carries the stream (carry.go).
	relayed bool
	// lastHeartbeat is when the previous heartbeat arrived; only the
	// stream's receiving goroutine uses it.
	lastHeartbeat time.Time
	// late (nanos) is how late the agent's heartbeats have recently been:
	// the worst gap beyond the interval, decaying by lateDecay per
	// heartbeat (health.Silence.Late). Written by the receiving goroutine,
	// read by liveness passes.
	late atomic.Int64
	// standbyReady is the job whose standby the agent's latest heartbeat
	// said is ready on the idle node (Heartbeat.standby_ready), "" for
	// none. Written by the receiving goroutine, read by scheduling passes.
	standbyReady atomic.Pointer[string]

	// mu guards pending and sendErr.
	mu sync.Mutex
	// pending routes replies (port probe results, log chunks) by request id.
	pending map[string]chan *rdzvv1.ConnectRequest

	// Sending has no goroutine of its own: whoever queues a message while
	// nobody sends starts a sender (out, on demand), which ends when the
	// queue is empty; the stream's receiver sends its heartbeat acks
	// itself when nobody does. A heartbeat then costs no hand-off between
	// goroutines, and an idle session keeps no sender's stack.
	stream sender
	clock  func() time.Time
	out    *wire.Queue[*rdzvv1.ConnectResponse]
	// sendErr is why sending failed; the session ends with it.
	sendErr error
}

// errSessionClosed refuses messages once the stream's handler is
// returning (close).
var errSessionClosed = errors.New("the agent's stream is closing")

func newSession(parent context.Context, node string, stream sender, clock func() time.Time) *session {
	ctx, cancel := context.WithCancel(parent)
	return sessionOn(ctx, cancel, node, stream, clock)
}

// sessionOn is a session that ends when ctx does, and ends ctx with
// cancel: for a context that is the session's alone already (a relayed
// stream's, carry.go), which spares a context and its parent's record of
// it per agent.
func sessionOn(ctx context.Context, cancel context.CancelFunc, node string, stream sender, clock func() time.Time) *session {
	s := &session{node: node, ctx: ctx, cancel: cancel, pending: map[string]chan *rdzvv1.ConnectRequest{}, stream: stream, clock: clock,
		out: wire.NewQueue[*rdzvv1.ConnectResponse](sendQueue)}
	s.touch(clock())
	return s
}

func (s *session) touch(now time.Time) { s.lastSeen.Store(now.UnixNano()) }

func (s *session) seen() time.Time { return time.Unix(0, s.lastSeen.Load()) }

// lateDecay is the part of the remembered lateness forgotten per heartbeat:
// a host that stopped being starved is punctual again within a minute or
// two of heartbeats, and one stall is remembered for about a minute.
const lateDecay = 16

// heartbeat records a heartbeat received at now and returns the gap since
// the previous one (zero for the first). Only the receiving goroutine
// calls it.
func (s *session) heartbeat(now time.Time, interval time.Duration) time.Duration {
	prev := s.lastHeartbeat
	s.lastHeartbeat = now
	if prev.IsZero() {
		return 0
	}
	gap := now.Sub(prev)
	late := time.Duration(s.late.Load())
	s.late.Store(int64(max(gap-interval, late-late/lateDecay, 0)))
	return gap
}

// readyStandby is the job whose standby the node keeps ready, "" for none.
func (s *session) readyStandby() string {
	if p := s.standbyReady.Load(); p != nil {
		return *p
	}
	return ""
}

// noteStandby records a heartbeat's standby_ready, allocating only when it
// changed: most heartbeats are of busy nodes and say none.
func (s *session) noteStandby(job string) {
	if s.readyStandby() != job {
		s.standbyReady.Store(&job)
	}
}

// lateness is health.Silence.Late of the session's agent.
func (s *session) lateness() time.Duration { return time.Duration(s.late.Load()) }

// send queues a message without blocking, and starts a sender if none
// runs; a full queue ends the session.
func (s *session) send(m *rdzvv1.ConnectResponse) bool {
	start, ok := s.enqueue(m)
	if start {
		go s.drain()
	}
	return ok
}

// sendNow sends m, and whatever is queued behind it, on the calling
// goroutine when nobody else is sending (the receiver's heartbeat acks);
// otherwise it queues m for the sender. It may block on the stream's flow
// control, as the receiver may.
func (s *session) sendNow(m *rdzvv1.ConnectResponse) bool {
	start, ok := s.enqueue(m)
	if start {
		s.drain()
	}
	return ok
}

// enqueue queues m; start says the caller is now the sender and must
// drain (nobody was sending). A full queue ends the session.
func (s *session) enqueue(m *rdzvv1.ConnectResponse) (start, ok bool) {
	if s.ctx.Err() != nil {
		return false, false
	}
	start, err := s.out.Put(m)
	if errors.Is(err, wire.ErrQueueFull) {
		s.cancel()
	}
	return start, err == nil
}

// drain sends what is queued, in order, until the queue is empty or the
// session ends; only the one sender runs it.
func (s *session) drain() {
	for {
		if s.ctx.Err() != nil {
			s.out.EndTurn()
			return
		}
		m, ok := s.out.Next()
		if !ok {
			return
		}
		if err := s.stream.Send(m); err != nil {
			s.mu.Lock()
			s.sendErr = err
			s.mu.Unlock()
			s.out.EndTurn()
			s.cancel()
			return
		}
		if m.GetRegistered() != nil {
			// The agent heartbeats only once it has this reply, so its
			// silence counts from when it could have it: behind a storm
			// of registrations, sending it may come seconds after the
			// node was registered.
			s.touch(s.clock())
		}
	}
}

// close refuses further messages and waits for a running sender to stop:
// gRPC forbids sending once the stream's handler has returned. A sender
// blocked on flow control holds it up, as it held the handler up when the
// handler sent.
func (s *session) close() { s.out.Close(errSessionClosed) }

// failed is why sending ended the session, if it did.
func (s *session) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sendErr
}

// expect registers a reply channel for request id.
func (s *session) expect(id string, buffer int) chan *rdzvv1.ConnectRequest {
	ch := make(chan *rdzvv1.ConnectRequest, buffer)
	s.mu.Lock()
	s.pending[id] = ch
	s.mu.Unlock()
	return ch
}

func (s *session) forget(id string) {
	s.mu.Lock()
	delete(s.pending, id)
	s.mu.Unlock()
}

// deliver routes a reply; a reply nobody waits for any more is dropped, and
// so is one whose reader has fallen behind (it sees the gap and gives up).
func (s *session) deliver(id string, m *rdzvv1.ConnectRequest) (delivered bool) {
	s.mu.Lock()
	ch, ok := s.pending[id]
	s.mu.Unlock()
	if !ok {
		return false
	}
	select {
	case ch <- m:
		return true
	default:
		return false
	}
}
