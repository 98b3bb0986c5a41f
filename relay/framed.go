package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// handshakeTimeout bounds a connection's TLS handshake, as gRPC's own
// connection timeout does for its server: an agent's handshake takes
// milliseconds, even when a whole cluster connects at once.
const handshakeTimeout = 20 * time.Second

// writeTimeout bounds one write to a framed agent: an agent that does not
// read for this long is given up, as one that falls agentBuffer messages
// behind is.
const writeTimeout = 10 * time.Second

// accept takes connections until ctx ends, each to its handshake.
func (r *Relay) accept(ctx context.Context, conf *tls.Config) error {
	var pause time.Duration
	for {
		c, err := r.lis.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Out of file descriptors, say: as gRPC's server does, wait a
			// little longer each time rather than spin.
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			r.log.Warn("accepting a connection failed", zap.Error(err), zap.Duration("retry_in", pause))
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(pause):
			}
			continue
		}
		pause = 0
		r.conns.Add(1)
		go func() {
			defer r.conns.Done()
			r.handshake(ctx, c, conf)
		}()
	}
}

// handshake makes c's TLS handshake, then serves the agent. The
// handshake admits only a verified agent certificate (Run) that chose
// wire.AgentProtocol: a client that offered another protocol fails it, one
// that offered none is refused here.
func (r *Relay) handshake(ctx context.Context, c net.Conn, conf *tls.Config) {
	tc := tls.Server(c, conf)
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	err := tc.HandshakeContext(hctx)
	cancel()
	if err == nil && tc.ConnectionState().NegotiatedProtocol != wire.AgentProtocol {
		err = fmt.Errorf("the client did not choose %s in the handshake", wire.AgentProtocol)
	}
	if err != nil {
		r.refused(refusedHandshake, c.RemoteAddr().String(), err)
		_ = c.Close()
		return
	}
	r.serveAgent(ctx, tc)
}

// agentConn is an agent's connection in frames (wire.AgentProtocol): its
// streams, one after the other. One goroutine reads it (read); what goes
// to the agent is written by a goroutine started when something waits
// (wake) and gone when nothing does. A stream's end leaves the connection
// open for the agent's next register: when the controller restarts, every
// agent's stream ends at once, and a new connection each, with its
// handshake, would slow the controller's own start. The connection is
// closed when the agent closes it, falls
// silent for wire.AgentIdleTimeout, or breaks the framing.
type agentConn struct {
	r   *Relay
	ctx context.Context
	// conn is the agent's TLS connection, chain the certificates its
	// handshake verified.
	conn  net.Conn
	chain []*x509.Certificate
	// unwatch undoes the close of conn at the relay's shutdown (close).
	unwatch func() bool

	// opened says that a stream was opened on the connection (read only).
	opened bool

	// mu guards cur and pongs.
	mu sync.Mutex
	// cur is the stream under way, nil between streams.
	cur *connStream
	// pongs is how many pings wait for their answer.
	pongs int
	// out is the writer's turn (write, started on demand by wake): an item
	// waiting says that something may be there to write, so one is
	// enough, and a wake that finds it full has been heard already.
	out *wire.Queue[struct{}]
}

// connStream is one stream of an agentConn.
type connStream struct {
	as *agentStream
	// cancel ends the wait for a call (await).
	cancel context.CancelFunc
	// opened is closed once the stream is on a call, cl, or was refused,
	// with cl nil.
	opened chan struct{}
	cl     *call
}

// serveAgent serves an agent's connection until it ends.
func (r *Relay) serveAgent(ctx context.Context, tc *tls.Conn) {
	ac := newAgentConn(ctx, r, tc, tc.ConnectionState().PeerCertificates)
	ac.unwatch = context.AfterFunc(ctx, func() { _ = tc.Close() })
	ac.read()
}

func newAgentConn(ctx context.Context, r *Relay, conn net.Conn, chain []*x509.Certificate) *agentConn {
	return &agentConn{r: r, ctx: ctx, conn: conn, chain: chain, out: wire.NewQueue[struct{}](1)}
}

