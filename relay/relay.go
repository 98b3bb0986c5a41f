package relay

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/internal/httpserve"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// upstreamKeepalive is the relay's keepalive towards the controller, the
// agent's own (agent.Keepalive): a controller that vanished from the
// network is given up within 15 s, and its agents' streams with it.
var upstreamKeepalive = keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}

// While no controller serves an agent's new stream (a controller restart
// or failover) but a controller's host answers (reach), the relay holds
// the stream, for up to maxHold; one attempt per holdRetry tries for all
// of the relay's held streams (upstream). Then it tells the agent
// Unavailable, which sends the agent around it to the controller
// directly. Held agents register the moment a controller leads, through
// their relay, instead of after their own reconnect backoff and with a
// handshake each.
const (
	holdRetry = time.Second
	maxHold   = 5 * time.Minute
)

// upstreamBackoff reconnects to a controller that went away within a
// second: the relay holds few connections, and its agents wait on them
// (the default backoff grows to two minutes).
var upstreamBackoff = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: client.DefaultConfig().DialTimeout,
}

// registerTimeout bounds the wait for an agent's first message, as the
// controller's does: a connection that opens a stream and says nothing
// holds no upstream stream for long.
const registerTimeout = 30 * time.Second

// Relay is rdzv-relay. Build it with New and run it with Run.
type Relay struct {
	cfg     Config
	log     *zap.Logger
	tls     *pki.Reloader
	client  *client.Client
	metrics *metrics
	http    *httpserve.Server
	reach   *reach
	up      *upstream

	lis   net.Listener
	ready chan struct{}
}

// New checks cfg and loads the relay's certificate; nothing listens or
// dials until Run.
func New(cfg Config, log *zap.Logger) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid relay config: %w", err)
	}
	wantRelay := func(id pki.Identity) error {
		if id.Role != pki.RoleRelay {
			return fmt.Errorf("is the certificate of %s; a relay needs one of role relay (rdzvctl pki issue relay NAME --ip ADDR)", id)
		}
		return nil
	}
	tls, err := pki.NewReloader(cfg.TLS, wantRelay, log.Named("tls"))
	if err != nil {
		return nil, fmt.Errorf("loading the relay's tls files: %w", err)
	}
	addrs, _ := cfg.Controllers()
	cc := client.DefaultConfig()
	cc.Endpoints, cc.Logger = addrs, log.Named("client")
	cc.TLS = &client.TLS{Files: cfg.TLS, Identity: wantRelay}
	cc.DialOptions = []grpc.DialOption{grpc.WithKeepaliveParams(upstreamKeepalive), grpc.WithConnectParams(upstreamBackoff)}
	cl, err := client.New(cc)
	if err != nil {
		return nil, fmt.Errorf("loading the relay's tls files: %w", err)
	}
	r := &Relay{cfg: cfg, log: log, tls: tls, client: cl, metrics: newMetrics(), ready: make(chan struct{}),
		reach: &reach{addrs: addrs, dial: (&net.Dialer{}).DialContext}, up: newUpstream()}
	if cfg.HTTP.Enabled() {
		reg := httpserve.NewRegistry()
		r.metrics.register(reg)
		if r.http, err = httpserve.New(cfg.HTTP, reg, r.readiness, log.Named("http")); err != nil {
			_ = cl.Close()
			return nil, err
		}
	}
	return r, nil
}

// readiness is /readyz: ready once listening. Whether a controller
// answers is each stream's to find out, and an agent goes around a relay
// that cannot reach one.
func (r *Relay) readiness() error {
	select {
	case <-r.ready:
		return nil
	default:
		return errors.New("not listening yet")
	}
}

// HTTPAddr is where the relay serves metrics and health, once Ready; nil
// when http.listen is empty.
func (r *Relay) HTTPAddr() net.Addr {
	if r.http == nil {
		return nil
	}
	return r.http.Addr()
}

// Ready is closed once the relay listens.
func (r *Relay) Ready() <-chan struct{} { return r.ready }

// Addr is where the relay listens, once Ready.
func (r *Relay) Addr() net.Addr { return r.lis.Addr() }

