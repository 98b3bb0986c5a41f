package relay

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
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

// While no controller serves the relay (a controller restart or failover)
// but a controller's host answers (reach), the relay holds its agents' new
// streams, for up to maxHold, looking again once per holdRetry; then it
// tells an agent Unavailable, which sends the agent around it to the
// controller directly. Held agents register the moment a controller leads,
// through their relay, instead of after their own reconnect backoff and
// with a handshake each.
//
// Meanwhile the uplink asks for a call once per callRetry. An attempt
// while the connection is down fails at once, without a packet sent (the
// connection's own backoff, upstreamBackoff, paces the connection
// attempts), and a controller that answers but does not serve yet (it is
// starting, or an election is under way) serves within moments: the
// relay's agents, held meanwhile, should register within a fraction of a
// second of a controller serving.
const (
	holdRetry = time.Second
	callRetry = 100 * time.Millisecond
	maxHold   = 5 * time.Minute
)

// upstreamBackoff reconnects to a controller that went away within a
// quarter of a second of its return: the relay holds few connections, a
// refused attempt costs nothing, and its agents wait on them (the default
// backoff grows to two minutes).
var upstreamBackoff = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 250 * time.Millisecond},
	MinConnectTimeout: client.DefaultConfig().DialTimeout,
}

// refusalLines bounds the log lines of each kind of refusal a second
// (Relay.refusals); rdzv_relay_refused_total counts them all.
const refusalLines = 5

// Relay is rdzv-relay. Build it with New and run it with Run.
type Relay struct {
	cfg     Config
	log     *zap.Logger
	tls     *pki.Reloader
	client  *client.Client
	metrics *metrics
	http    *httpserve.Server
	reach   *reach
	uplink  *uplink
	// revoked is the leader's deny-list as last read (syncRevocations).
	revoked *pki.DenyList
	// refusals logs the refusals of peers, a few lines a second at most:
	// a peer that is refused costs the relay no more than it takes to
	// refuse it, and no flood of log lines either.
	refusals *zap.Logger

	lis   net.Listener
	ready chan struct{}
	// conns counts the goroutines of the connections accepted, and of
	// agents' streams: Run waits for them.
	conns sync.WaitGroup
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
		reach: &reach{addrs: addrs, dial: (&net.Dialer{}).DialContext}, revoked: pki.NewDenyList(),
		refusals: log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, time.Second, refusalLines, 0)
		}))}
	r.uplink = newUplink(r)
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
	// The relay makes the TLS handshake, which admits only a client
	// certificate that verifies and is not on the deny-list, and only a
	// peer that speaks wire.AgentProtocol: nothing a peer sends past the
	// handshake is read before that.
	conf := r.tls.VerifyingServerConfig(r.revoked.Check)
	conf.NextProtos = []string{wire.AgentProtocol}
	defer r.conns.Wait()
	g, gctx := errgroup.WithContext(ctx)
	if r.http != nil {
		if err := r.http.Listen(); err != nil {
			return err
		}
		g.Go(func() error { return r.http.Serve(gctx) })
	}
	r.log.Info("relay serving", zap.Stringer("addr", lis.Addr()), zap.String("controller", r.cfg.Controller))
	close(r.ready)
	g.Go(func() error { r.uplink.run(gctx); return nil })
	g.Go(func() error { r.syncRevocations(gctx); return nil })
	g.Go(func() error { return r.accept(gctx, conf) })
	g.Go(func() error {
		<-gctx.Done()
		_ = lis.Close()
		return nil
	})
	return g.Wait()
}

// admit checks the certificate chain an agent presented, at each stream
// it opens (the handshake checked it, perhaps long ago): the relay carries
// agents only, each with a short chain. A refusal reaches the agent as the
// stream's end status.
func (r *Relay) admit(peer string, chain []*x509.Certificate) error {
	v, err := r.tls.VerifyClientAgain(pki.ChainOf(chain), pki.ClientVerification{})
	if err == nil {
		err = r.revoked.Check(v)
	}
	if err != nil {
		r.refused(refusedStream, peer, err)
		return status.Error(codes.Unauthenticated, err.Error())
	}
	id := v.ID
	if id.Role != pki.RoleAgent {
		return status.Errorf(codes.PermissionDenied, "%s may not call %s through a relay: it carries agents only", id, rdzvv1.AgentService_Connect_FullMethodName)
	}
	if len(chain) > wire.MaxRelayedChain {
		return status.Errorf(codes.InvalidArgument, "%s presented %d certificates; a relay forwards at most %d", id, len(chain), wire.MaxRelayedChain)
	}
	return nil
}

// What a refusal refused, for rdzv_relay_refused_total.
const (
	refusedHandshake = "handshake"
	refusedStream    = "stream"
	refusedFrame     = "frame"
)

// refused counts and logs (a few lines a second: refusals) a peer's
// refusal.
func (r *Relay) refused(what, peer string, err error) {
	r.metrics.refused.WithLabelValues(what).Inc()
	r.refusals.Warn("agent refused", zap.String("at", what), zap.String("peer", peer), zap.Error(err))
}

// syncRevocations keeps revoked the leader's deny-list, read once per
// revocations_refresh. Until the first read succeeds (a relay that starts
// while no controller serves) it refuses nothing revoked: the controller
// refuses what the relay forwards.
func (r *Relay) syncRevocations(ctx context.Context) {
	t := time.NewTicker(r.cfg.RevocationsRefresh.Duration)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.RevocationsRefresh.Duration)
		resp, err := r.client.ListRevocations(cctx, &rdzvv1.ListRevocationsRequest{})
		cancel()
		if err == nil {
			r.revoked.Replace(resp.GetRevocations())
		} else if ctx.Err() == nil {
			r.log.Debug("reading the deny-list failed", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
