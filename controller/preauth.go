package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/pki"
	"github.com/rdzv/rdzv/wire"
)

// Before a client's certificate is verified, the controller reads, decodes
// and keeps for it no more than the bounds below (docs/security.md). gRPC
// reads and decodes a unary request before any interceptor runs, and the
// API accepts messages of wire.MaxMessageBytes: authenticating in an
// interceptor comes after 16 MiB were read. So the controller makes each
// TLS handshake itself, verifies the client's certificate as the handshake
// ends, and hands the connection to one of two gRPC servers: the API
// server when the certificate verified, the pre-authentication server
// otherwise. That one answers health checks (publicMethod) and refuses
// every other call with Unauthenticated and the reason, before reading its
// request, then closes the connection.
const (
	// preauthMaxMessage bounds a message from an unverified client: a
	// health check request is a service name.
	preauthMaxMessage = 1 << 10
	// preauthMaxHeaderList bounds a call's headers from an unverified
	// client (gRPC's default is 16 MiB).
	preauthMaxHeaderList = 8 << 10
	// preauthWindow is an unverified connection's HTTP/2 flow control
	// window, for the connection and each stream: the most it can have
	// sent that the controller buffers unread. It is gRPC's minimum; set,
	// it also turns off the window's growth by bandwidth estimation.
	preauthWindow = 64 << 10
	// preauthMaxStreams bounds the calls open at once on an unverified
	// connection.
	preauthMaxStreams = 4
	// maxPreauthConns bounds the unverified connections open at once;
	// beyond it a new one is closed after its handshake. Health probes
	// need a few.
	maxPreauthConns = 256
	// preauthConnTimeout bounds how long an unverified connection may take
	// to send its HTTP/2 preface after its handshake.
	preauthConnTimeout = 10 * time.Second
	// preauthMaxAge bounds how long an unverified connection stays open,
	// a health watch included; a prober dials again.
	preauthMaxAge = 10 * time.Minute
	// refusalGrace is how long a refused connection stays open, reading
	// nothing, so that the refusal's status reaches the client before the
	// connection closes.
	refusalGrace = 200 * time.Millisecond
)

// refusalLogger rate-limits log lines about refused peers: a few of each
// message a second, so that a flood of them costs no more than that.
func refusalLogger(log *zap.Logger) *zap.Logger {
	return log.WithOptions(zap.WrapCore(func(core zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(core, time.Second, 3, 0)
	}))
}

// splitter accepts the controller's connections, makes their TLS
// handshakes (each in a goroutine of its own, in turns of the handshake
// gate) and hands each to api or pre (see above). The accept loop owns the
// listener; the rest is safe for concurrent use.
type splitter struct {
	lis   net.Listener
	creds credentials.TransportCredentials
	// verify verifies a client certificate chain as the API would.
	verify func(pki.Chain) error
	conns  *clientConns
	clock  clockwork.Clock
	log    *zap.Logger

	api, pre *connQueue
	// preSlots holds a token for each unverified connection open.
	preSlots chan struct{}
	wg       sync.WaitGroup
}

func newSplitter(lis net.Listener, creds credentials.TransportCredentials, verify func(pki.Chain) error, conns *clientConns, clock clockwork.Clock, log *zap.Logger) *splitter {
	return &splitter{
		lis: lis, creds: creds, verify: verify, conns: conns, clock: clock, log: refusalLogger(log),
		api: newConnQueue(lis.Addr()), pre: newConnQueue(lis.Addr()),
		preSlots: make(chan struct{}, maxPreauthConns),
	}
}

// run accepts connections until ctx ends, then closes the listener and
// waits for the handshakes under way.
func (s *splitter) run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = s.lis.Close() })
	defer stop()
	defer s.wg.Wait()
	for {
		raw, err := s.lis.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// Out of file descriptors, most likely: the connections
			// already open keep being served while it lasts.
			s.log.Warn("accept failed", zap.Error(err))
			select {
			case <-ctx.Done():
				return nil
			case <-s.clock.After(100 * time.Millisecond):
			}
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handshake(raw)
		}()
	}
}