// read serves the agent's frames until its connection ends: a register
// between streams opens the next, a message is the stream's, a ping is
// answered. It then ends the stream under way and closes the connection.
//
// While no stream is under way (before the first register, and between
// streams) the agent is not admitted: its frames are bounded by
// wire.MaxRegisterFrameBytes, and nothing it sends, pings included, moves
// the read deadline, so it is closed AgentIdleTimeout after it went
// between streams (or connected) unless it registers. A stream's frames
// move the deadline, once a second at most.
func (ac *agentConn) read() {
	defer ac.close()
	var extended time.Time
	idle := false
	for {
		st := ac.current()
		limit := wire.MaxFrameBytes
		switch now := time.Now(); {
		case st == nil:
			limit = wire.MaxRegisterFrameBytes
			if !idle {
				idle, extended = true, time.Time{}
				_ = ac.conn.SetReadDeadline(now.Add(wire.AgentIdleTimeout))
			}
		case now.Sub(extended) > time.Second:
			idle, extended = false, now
			_ = ac.conn.SetReadDeadline(now.Add(wire.AgentIdleTimeout))
		}
		kind, p, err := wire.ReadFrameUpTo(ac.conn, limit)
		if err != nil {
			why := fmt.Errorf("%w: %w", errAgentGone, err)
			if errors.Is(err, wire.ErrFrameTooLarge) {
				// The framing is lost; the agent learns why if it reads.
				why = status.Errorf(codes.ResourceExhausted, "relay: %v", err)
				ac.r.refused(refusedFrame, ac.conn.RemoteAddr().String(), err)
			}
			if st := ac.current(); st != nil {
				ac.end(st, why)
			} else if status.Code(why) == codes.ResourceExhausted {
				ac.goodbye(why)
			}
			return
		}
		switch kind {
		case wire.FramePing:
			ac.mu.Lock()
			ac.pongs++
			ac.mu.Unlock()
			ac.wake()
		case wire.FrameMessage:
			ac.message(p)
		default:
			if st := ac.current(); st != nil {
				ac.end(st, status.Errorf(codes.InvalidArgument, "relay: a frame of unknown kind %d", kind))
			}
		}
	}
}

// goodbye tells an agent with no stream under way why its connection
// closes, in one write that gives up at once on a peer that does not read.
// It takes the writer's turn, and keeps it: the connection closes next.
func (ac *agentConn) goodbye(why error) {
	if start, err := ac.out.Put(struct{}{}); err != nil || !start {
		return // a writer runs: its frames would interleave; the close says enough
	}
	_ = ac.conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = ac.conn.Write(wire.AppendEnd(nil, why))
}

func (ac *agentConn) current() *connStream {
	ac.mu.Lock()
	defer ac.mu.Unlock()
	return ac.cur
}

// message passes a message on to the stream under way, or opens the next
// stream with it, a register.
func (ac *agentConn) message(p []byte) {
	if st := ac.current(); st != nil {
		// The agent sends nothing but its register until it is
		// registered; this waits only for a misbehaving one.
		<-st.opened
		if st.cl == nil || st.ended() {
			return // sent before the agent learnt of the end
		}
		if err := st.cl.send(st.as, p); err != nil {
			st.cl.close(st.as, err)
		}
		return
	}
	var m rdzvv1.ConnectRequest
	err := proto.Unmarshal(p, &m)
	switch {
	case err != nil:
		err = status.Errorf(codes.InvalidArgument, "decoding the agent's register: %v", err)
	case m.GetRegister() == nil && !ac.opened:
		err = status.Error(codes.InvalidArgument, "the first message on an agent stream must be register")
	case m.GetRegister() == nil:
		// A message of the stream that ended, sent before the agent read
		// its end.
		return
	}
	ac.opened = true
	ctx, cancel := context.WithCancel(ac.ctx)
	st := &connStream{as: newAgentStream(ac.wake), cancel: cancel, opened: make(chan struct{})}
	ac.mu.Lock()
	ac.cur = st
	ac.mu.Unlock()
	if err != nil {
		ac.refuse(st, err)
		return
	}
	ac.r.conns.Add(1)
	go func() {
		defer ac.r.conns.Done()
		ac.open(ctx, st, m.GetRegister())
	}()
}

