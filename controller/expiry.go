package controller

import (
	"fmt"
	"net"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"
	"google.golang.org/grpc/credentials"
)

// expiringCreds closes every client connection when the certificate it was
// authenticated with expires. Calls are verified one by one, but an agent's
// stream lives for weeks on one connection, and new calls reuse that
// connection's handshake: without this, an expired certificate would keep
// a stream open, and a renewed one on disk would never be presented. Closed,
// the client handshakes again with the certificate it has now.
type expiringCreds struct {
	credentials.TransportCredentials
	clock clockwork.Clock
	log   *zap.Logger
}

func (e expiringCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := e.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return conn, info, err
	}
	tlsInfo, ok := info.(credentials.TLSInfo)
	if !ok || len(tlsInfo.State.PeerCertificates) == 0 {
		return conn, info, nil
	}
	leaf := tlsInfo.State.PeerCertificates[0]
	left := leaf.NotAfter.Sub(e.clock.Now())
	if left <= 0 {
		// Every call on it is refused with the reason (Unauthenticated);
		// closing at once would hide that behind a connection error.
		return conn, info, nil
	}
	// The timer closes the inner connection only: it may fire before the
	// wrapper below has its timer.
	timer := e.clock.AfterFunc(left, func() {
		e.log.Warn("closing connection: client certificate expired", zap.String("peer", raw.RemoteAddr().String()),
			zap.String("subject", leaf.Subject.CommonName), zap.Time("not_after", leaf.NotAfter))
		_ = conn.Close()
	})
	return &expiringConn{Conn: conn, timer: timer}, info, nil
}

func (e expiringCreds) Clone() credentials.TransportCredentials {
	return expiringCreds{TransportCredentials: e.TransportCredentials.Clone(), clock: e.clock, log: e.log}
}

// expiringConn stops its expiry timer when closed, so that a closed
// connection is not kept in memory until its certificate would expire.
type expiringConn struct {
	net.Conn
	timer clockwork.Timer
}

func (c *expiringConn) Close() error {
	c.timer.Stop()
	return c.Conn.Close()
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
	name := ns.rec.GetInfo().GetName()
	c.log.Warn("agent certificate expires soon", zap.String("node", name), zap.Time("not_after", sess.certNotAfter))
	ev := c.event("", name, 0, EventCertExpiring, "the certificate of agent %s expires at %s (in %s): renew it (rdzvctl pki issue agent %s) and install it on the node; an agent with an expired certificate is refused",
		name, sess.certNotAfter.UTC().Format(time.RFC3339), roundDuration(sess.certNotAfter.Sub(now)), name)
	c.persist(c.store.AppendEvent(ev), nil)
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
