package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// handshakeTimeout bounds a connection's TLS handshake, as gRPC's own
// connection timeout does for its server, but shorter: an agent's
// handshake takes milliseconds, even at a cold start of 10,000.
const handshakeTimeout = 20 * time.Second

// writeTimeout bounds one write to a framed agent: an agent that does not
// read for this long is given up, as one that falls agentBuffer messages
// behind is.
const writeTimeout = 10 * time.Second

// accept takes connections until ctx ends, each to its handshake.
func (r *Relay) accept(ctx context.Context, conf *tls.Config, h2 *grpcConns) error {
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
			r.handshake(ctx, c, conf, h2)
		}()
	}
}

// handshake makes c's TLS handshake, then serves an agent that speaks
// wire.AgentProtocol, and hands any other connection to gRPC's server.
func (r *Relay) handshake(ctx context.Context, c net.Conn, conf *tls.Config, h2 *grpcConns) {
	tc := tls.Server(c, conf)
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	err := tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		r.log.Debug("tls handshake failed", zap.Stringer("peer", c.RemoteAddr()), zap.Error(err))
		_ = c.Close()
		return
	}
	if tc.ConnectionState().NegotiatedProtocol != wire.AgentProtocol {
		h2.push(tc)
		return
	}
	r.serveFramed(ctx, tc)
}

// grpcConns is the listener of the relay's gRPC server: the connections
// whose handshake chose gRPC.
type grpcConns struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newGRPCConns(addr net.Addr) *grpcConns {
	return &grpcConns{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// push hands c to the server, or closes it once the server stopped.
func (l *grpcConns) push(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
		_ = c.Close()
	}
}

func (l *grpcConns) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *grpcConns) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *grpcConns) Addr() net.Addr { return l.addr }

// handshaked is the gRPC server's transport security for connections the
// relay has already made the TLS handshake of: it passes them on, with
// what the handshake established, which carry reads the agent's
// certificate chain from.
type handshaked struct{}

func (handshaked) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("the relay's agent server does not dial")
}

func (handshaked) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil, nil, fmt.Errorf("a %T, not a TLS connection", c)
	}
	return c, credentials.TLSInfo{State: tc.ConnectionState(), CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

func (handshaked) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (h handshaked) Clone() credentials.TransportCredentials { return h }

func (handshaked) OverrideServerName(string) error { return nil }

// agentConn is an agent's stream in frames (wire.AgentProtocol). One
// goroutine reads it (read); what goes to the agent is written by a
// goroutine started when something waits (wake) and gone when nothing
// does, which also ends the connection once the stream ended.
type agentConn struct {
	r      *Relay
	conn   *tls.Conn
	as     *agentStream
	cancel context.CancelFunc
	// unwatch undoes the close of conn at the relay's shutdown (close).
	unwatch func() bool

	// opened is closed once the stream is on a call, cl, or was refused,
	// with cl nil.
	opened chan struct{}
	cl     *call
	// reading says that read runs, set before opened is closed.
	reading bool

	mu sync.Mutex
	// writing says that a writer runs; woken, that it was woken since it
	// last looked.
	writing, woken bool
	pongs          int
}

// serveFramed admits the agent on tc and opens its stream on the
// controller's call.
func (r *Relay) serveFramed(ctx context.Context, tc *tls.Conn) {
	ctx, cancel := context.WithCancel(ctx)
	ac := &agentConn{r: r, conn: tc, cancel: cancel, opened: make(chan struct{})}
	ac.as = newAgentStream(ac.wake)
	ac.unwatch = context.AfterFunc(ctx, func() { _ = tc.Close() })
	chain := tc.ConnectionState().PeerCertificates
	// The register first: refused, the connection is closed after the
	// refusal is written, and a close with the register unread would
	// reset it, the refusal with it.
	reg, err := wire.RecvRegister(ac.recvRegister, registerTimeout)
	if err == nil {
		err = r.admit(tc.RemoteAddr().String(), chain)
	}
	if err != nil {
		ac.as.stop(err)
		close(ac.opened)
		return
	}
	ac.reading = true
	r.conns.Add(1)
	go func() {
		defer r.conns.Done()
		ac.read()
	}()
	cl, err := r.carrier.await(ctx)
	if err == nil {
		err = cl.open(ac.as, chain, reg)
	}
	if err != nil {
		ac.as.stop(err)
	} else {
		ac.cl = cl
		r.metrics.streams.Inc()
	}
	close(ac.opened)
}

// recvRegister reads the agent's first message.
func (ac *agentConn) recvRegister() (*rdzvv1.ConnectRequest, error) {
	kind, p, err := wire.ReadFrame(ac.conn)
	if err != nil {
		return nil, err
	}
	if kind != wire.FrameMessage {
		return nil, status.Errorf(codes.InvalidArgument, "the first frame on an agent stream must be a message, not of kind %d", kind)
	}
	var m rdzvv1.ConnectRequest
	if err := proto.Unmarshal(p, &m); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "decoding the agent's first message: %v", err)
	}
	return &m, nil
}

