package controller

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/controller/keyring"
	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// guard is the controller's security: its TLS files (reloaded as they
// change), the authentication of every call, the open client connections
// and the certificate deny-list (see revoke.go). tls, auth and conns are
// nil when insecure and never change once newGuard returns; the deny-list
// and the connections have locks of their own; reloadRefused is atomic,
// and reverifyKick is drained by reverifyLoop alone.
type guard struct {
	cfg   TLSConfig
	clock clockwork.Clock
	log   *zap.Logger
	// me is this controller's advertised address, for events.
	me string
	// handshakesWait and handshakesOver measure the handshake gate.
	handshakesWait prometheus.Gauge
	handshakesOver prometheus.Counter

	tls     *pki.Reloader
	auth    *authenticator
	conns   *clientConns
	revoked *denyList
	// reverifyKick asks for open connections to be verified again;
	// reloadRefused is a refused TLS reload not reported yet.
	reverifyKick  chan struct{}
	reloadRefused atomic.Pointer[error]
}

// newGuard loads the controller's TLS files, unless cfg is insecure. log
// is the controller's: the reloader and the authenticator name their own.
func newGuard(cfg Config, clock clockwork.Clock, log *zap.Logger, m *metrics) (*guard, error) {
	g := &guard{
		cfg: cfg.TLS, clock: clock, log: log.Named("security"), me: cfg.Advertised(),
		handshakesWait: m.handshakesWait, handshakesOver: m.handshakesOver,
		revoked: newDenyList(), reverifyKick: make(chan struct{}, 1),
	}
	if cfg.Insecure {
		return g, nil
	}
	r, err := pki.NewReloader(cfg.TLS.Files, wantController, log.Named("tls"), pki.WithReloadHook(g.reloaded))
	if err != nil {
		return nil, fmt.Errorf("loading the controller's tls files: %w", err)
	}
	g.tls = r
	g.auth = &authenticator{tls: r, revoked: g.revoked, log: refusalLogger(log.Named("auth"))}
	g.conns = newClientConns(clock, log.Named("auth"))
	return g, nil
}

// serverOptions are mutual TLS and per-call authentication and
// authorization, or nothing at all (and a warning) when insecure.
func (g *guard) serverOptions(listen string) []grpc.ServerOption {
	if g.tls == nil {
		g.log.Warn("insecure mode: no tls and no authentication; anyone who reaches the listen address can run commands on every node (use only for local tests)",
			zap.String("listen", listen))
		return nil
	}
	g.log.Info("mutual tls enabled", zap.Stringer("identity", g.tls.Identity()))
	return []grpc.ServerOption{
		grpc.Creds(handedCreds{}),
		grpc.ChainUnaryInterceptor(g.auth.unary),
		grpc.ChainStreamInterceptor(g.auth.stream),
	}
}

// handshakeCreds make the TLS handshakes of a controller with TLS (see
// splitter), in turns of the handshake gate. TLS session tickets are
// sealed with keys derived from the secrets keyring, which every replica
// shares: agents resume their sessions with a restarted or new leader
// (pki.Reloader.ServerConfig).
func (g *guard) handshakeCreds(keys *keyring.Keyring) credentials.TransportCredentials {
	return gatedCreds{
		TransportCredentials: credentials.NewTLS(g.tls.ServerConfig(func(epoch int64) [32]byte {
			return keys.Derive(fmt.Sprintf("tls session ticket key %d", epoch))
		})),
		gate: newHandshakeGate(g.cfg.MaxHandshakes, g.clock, g.handshakesWait, g.handshakesOver),
	}
}

// checkNodeIdentity refuses an agent registering as a node other than the
// one its certificate names: a node's certificate can only ever speak for
// that node, its heartbeats and its reports.
func (g *guard) checkNodeIdentity(ctx context.Context, node string) error {
	if g.tls == nil {
		return nil
	}
	id, _ := identityFrom(ctx)
	return nodeIdentity(id, node)
}