// Run serves agents until ctx ends, then ends their streams: each agent
// reconnects to another relay or to the controller itself.
func (r *Relay) Run(ctx context.Context) error {
	defer r.client.Close()
	lis, err := net.Listen("tcp", r.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", r.cfg.Listen, err)
	}
	r.lis = lis
	srv := grpc.NewServer(append(wire.StreamServerOptions(), grpc.Creds(credentials.NewTLS(r.tls.ServerConfig(nil))))...)
	rdzvv1.RegisterAgentServiceServer(srv, &service{r: r})
	g, gctx := errgroup.WithContext(ctx)
	if r.http != nil {
		if err := r.http.Listen(); err != nil {
			return err
		}
		g.Go(func() error { return r.http.Serve(gctx) })
	}
	r.log.Info("relay serving", zap.Stringer("addr", lis.Addr()), zap.String("controller", r.cfg.Controller))
	close(r.ready)
	g.Go(func() error {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("serving grpc: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		// Not a graceful stop: an agent's stream never ends by itself.
		srv.Stop()
		return nil
	})
	return g.Wait()
}

// service is the relay's AgentService: each agent stream is carried to the
// controller as a stream of its own on the relay's connection.
type service struct {
	rdzvv1.UnimplementedAgentServiceServer
	r *Relay
}

func (s *service) Connect(down rdzvv1.AgentService_ConnectServer) error {
	err := s.r.carry(down)
	s.r.metrics.ended.WithLabelValues(status.Code(err).String()).Inc()
	return err
}

// carry verifies the agent and carries its stream to the controller until
// either side ends it. The agent learns the controller's status as is: a
// refusal (a standby that leads no one, a revoked certificate) reaches it
// unchanged, and a controller the relay cannot reach is Unavailable, which
// sends the agent to its next address.
func (r *Relay) carry(down rdzvv1.AgentService_ConnectServer) error {
	ctx := down.Context()
	var chain []*x509.Certificate
	if p, _ := peer.FromContext(ctx); p != nil {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			chain = info.State.PeerCertificates
		}
	}
	id, err := r.tls.VerifyClient(chain)
	if err != nil {
		r.log.Warn("unauthenticated agent refused", zap.String("peer", peerAddr(ctx)), zap.Error(err))
		return status.Error(codes.Unauthenticated, err.Error())
	}
	if id.Role != pki.RoleAgent {
		return status.Errorf(codes.PermissionDenied, "%s may not call %s through a relay: it carries agents only", id, rdzvv1.AgentService_Connect_FullMethodName)
	}
	if len(chain) > wire.MaxRelayedChain {
		return status.Errorf(codes.InvalidArgument, "%s presented %d certificates; a relay forwards at most %d", id, len(chain), wire.MaxRelayedChain)
	}
	md := metadata.MD{}
	for _, c := range chain {
		md.Append(wire.RelayedChainKey, string(c.Raw))
	}
	uctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ctx, md))
	defer cancel()

	first, err := wire.RecvRegister(down.Recv, registerTimeout)
	if err != nil {
		return err
	}
	up, resp, err := r.open(uctx, first)
	if err != nil {
		return upstreamStatus(err)
	}
	if err := down.Send(resp); err != nil {
		return err
	}
	r.metrics.streams.Inc()
	defer r.metrics.streams.Dec()
	log := r.log.With(zap.Stringer("agent", id))
	log.Debug("carrying agent stream", zap.String("controller", r.client.Leader()))

	// Agent to controller beside; controller to agent here. When the agent
	// goes, canceling ends the upstream stream; when the controller ends
	// it, returning ends the agent's, which ends the receive beside.
	go func() {
		defer cancel()
		for {
			m, err := down.Recv()
			if errors.Is(err, io.EOF) {
				_ = up.CloseSend()
				return
			}
			if err != nil {
				return
			}
			if err := up.Send(m); err != nil {
				return
			}
		}
	}()
	for {
		m, err := up.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			log.Debug("controller ended agent stream", zap.Error(err))
			return upstreamStatus(err)
		}
		if err := down.Send(m); err != nil {
			return err
		}
	}
}

// open opens the agent's stream to the leading controller, sends it the
// agent's first message and returns the controller's answer. While no
// controller serves but one's host answers, it holds the agent (see
// maxHold and upstream). A refusal that is an answer (a certificate
// refused, a bad message) ends it at once.
func (r *Relay) open(ctx context.Context, first *rdzvv1.ConnectRequest) (rdzvv1.AgentService_ConnectClient, *rdzvv1.ConnectResponse, error) {
	deadline := time.Now().Add(maxHold)
	var last error
	for {
		down, back := r.up.state()
		if !down || r.up.pilot(time.Now()) {
			up, resp, err := r.attempt(ctx, first)
			if err == nil {
				r.up.served()
				return up, resp, nil
			}
			if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
				return nil, nil, err
			}
			r.up.failed(time.Now())
			last = err
		}
		if last != nil && (time.Now().After(deadline) || !r.reach.reachable(ctx)) {
			return nil, nil, last
		}
		// Jittered, so that the held do not all wake together to see
		// whether they are the pilot.
		select {
		case <-ctx.Done():
			return nil, nil, status.FromContextError(ctx.Err()).Err()
		case <-back:
			// Released together, the held would register in one burst:
			// ten thousand at once kept a cold controller's first node
			// writes past etcd's request timeout, and it stepped down
			// (make bench-scale). Spread over a retry interval instead.
			select {
			case <-ctx.Done():
				return nil, nil, status.FromContextError(ctx.Err()).Err()
			case <-time.After(rand.N(holdRetry)):
			}
		case <-time.After(holdRetry/2 + rand.N(holdRetry)):
		}
		if last == nil {
			last = status.Error(codes.Unavailable, "relay: no controller serves")
		}
	}
}

// attempt is one try of open.
func (r *Relay) attempt(ctx context.Context, first *rdzvv1.ConnectRequest) (rdzvv1.AgentService_ConnectClient, *rdzvv1.ConnectResponse, error) {
	up, err := r.client.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := up.Send(first); err != nil {
		return nil, nil, err
	}
	// The first receive finds the leading controller (client.Conn).
	resp, err := up.Recv()
	if err != nil {
		return nil, nil, err
	}
	return up, resp, nil
}

// upstreamStatus is what the agent is told when the controller's side
// failed: the controller's own status when it gave one, Unavailable
// otherwise.
func upstreamStatus(err error) error {
	if wire.IsRelayedRefusal(err) {
		// Unmarked, the agent drops its connection to the relay and
		// handshakes again, presenting its renewed certificate if it has
		// one.
		return status.Error(codes.Unauthenticated, status.Convert(err).Message())
	}
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	return status.Errorf(codes.Unavailable, "relay: controller: %v", err)
}

func peerAddr(ctx context.Context) string {
	if p, _ := peer.FromContext(ctx); p != nil && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}
