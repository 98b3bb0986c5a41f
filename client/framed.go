package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/wire"
)

// The keepalive of a framed stream: wire's, shortened by tests.
var keepaliveTime, keepaliveTimeout = wire.AgentKeepaliveTime, wire.AgentKeepaliveTimeout

// parkTTL bounds how long the connection of a stream that the relay ended
// waits for the client's next stream (park): longer than an agent's
// reconnect backoff (10 s at most), shorter than the relay waits for a
// register (wire.AgentIdleTimeout).
const parkTTL = 20 * time.Second

// parked is a connection to a relay between streams.
type parked struct {
	conn  *tls.Conn
	timer *time.Timer
}

// park keeps tc, whose stream the relay at addr ended, for the next
// stream there: when a controller restarts, every relayed agent's stream
// ends at once, and a new connection each, with its handshake, would slow
// the controller's own start.
func (c *Conn) park(addr string, tc *tls.Conn) {
	p := &parked{conn: tc}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.parked[addr]; old != nil && old.timer.Stop() {
		_ = old.conn.Close()
	}
	c.parked[addr] = p
	p.timer = time.AfterFunc(parkTTL, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.parked[addr] == p {
			delete(c.parked, addr)
			_ = tc.Close()
		}
	})
}

// unpark takes the connection parked for addr, if any.
func (c *Conn) unpark(addr string) *tls.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.parked[addr]
	if p == nil || !p.timer.Stop() {
		return nil
	}
	delete(c.parked, addr)
	return p.conn
}

// closeParked closes the connections parked; c.mu is held.
func (c *Conn) closeParked() {
	for addr, p := range c.parked {
		if p.timer.Stop() {
			_ = p.conn.Close()
		}
		delete(c.parked, addr)
	}
}

// stale says that a stream on a parked connection (reused) failed before
// anything arrived on it: the relay closed the connection meanwhile (it
// restarted, say), which says nothing of whether it serves now.
func stale(cs any, err error) bool {
	fs, ok := cs.(*framedStream)
	return ok && fs != nil && fs.reused && !fs.got && status.Code(err) == codes.Unavailable
}

// dialFramed opens an agent stream in frames (wire.AgentProtocol) to the
// relay at addr: on the connection parked for it, unless fresh, or on a
// new one, connected within relayConnectWait.
func (c *Conn) dialFramed(ctx context.Context, addr string, fresh bool) (*framedStream, error) {
	if !fresh {
		if tc := c.unpark(addr); tc != nil {
			s := newFramedStream(ctx, c, addr, tc)
			s.reused = true
			return s, nil
		}
	}
	conf, err := c.tlsFor(addr)
	if err != nil {
		return nil, err
	}
	conf.NextProtos = []string{wire.AgentProtocol}
	dctx, cancel := context.WithTimeout(ctx, relayConnectWait)
	defer cancel()
	raw, err := c.dial(dctx, addr)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "no connection to relay %s: %v", addr, err)
	}
	tc := tls.Client(raw, conf)
	if err := tc.HandshakeContext(dctx); err != nil {
		_ = raw.Close()
		return nil, status.Errorf(codes.Unavailable, "tls handshake with relay %s: %v", addr, err)
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != wire.AgentProtocol {
		_ = tc.Close()
		return nil, status.Errorf(codes.Unavailable, "relay %s chose protocol %q in the handshake, not %s", addr, p, wire.AgentProtocol)
	}
	return newFramedStream(ctx, c, addr, tc), nil
}

// framedStream is an agent stream in frames, as grpc.ClientStream: the
// agent's session code runs on it unchanged. Like a gRPC stream, one
// goroutine may send while another receives.
type framedStream struct {
	ctx  context.Context
	c    *Conn
	addr string
	conn *tls.Conn
	// reused says that conn carried a stream before (park); got, that a
	// frame arrived on this one (receiving side only).
	reused, got bool
	// unwatch undoes the close of conn when ctx ends.
	unwatch func() bool

	// wmu orders writes; buf is the frame being written.
	wmu sync.Mutex
	buf []byte

	// heard is when a frame last arrived (Unix nanoseconds); lapsed says
	// the keepalive gave the connection up.
	heard     atomic.Int64
	lapsed    atomic.Bool
	keepalive *time.Timer
	// every and timeout are the keepalive's.
	every, timeout time.Duration
	// over says the stream ended: the keepalive stops, and nothing more
	// is written, as the connection may carry the next. It is set under
	// wmu and life, which the keepalive's close holds.
	over atomic.Bool
	life sync.Mutex

	// ended is why the stream ended, once it did (receiving side only).
	ended error
}

func newFramedStream(ctx context.Context, c *Conn, addr string, tc *tls.Conn) *framedStream {
	s := &framedStream{ctx: ctx, c: c, addr: addr, conn: tc, every: keepaliveTime, timeout: keepaliveTimeout}
	s.heard.Store(time.Now().UnixNano())
	s.unwatch = context.AfterFunc(ctx, func() { _ = tc.Close() })
	s.keepalive = time.AfterFunc(s.every, s.checkAlive)
	return s
}