// revocation is the deny-list entry req asks for, made at now, and the
// node it revokes the agent of ("" if none).
func (g *guard) revocation(ctx context.Context, req *rdzvv1.RevokeCertificateRequest, now time.Time) (r *rdzvv1.Revocation, node string, err error) {
	if g.tls == nil {
		return nil, "", status.Error(codes.FailedPrecondition, "this controller runs without TLS (insecure): there are no certificates to revoke")
	}
	by, _ := identityFrom(ctx)
	// No certificate that chains to the CA verifies after it expires.
	caNotAfter := g.tls.CANotAfter()
	r = &rdzvv1.Revocation{RevokedAt: timestamppb.New(now), RevokedBy: by.String(), Reason: req.GetReason(), NotAfter: timestamppb.New(caNotAfter)}
	if req.GetSerial() != "" {
		serial, err := pki.ParseSerial(req.GetSerial())
		if err != nil {
			return nil, "", status.Error(codes.InvalidArgument, err.Error())
		}
		r.Target = &rdzvv1.Revocation_Serial{Serial: serial}
		if na := req.GetNotAfter(); na != nil && na.AsTime().Before(caNotAfter) {
			r.NotAfter = na
		}
	} else {
		id, err := pki.ParseIdentity(req.GetIdentity())
		if err != nil {
			return nil, "", status.Error(codes.InvalidArgument, err.Error())
		}
		r.Target = &rdzvv1.Revocation_Identity{Identity: id.String()}
		r.IssuedBefore = timestamppb.New(now)
		if id.Role == pki.RoleAgent {
			node = id.Name
		}
	}
	if !r.GetNotAfter().AsTime().After(now) {
		return nil, "", status.Errorf(codes.InvalidArgument, "not_after: %s has passed: the certificate has expired and is refused already",
			r.GetNotAfter().AsTime().UTC().Format(time.RFC3339))
	}
	return r, node, nil
}

// enforce puts a durable revocation on the deny-list and has open
// connections verified again.
func (g *guard) enforce(r *rdzvv1.Revocation) {
	g.revoked.Add(r)
	g.kickReverify()
}

// loadRevocations makes the deny-list what etcd holds, leaving out (and
// logging) entries that do not validate or do not match their key.
func (g *guard) loadRevocations(entries map[string]*rdzvv1.Revocation, dropped []store.Unreadable) {
	for _, bad := range dropped {
		g.log.Error("invalid revocation record in etcd, not enforced", zap.String("key", bad.Key), zap.Error(bad.Err))
	}
	valid := make([]*rdzvv1.Revocation, 0, len(entries))
	for key, r := range entries {
		err := validateRevocation(r)
		if err == nil && store.RevocationKey(r) != key {
			err = fmt.Errorf("the record is for %s", store.RevocationKey(r))
		}
		if err != nil {
			g.log.Error("invalid revocation record in etcd, not enforced", zap.String("key", key), zap.Error(err))
			continue
		}
		valid = append(valid, r)
	}
	g.revoked.Replace(valid)
	if len(valid) > 0 {
		g.log.Info("certificate deny-list loaded", zap.Int("entries", len(valid)))
	}
}

// expireRevocations drops the entries whose certificates have all expired
// and returns them, for deleting from etcd.
func (g *guard) expireRevocations(now time.Time) []*rdzvv1.Revocation {
	expired := g.revoked.Expire(now)
	for _, r := range expired {
		g.log.Info("revocation dropped: every certificate it revokes has expired", zap.String("target", revocationTarget(r)),
			zap.Time("not_after", r.GetNotAfter().AsTime()))
	}
	return expired
}

func (g *guard) kickReverify() {
	select {
	case g.reverifyKick <- struct{}{}:
	default:
	}
}

// reloaded is the TLS reloader's hook: a new CA or deny-list is checked
// against every open connection at once, and a reload refused because the
// new CA does not verify the controller's own certificate is reported.
// It runs under the reloader's lock: it only queues.
func (g *guard) reloaded(err error) {
	switch {
	case errors.Is(err, pki.ErrOwnCertUntrusted):
		g.reloadRefused.Store(&err)
	case err != nil:
		// A rotation caught halfway (a certificate whose key has not
		// landed yet): the reloader logs it, the next change settles it.
		return
	}
	g.kickReverify()
}

// reverifyLoop verifies the certificate of every open connection again
// while this controller leads (only the leader has streams): whenever the
// deny-list or the CA changes, and every tls.reverify_interval, which also
// makes the reloader look at the files when no one connects. A refused
// reload is recorded as a cluster event.
func (g *guard) reverifyLoop(ctx context.Context, record func(*rdzvv1.Event)) {
	if g.tls == nil {
		return // insecure: no certificates
	}
	ticker := g.clock.NewTicker(g.cfg.ReverifyInterval.Duration)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
			g.tls.Refresh()
			// A reload that Refresh triggered is checked by this pass.
			select {
			case <-g.reverifyKick:
			default:
			}
		case <-g.reverifyKick:
		}
		if p := g.reloadRefused.Swap(nil); p != nil {
			record(newEvent(g.clock.Now(), "", "", 0, EventTLSReloadRefused,
				"controller %s refused its changed TLS files and keeps its previous certificate and CA: %v. Replace a CA in steps (docs/operating.md#replacing-the-ca): old and new CA together in %s, every certificate reissued from the new CA, then the old CA removed",
				g.me, *p, g.cfg.CA))
		}
		g.conns.reverify(g.auth.verify)
	}
}
