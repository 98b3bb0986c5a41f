package controller

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// sendQueue bounds what may wait for one agent's stream. An agent that
// falls this far behind is disconnected and re-synchronises when it
// reconnects, so a stuck agent never blocks the controller.
const sendQueue = 256

// session is one connected agent stream.
type session struct {
	node     string
	out      chan *rdzvv1.ConnectResponse
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
	// lastHeartbeat is when the previous heartbeat arrived; only the
	// stream's receiving goroutine uses it.
	lastHeartbeat time.Time
	// late (nanos) is how late the agent's heartbeats have recently been:
	// the worst gap beyond the interval, decaying by lateDecay per
	// heartbeat (health.Silence.Late). Written by the receiving goroutine,
	// read by liveness passes.
	late atomic.Int64

	mu sync.Mutex
	// pending routes replies (port probe results, log chunks) by request id.
	pending map[string]chan *rdzvv1.ConnectRequest
}

func newSession(parent context.Context, node string, now time.Time) *session {
	ctx, cancel := context.WithCancel(parent)
	s := &session{node: node, out: make(chan *rdzvv1.ConnectResponse, sendQueue), ctx: ctx, cancel: cancel, pending: map[string]chan *rdzvv1.ConnectRequest{}}
	s.touch(now)
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

// lateness is health.Silence.Late of the session's agent.
func (s *session) lateness() time.Duration { return time.Duration(s.late.Load()) }

// send queues a message without blocking; a full queue ends the session.
func (s *session) send(m *rdzvv1.ConnectResponse) bool {
	select {
	case <-s.ctx.Done():
		return false
	default:
	}
	select {
	case s.out <- m:
		return true
	default:
		s.cancel()
		return false
	}
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