// handshake makes raw's TLS handshake and hands the connection on.
func (s *splitter) handshake(raw net.Conn) {
	conn, info, err := s.creds.ServerHandshake(raw)
	if err != nil {
		_ = raw.Close()
		s.log.Debug("tls handshake failed", zap.Stringer("peer", raw.RemoteAddr()), zap.Error(err))
		return
	}
	tlsInfo, ok := info.(credentials.TLSInfo)
	if !ok {
		_ = conn.Close()
		s.log.Error("tls handshake gave no tls state", zap.Stringer("peer", raw.RemoteAddr()))
		return
	}
	certs := tlsInfo.State.PeerCertificates
	refusal := s.verify(pki.ChainOf(certs))
	if refusal == nil {
		cc := s.conns.add(conn, pki.ChainOf(certs), leafOf(certs[0]), raw.RemoteAddr().String())
		s.api.put(&handedConn{Conn: cc, info: connInfo{TLSInfo: tlsInfo, conn: cc}})
		return
	}
	select {
	case s.preSlots <- struct{}{}:
	default:
		_ = conn.Close()
		s.log.Warn("connection refused: too many unauthenticated connections", zap.Stringer("peer", raw.RemoteAddr()),
			zap.Int("max", maxPreauthConns))
		return
	}
	pc := &preauthConn{Conn: conn, refusal: refusal, clock: s.clock, release: func() { <-s.preSlots },
		refused: make(chan struct{}), closed: make(chan struct{})}
	s.pre.put(&handedConn{Conn: pc, info: preauthInfo{TLSInfo: tlsInfo, conn: pc}})
}

// refuse is the pre-authentication server's handler of every method but
// the health checks: it refuses the call before reading its request, and
// closes the connection.
func (s *splitter) refuse(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	p, _ := peer.FromContext(ss.Context())
	info, ok := p.AuthInfo.(preauthInfo)
	if !ok {
		return status.Error(codes.Internal, "connection not from the pre-authentication listener")
	}
	info.conn.refuse()
	s.log.Warn("unauthenticated call refused", zap.String("method", method), zap.Stringer("peer", p.Addr), zap.Error(info.conn.refusal))
	return status.Error(codes.Unauthenticated, info.conn.refusal.Error())
}

// preauthServerOptions are the pre-authentication server's: the bounds
// above, and the same keepalive policy as the API's, which ends a
// connection that pings too often.
func preauthServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(handedCreds{}),
		grpc.MaxRecvMsgSize(preauthMaxMessage),
		grpc.MaxHeaderListSize(preauthMaxHeaderList),
		grpc.InitialWindowSize(preauthWindow),
		grpc.InitialConnWindowSize(preauthWindow),
		grpc.MaxConcurrentStreams(preauthMaxStreams),
		grpc.ConnectionTimeout(preauthConnTimeout),
		grpc.ReadBufferSize(0),
		grpc.SharedWriteBuffer(true),
		grpc.WriteBufferSize(8 << 10),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time: 10 * time.Second, Timeout: 5 * time.Second,
			MaxConnectionIdle: wire.MaxConnectionIdle, MaxConnectionAge: preauthMaxAge, MaxConnectionAgeGrace: 5 * time.Second,
		}),
	}
}

// preauthConn is a connection whose client certificate did not verify (or
// that has none).
type preauthConn struct {
	net.Conn
	refusal error
	clock   clockwork.Clock
	release func()

	refuseOnce, closeOnce sync.Once
	// refused is closed when a call on the connection was refused, closed
	// when the connection is.
	refused, closed chan struct{}
	// closer closes the connection after a refusal; set once refused is
	// closed.
	closer clockwork.Timer
}

// Read reads nothing more once a call was refused: the connection waits
// to be closed.
func (c *preauthConn) Read(p []byte) (int, error) {
	select {
	case <-c.refused:
		<-c.closed
		return 0, net.ErrClosed
	default:
	}
	return c.Conn.Read(p)
}

// refuse closes the connection refusalGrace from now, reading nothing
// until then.
func (c *preauthConn) refuse() {
	c.refuseOnce.Do(func() {
		c.closer = c.clock.AfterFunc(refusalGrace, func() { _ = c.Close() })
		close(c.refused)
	})
}

func (c *preauthConn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.release()
		select {
		case <-c.refused:
			c.closer.Stop()
		default:
		}
	})
	return c.Conn.Close()
}

// preauthInfo is an unverified connection's AuthInfo.
type preauthInfo struct {
	credentials.TLSInfo
	conn *preauthConn
}

// handedConn is a connection whose handshake the splitter made, with what
// the handshake established.
type handedConn struct {
	net.Conn
	info credentials.AuthInfo
}

// handedCreds is the transport security of the controller's gRPC servers
// when TLS is on: the splitter made the handshake already.
type handedCreds struct{}

func (handedCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("the controller's server does not dial")
}

func (handedCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	h, ok := c.(*handedConn)
	if !ok {
		return nil, nil, fmt.Errorf("a %T, not a connection the controller made the handshake of", c)
	}
	return h.Conn, h.info, nil
}

func (handedCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (h handedCreds) Clone() credentials.TransportCredentials { return h }

func (handedCreds) OverrideServerName(string) error { return nil }

// connQueue is a net.Listener whose connections the splitter puts.
type connQueue struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newConnQueue(addr net.Addr) *connQueue {
	return &connQueue{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// put hands conn to the server accepting from q, or closes it once q is
// closed.
func (q *connQueue) put(conn net.Conn) {
	select {
	case q.conns <- conn:
	case <-q.done:
		_ = conn.Close()
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.addr }