// checkAlive is the keepalive: a connection silent for every is pinged,
// and closed if it is still silent timeout later.
func (s *framedStream) checkAlive() {
	if s.over.Load() {
		return
	}
	heard := time.Unix(0, s.heard.Load())
	silent := time.Since(heard)
	if silent < s.every {
		s.keepalive.Reset(s.every - silent)
		return
	}
	// A write under way, stuck on a peer that does not read, is ended by
	// the close below; a ping behind it would wait with it.
	if s.wmu.TryLock() {
		if !s.over.Load() {
			_, _ = s.conn.Write(wire.AppendFrame(nil, wire.FramePing, nil))
		}
		s.wmu.Unlock()
	}
	time.AfterFunc(s.timeout, func() {
		if s.heard.Load() != heard.UnixNano() {
			s.checkAlive()
			return
		}
		s.life.Lock()
		defer s.life.Unlock()
		if !s.over.Load() { // not parked for the next stream
			s.lapsed.Store(true)
			_ = s.conn.Close()
		}
	})
}

func (s *framedStream) SendMsg(m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "a %T is not a protobuf message", m)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.over.Load() {
		return io.EOF
	}
	var err error
	if s.buf, err = wire.AppendMessage(s.buf[:0], pm); err != nil {
		return err
	}
	if _, err := s.conn.Write(s.buf); err != nil {
		// As gRPC's: the stream is over, and the receive says why.
		return io.EOF
	}
	return nil
}

func (s *framedStream) RecvMsg(m any) error {
	if s.ended != nil {
		return s.ended
	}
	for {
		kind, p, err := wire.ReadFrame(s.conn)
		if err != nil {
			return s.end(s.readError(err))
		}
		s.heard.Store(time.Now().UnixNano())
		s.got = true
		switch kind {
		case wire.FrameMessage:
			pm, ok := m.(proto.Message)
			if !ok {
				return s.end(status.Errorf(codes.Internal, "a %T is not a protobuf message", m))
			}
			if err := proto.Unmarshal(p, pm); err != nil {
				return s.end(status.Errorf(codes.Internal, "decoding a message from the relay: %v", err))
			}
			return nil
		case wire.FrameEnd:
			st, err := wire.EndStatus(p)
			if err != nil {
				return s.end(status.Error(codes.Internal, err.Error()))
			}
			if st.Code() == codes.OK {
				return s.end(io.EOF)
			}
			// Unavailable: the relay's call to the controller ended, and
			// the agent's next stream goes to the relay again, on this
			// connection. Other ends (a refused certificate, say) make a
			// new one.
			if st.Code() == codes.Unavailable {
				return s.endKeeping(st.Err())
			}
			return s.end(st.Err())
		case wire.FramePong:
		default:
			return s.end(status.Errorf(codes.Internal, "a frame of unknown kind %d from the relay", kind))
		}
	}
}

// readError is the status of a connection that failed under a receive.
func (s *framedStream) readError(err error) error {
	switch {
	case s.ctx.Err() != nil:
		return status.FromContextError(s.ctx.Err()).Err()
	case s.lapsed.Load():
		return status.Errorf(codes.Unavailable, "relay %s silent for %s", s.conn.RemoteAddr(), s.every+s.timeout)
	case errors.Is(err, io.EOF):
		return status.Errorf(codes.Unavailable, "relay %s closed the connection", s.conn.RemoteAddr())
	}
	return status.Errorf(codes.Unavailable, "relay %s: %v", s.conn.RemoteAddr(), err)
}

// end records why the stream ended and closes its connection.
func (s *framedStream) end(why error) error {
	s.stop(why)
	s.unwatch()
	_ = s.conn.Close()
	return why
}

// endKeeping is end, the connection parked for the next stream.
func (s *framedStream) endKeeping(why error) error {
	s.stop(why)
	if !s.unwatch() { // ctx ended: closed
		return why
	}
	s.c.park(s.addr, s.conn)
	return why
}

func (s *framedStream) stop(why error) {
	s.ended = why
	s.wmu.Lock()
	s.life.Lock()
	s.over.Store(true)
	s.life.Unlock()
	s.wmu.Unlock()
	s.keepalive.Stop()
}

// CloseSend tells the relay that the agent sends no more.
func (s *framedStream) CloseSend() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.over.Load() {
		return nil
	}
	if err := s.conn.CloseWrite(); err != nil {
		return fmt.Errorf("closing the stream to the relay: %w", err)
	}
	return nil
}

func (s *framedStream) Header() (metadata.MD, error) { return nil, nil }
func (s *framedStream) Trailer() metadata.MD         { return nil }
func (s *framedStream) Context() context.Context     { return s.ctx }

// defaultDial dials addr over TCP.
func defaultDial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}