// open checks the agent's certificate again, at each stream, and opens
// st on the controller's call, waiting for one if need be.
func (ac *agentConn) open(ctx context.Context, st *connStream, reg *rdzvv1.Register) {
	err := ac.r.admit(ac.conn.RemoteAddr().String(), ac.chain)
	var cl *call
	if err == nil {
		cl, err = ac.r.uplink.await(ctx)
	}
	if err == nil {
		err = cl.open(st.as, ac.chain, reg)
	}
	if err != nil {
		ac.refuse(st, err)
		return
	}
	st.cl = cl
	ac.r.metrics.streams.Inc()
	close(st.opened)
}

// refuse ends st, which is on no call, with why.
func (ac *agentConn) refuse(st *connStream, why error) {
	st.as.stop(why)
	close(st.opened)
}

// close closes the connection, and undoes its close at the relay's
// shutdown.
func (ac *agentConn) close() {
	ac.unwatch()
	_ = ac.conn.Close()
}

// ended says whether the stream ended.
func (st *connStream) ended() bool {
	select {
	case <-st.as.gone:
		return true
	default:
		return false
	}
}

// end ends st from the relay's side, with why.
func (ac *agentConn) end(st *connStream, why error) {
	st.cancel() // a stream still waiting for a call waits no more
	<-st.opened
	if st.cl != nil {
		st.cl.close(st.as, why)
	} else {
		st.as.stop(why)
	}
}

// wake makes sure a writer runs.
func (ac *agentConn) wake() {
	// ErrQueueFull: a wake waits for the running writer already.
	if start, _ := ac.out.Put(struct{}{}); !start {
		return
	}
	ac.r.conns.Add(1)
	go func() {
		defer ac.r.conns.Done()
		ac.write()
	}()
}

// write sends what waits, in one TLS record, as long as it is woken; a
// stream that ended, once all it was sent is written, gets its end.
func (ac *agentConn) write() {
	var buf []byte
	for ac.out.TakeAll() != nil {
		ac.mu.Lock()
		pongs, st := ac.pongs, ac.cur
		ac.pongs = 0
		ac.mu.Unlock()
		buf = buf[:0]
		if st != nil {
			for _, m := range st.as.take() {
				buf = wire.AppendFrame(buf, wire.FrameMessage, m)
			}
		}
		for range pongs {
			buf = wire.AppendFrame(buf, wire.FramePong, nil)
		}
		if len(buf) > 0 {
			ac.send(buf)
		}
		if st == nil || !st.ended() {
			continue
		}
		ac.mu.Lock()
		last := ac.cur == st
		if last {
			// Between streams from now: the agent's next register, which
			// it sends once it read the end, opens the next.
			ac.cur = nil
		}
		ac.mu.Unlock()
		if last {
			ac.finish(st)
		}
	}
}

// send writes b; a connection that cannot be written to is closed, which
// ends its reading too.
func (ac *agentConn) send(b []byte) {
	_ = ac.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := ac.conn.Write(b); err != nil {
		ac.close()
		if st := ac.current(); st != nil {
			ac.end(st, status.Errorf(codes.Unavailable, "relay: writing to the agent: %v", err))
		}
	}
}

// finish sends the agent what the controller sent before st ended (a stop
// order, say) and the status st ended with.
func (ac *agentConn) finish(st *connStream) {
	<-st.opened
	why := st.as.why
	code := codes.OK
	if !errors.Is(why, errAgentGone) {
		code = status.Code(why)
		var b []byte
		for _, m := range st.as.take() {
			b = wire.AppendFrame(b, wire.FrameMessage, m)
		}
		ac.send(wire.AppendEnd(b, why))
	}
	st.cancel()
	if st.cl != nil {
		ac.r.metrics.streams.Dec()
	} else if code != codes.OK && code != codes.Unavailable {
		// Refused at its open (its certificate, its register): the
		// connection goes too. Unavailable (no controller served) keeps
		// it for the agent's next try, as the agent does.
		ac.close()
	}
	ac.r.metrics.ended.WithLabelValues(code.String()).Inc()
	ac.r.log.Debug("agent stream ended", zap.Stringer("peer", ac.conn.RemoteAddr()), zap.Error(why))
}
