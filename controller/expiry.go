package controller

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/pki"
)

// Every client connection is tracked with the certificate chain it was
// authenticated with and the streams open on it, so that the controller
// can end a connection whose certificate it no longer accepts. Calls are
// verified one by one, but an agent's stream lives for weeks on one
// connection, and new calls reuse that connection's handshake: without
// this, an expired or revoked certificate would keep a stream open, and a
// renewed one on disk would never be presented. A connection ends when its
// certificate expires (a timer per connection) and when re-verification
// refuses it (revoked, or no longer chaining to the CA as reloaded: see
// reverifyLoop). Its streams then end with Unauthenticated and the reason,
// which also makes a client drop the connection and handshake again with
// the certificate it has by then; the controller closes the connection
// itself connCloseGrace later, for clients that do not.

// connCloseGrace is how long an ended connection stays open: long enough
// for its streams' final status to reach the client first.
const connCloseGrace = 2 * time.Second

// clientConns is the set of open client connections on which a call was
// authenticated: those are the ones verified again. A connection that
// never carried one has nothing to end (and one whose HTTP/2 preface
// failed is never closed through its wrapper, so it is better not kept).
type clientConns struct {
	clock clockwork.Clock
	log   *zap.Logger

	mu    sync.Mutex
	conns map[*clientConn]struct{}
}

func newClientConns(clock clockwork.Clock, log *zap.Logger) *clientConns {
	return &clientConns{clock: clock, log: log, conns: map[*clientConn]struct{}{}}
}

// clientConn is one tracked connection.
type clientConn struct {
	net.Conn
	set   *clientConns
	chain pki.Chain
	leaf  leafInfo
	peer  string
	// verified is set once a call on the connection was authenticated;
	// closed once it is closed. Both change under set.mu.
	verified, closed atomic.Bool

	mu sync.Mutex
	// verification is the chain's last accepted verification: checking it
	// again skips the signatures while the CA stays loaded.
	verification pki.ClientVerification
	// ended is why the connection was ended; nil while it is open.
	ended error
	// streams are those open on the connection: one for an agent, a few
	// for an operator's client, so a slice rather than a map (a relayed
	// agent's map was about 200 bytes of the controller's heap per node).
	streams       []trackedStream
	nextStream    uint64
	expiry, close clockwork.Timer
}

// connInfo is a tracked connection's AuthInfo: the TLS state, as for any
// TLS connection, and the connection, for the streams opened on it.
type connInfo struct {
	credentials.TLSInfo
	conn *clientConn
}

// leafInfo is what a connection's expiry timer and log lines need of its
// leaf certificate, kept instead of the certificate (see relayed).
type leafInfo struct {
	subject             string
	notBefore, notAfter time.Time
}

func leafOf(cert *x509.Certificate) leafInfo {
	return leafInfo{subject: cert.Subject.CommonName, notBefore: cert.NotBefore, notAfter: cert.NotAfter}
}

func (s *clientConns) add(conn net.Conn, chain pki.Chain, leaf leafInfo, peer string) *clientConn {
	cc := &clientConn{Conn: conn, set: s, chain: chain, leaf: leaf, peer: peer}
	left := leaf.notAfter.Sub(s.clock.Now())
	if left <= 0 {
		// Every call on it is refused with the reason (Unauthenticated);
		// closing at once would hide that behind a connection error.
		return cc
	}
	cc.mu.Lock()
	cc.expiry = s.clock.AfterFunc(left, func() {
		cc.end(&pki.ValidityError{Subject: leaf.subject, NotBefore: leaf.notBefore, NotAfter: leaf.notAfter, Now: s.clock.Now()}, func() {
			s.log.Warn("closing connection: client certificate expired", zap.String("peer", peer),
				zap.String("subject", leaf.subject), zap.Time("not_after", leaf.notAfter))
		})
	})
	cc.mu.Unlock()
	return cc
}

// lastVerification is what accepted recorded last.
func (cc *clientConn) lastVerification() pki.ClientVerification {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.verification
}

// accepted records that a call on cc was authenticated, by v: from then on
// its certificate is verified again with the others'.
func (cc *clientConn) accepted(v pki.ClientVerification) {
	cc.mu.Lock()
	cc.verification = v
	cc.mu.Unlock()
	if cc.verified.Load() {
		return
	}
	cc.set.mu.Lock()
	defer cc.set.mu.Unlock()
	if !cc.closed.Load() {
		cc.verified.Store(true)
		cc.set.conns[cc] = struct{}{}
	}
}

// reverify checks the certificate of every connection that carried an
// authenticated call, given its last verification, and ends those check
// refuses.
func (s *clientConns) reverify(check func(chain pki.Chain, prev pki.ClientVerification) (pki.ClientVerification, error)) {
	s.mu.Lock()
	conns := make([]*clientConn, 0, len(s.conns))
	for cc := range s.conns {
		conns = append(conns, cc)
	}
	s.mu.Unlock()
	for _, cc := range conns {
		prev := cc.lastVerification()
		v, err := check(cc.chain, prev)
		if err == nil {
			cc.mu.Lock()
			cc.verification = v
			cc.mu.Unlock()
			continue
		}
		cc.end(err, func() {
			s.log.Warn("closing connection: client certificate no longer accepted", zap.String("peer", cc.peer),
				zap.String("subject", cc.leaf.subject), zap.String("serial", prev.Serial), zap.Error(err))
		})
	}
}

// end ends the connection's streams with reason, and closes it
// connCloseGrace later. If the connection was still open, announce runs
// first: before anyone waiting on its streams learns that they ended.
func (cc *clientConn) end(reason error, announce func()) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.ended != nil {
		return
	}
	announce()
	cc.ended = reason
	for _, st := range cc.streams {
		st.cancel(&certRefused{reason: reason})
	}
	cc.close = cc.set.clock.AfterFunc(connCloseGrace, func() { _ = cc.Close() })
}