// read passes the agent's messages on until its connection ends, and
// answers its pings. Once the stream ended, it reads what the agent sent
// meanwhile, until the agent closes the connection (finish), and closes
// it: a connection closed with data unread is reset, and the agent would
// lose the status the stream ended with.
func (ac *agentConn) read() {
	defer ac.close()
	var extended time.Time
	for {
		// The deadline moves once a second, not once a message, and not
		// once the stream ended.
		if now := time.Now(); now.Sub(extended) > time.Second && !ac.ended() {
			extended = now
			_ = ac.conn.SetReadDeadline(now.Add(wire.AgentIdleTimeout))
		}
		kind, p, err := wire.ReadFrame(ac.conn)
		switch {
		case errors.Is(err, wire.ErrFrameTooLarge):
			ac.end(status.Errorf(codes.ResourceExhausted, "relay: %v", err))
			return
		case err != nil:
			ac.end(fmt.Errorf("%w: %w", errAgentGone, err))
			return
		}
		switch kind {
		case wire.FramePing:
			ac.mu.Lock()
			ac.pongs++
			ac.mu.Unlock()
			ac.wake()
		case wire.FrameMessage:
			// The agent sends nothing but its register until it is
			// registered; this waits only for a misbehaving one.
			<-ac.opened
			if ac.cl == nil || ac.ended() {
				continue // sent before the agent learnt of the end
			}
			if err := ac.cl.send(ac.as, p); err != nil {
				ac.as.stop(err)
			}
		default:
			ac.end(status.Errorf(codes.InvalidArgument, "relay: a frame of unknown kind %d", kind))
			return
		}
	}
}

// close closes the connection, and undoes its close at the relay's
// shutdown.
func (ac *agentConn) close() {
	ac.unwatch()
	_ = ac.conn.Close()
}

// ended says whether the stream ended.
func (ac *agentConn) ended() bool {
	select {
	case <-ac.as.gone:
		return true
	default:
		return false
	}
}

// end ends the stream from the relay's side, with why.
func (ac *agentConn) end(why error) {
	ac.cancel() // a stream still waiting for a call waits no more
	<-ac.opened
	if ac.cl != nil {
		ac.cl.close(ac.as, why)
	} else {
		ac.as.stop(why)
	}
}

// wake makes sure a writer runs.
func (ac *agentConn) wake() {
	ac.mu.Lock()
	if ac.writing {
		ac.woken = true
		ac.mu.Unlock()
		return
	}
	ac.writing = true
	ac.mu.Unlock()
	ac.r.conns.Add(1)
	go func() {
		defer ac.r.conns.Done()
		ac.write()
	}()
}

// write sends what waits, in one TLS record, until nothing does; then,
// if the stream ended, its end.
func (ac *agentConn) write() {
	var buf []byte
	for {
		ac.mu.Lock()
		pongs := ac.pongs
		ac.pongs, ac.woken = 0, false
		ac.mu.Unlock()
		buf = buf[:0]
		for _, m := range ac.as.take() {
			buf = wire.AppendFrame(buf, wire.FrameMessage, m)
		}
		for range pongs {
			buf = wire.AppendFrame(buf, wire.FramePong, nil)
		}
		if len(buf) > 0 {
			_ = ac.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
			if _, err := ac.conn.Write(buf); err != nil {
				ac.close()
				ac.end(status.Errorf(codes.Unavailable, "relay: writing to the agent: %v", err))
			}
			continue
		}
		ac.mu.Lock()
		if ac.woken {
			ac.mu.Unlock()
			continue
		}
		if !ac.ended() {
			ac.writing = false
			ac.mu.Unlock()
			return
		}
		ac.mu.Unlock()
		ac.finish()
		return
	}
}

// finish sends the agent the status its stream ended with; the
// connection is closed once the agent closed it (read), within
// writeTimeout, or at once when nothing reads it.
func (ac *agentConn) finish() {
	<-ac.opened
	why := ac.as.why
	code := codes.OK
	gone := errors.Is(why, errAgentGone)
	if !gone {
		code = status.Code(why)
		_ = ac.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		_, _ = ac.conn.Write(wire.AppendEnd(nil, why))
	}
	if ac.reading && !gone {
		_ = ac.conn.SetReadDeadline(time.Now().Add(writeTimeout))
	} else {
		ac.close()
	}
	ac.cancel()
	if ac.cl != nil {
		ac.r.metrics.streams.Dec()
	}
	ac.r.metrics.ended.WithLabelValues(code.String()).Inc()
	ac.r.log.Debug("agent stream ended", zap.Stringer("peer", ac.conn.RemoteAddr()), zap.Error(why))
}