// Close stops the connection's timers, so that a closed connection is not
// kept in memory until its certificate would expire.
func (cc *clientConn) Close() error {
	cc.set.mu.Lock()
	cc.closed.Store(true)
	delete(cc.set.conns, cc)
	cc.set.mu.Unlock()
	cc.mu.Lock()
	for _, t := range []clockwork.Timer{cc.expiry, cc.close} {
		if t != nil {
			t.Stop()
		}
	}
	cc.mu.Unlock()
	return cc.Conn.Close()
}

// certRefused is why a stream was ended: its connection's certificate is
// no longer accepted.
type certRefused struct{ reason error }

func (e *certRefused) Error() string { return e.reason.Error() }

func (e *certRefused) status() error { return status.Error(codes.Unauthenticated, e.reason.Error()) }

// trackStream ties a stream's context to the connection it came on: the
// context is canceled, with a certRefused cause, when the connection ends.
// done must be called when the stream ends.
func trackStream(ctx context.Context) (_ context.Context, done func(), _ error) {
	cc := trackedConn(ctx)
	if cc == nil {
		return ctx, func() {}, nil
	}
	return cc.track(ctx)
}

// trackRelayed tracks the agent certificate of a carried stream (r) as a
// connection of its own, which only that stream is on: ctx, a relay's
// Carry call, is canceled with a certRefused cause when the certificate
// expires or re-verification refuses it, and the relay's other agents are
// not touched. Ending it closes nothing (relayedConn); done drops it.
func trackRelayed(ctx context.Context, r *relayed) (_ context.Context, done func(), _ error) {
	relay := trackedConn(ctx)
	if relay == nil {
		return ctx, func() {}, nil
	}
	vc := relay.set.add(relayedConn{}, derChain(r.ders), r.leaf, relay.peer+" ("+r.verification.ID.String()+" through "+r.relay.String()+")")
	vc.accepted(r.verification)
	ctx, untrack, err := vc.track(ctx)
	if err != nil {
		_ = vc.Close()
		return nil, nil, err
	}
	return ctx, func() {
		untrack()
		_ = vc.Close()
	}, nil
}

// relayedConn stands for the connection a relayed agent has to its relay:
// the controller cannot close it, only end the agent's stream.
type relayedConn struct{ net.Conn }

func (relayedConn) Close() error { return nil }

// track ties ctx to cc (trackStream).
func (cc *clientConn) track(ctx context.Context) (_ context.Context, done func(), _ error) {
	ctx, cancel := context.WithCancelCause(ctx)
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.ended != nil {
		cancel(nil)
		return nil, nil, (&certRefused{reason: cc.ended}).status()
	}
	id := cc.nextStream
	cc.nextStream++
	cc.streams = append(cc.streams, trackedStream{id: id, cancel: cancel})
	return ctx, func() {
		cc.mu.Lock()
		cc.streams = slices.DeleteFunc(cc.streams, func(st trackedStream) bool { return st.id == id })
		cc.mu.Unlock()
		cancel(nil)
	}, nil
}

// trackedStream is a stream open on a clientConn, and how to end it.
type trackedStream struct {
	id     uint64
	cancel context.CancelCauseFunc
}

// trackedConn is the connection a call came on, nil if untracked.
func trackedConn(ctx context.Context) *clientConn {
	if p, _ := peer.FromContext(ctx); p != nil {
		if info, ok := p.AuthInfo.(connInfo); ok {
			return info.conn
		}
	}
	return nil
}

// streamRefused is the status a stream ends with when its connection's
// certificate was refused while it was open, or nil.
func streamRefused(ctx context.Context) error {
	var refused *certRefused
	if errors.As(context.Cause(ctx), &refused) {
		return refused.status()
	}
	return nil
}

// certExpiryWarning is how long before an agent's certificate expires the
// controller warns (log and event, once per connection): an agent whose
// certificate expires is refused, its node lost, its job restarted without
// it.
const certExpiryWarning = 14 * 24 * time.Hour

// maxExpiryWarningsPerPass bounds the events one liveness pass queues: a
// fleet whose certificates were all issued together is warned over a few
// passes, not in one burst of writes.
const maxExpiryWarningsPerPass = 8

// warnCertExpiry warns once per connection that ns's agent's certificate
// expires soon, and says whether it did. Callers hold c.mu.
func (c *Controller) warnCertExpiry(now time.Time, ns *nodeState) bool {
	sess := ns.session
	if sess == nil || sess.expiryWarned || sess.certNotAfter.IsZero() || now.Before(sess.certNotAfter.Add(-certExpiryWarning)) {
		return false
	}
	sess.expiryWarned = true
	name := ns.info.name
	c.log.Warn("agent certificate expires soon", zap.String("node", name), zap.Time("not_after", sess.certNotAfter))
	ev := newEvent(c.clock.Now(), "", name, 0, EventCertExpiring, "the certificate of agent %s expires at %s (in %s): renew it (rdzvctl pki issue agent %s) and install it on the node; an agent with an expired certificate is refused",
		name, sess.certNotAfter.UTC().Format(time.RFC3339), roundDuration(sess.certNotAfter.Sub(now)), name)
	c.writes.persist(c.store.AppendEvent(ev), nil)
	return true
}

// roundDuration shows a duration to the unit that matters.
func roundDuration(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	case d >= 2*time.Hour:
		return fmt.Sprintf("%d hours", d/time.Hour)
	}
	return fmt.Sprintf("%d minutes", d/time.Minute)
}
