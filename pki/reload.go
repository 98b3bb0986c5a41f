package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"
)

// checkEvery throttles how often the files are looked at: a stat of three
// files per second at most, however many handshakes and calls there are.
const checkEvery = time.Second

// Reloader serves a daemon's TLS material and re-reads it when the files
// change (size, modification time or inode), so that rotating certificates
// needs no restart. A new set that does not load (a certificate whose key
// has not been written yet, a certificate the CA did not sign) is logged and
// the previous one stays in use.
type Reloader struct {
	files Files
	want  func(Identity) error
	log   *zap.Logger
	clock clockwork.Clock
	// hook, if set, learns of every reload (see WithReloadHook).
	hook func(error)

	mu      sync.Mutex
	checked time.Time
	stamps  [3]os.FileInfo
	// missing is set while a file cannot be read, so that is logged once.
	missing bool
	cur     material

	// sessions caches TLS sessions to resume, one per controller host.
	sessions *sessionCache
}

// maxSessions bounds the cached sessions: one per controller replica.
const maxSessions = 16

// sessionCache is a daemon's cache of TLS sessions to resume, emptied
// whenever its certificates change: a resumed session presents the
// certificate of its full handshake, which may be the one just replaced
// (revoked, or of a CA no longer trusted), and refused on every call until
// the ticket expires. It looks at the files itself, since a resumed
// handshake asks for no client certificate.
type sessionCache struct {
	r  *Reloader
	mu sync.Mutex
	// of is the certificate the cached sessions presented.
	of  *tls.Certificate
	lru tls.ClientSessionCache
}

func (c *sessionCache) Get(key string) (*tls.ClientSessionState, bool) {
	return c.fresh().Get(key)
}

func (c *sessionCache) Put(key string, cs *tls.ClientSessionState) { c.fresh().Put(key, cs) }

// fresh is the cache of sessions made with the certificate in use.
func (c *sessionCache) fresh() tls.ClientSessionCache {
	cert := c.r.current().cert
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.of != cert {
		c.of, c.lru = cert, tls.NewLRUClientSessionCache(maxSessions)
	}
	return c.lru
}

type material struct {
	cert *tls.Certificate
	id   Identity
	pool *x509.CertPool
	// caNotAfter is when the last of the CA certificates expires: no
	// certificate that chains to the pool verifies after it.
	caNotAfter time.Time
}

// ErrOwnCertUntrusted refuses a set of files whose CA does not verify the
// daemon's own certificate: peers trusting that CA would refuse it, and a
// CA replaced before the certificate was reissued would drop every peer
// that still holds a certificate of the old one.
var ErrOwnCertUntrusted = errors.New("the CA file does not verify this daemon's own certificate")

// ReloaderOption adjusts a Reloader for tests.
type ReloaderOption func(*Reloader)

// WithClock replaces the wall clock used for throttling and verification.
func WithClock(c clockwork.Clock) ReloaderOption { return func(r *Reloader) { r.clock = c } }

// WithReloadHook calls hook after each reload of changed files: with nil
// once the new set is in use, or with why it was refused (the previous set
// stays in use). It runs under the Reloader's lock, inside a handshake or
// a verification: it must be quick and must not call the Reloader.
func WithReloadHook(hook func(error)) ReloaderOption { return func(r *Reloader) { r.hook = hook } }

// NewReloader loads files; want, if not nil, must accept the certificate's
// identity (a controller's certificate must say controller, an agent's its
// node name), at start and at every reload.
func NewReloader(files Files, want func(Identity) error, log *zap.Logger, opts ...ReloaderOption) (*Reloader, error) {
	r := &Reloader{files: files, want: want, log: log, clock: clockwork.NewRealClock()}
	r.sessions = &sessionCache{r: r}
	for _, o := range opts {
		o(r)
	}
	stamps, err := r.stat()
	if err != nil {
		return nil, err
	}
	m, err := r.load()
	if err != nil {
		return nil, err
	}
	r.stamps, r.cur, r.checked = stamps, m, r.clock.Now()
	return r, nil
}

func (r *Reloader) stat() ([3]os.FileInfo, error) {
	var st [3]os.FileInfo
	for i, p := range []string{r.files.Cert, r.files.Key, r.files.CA} {
		fi, err := os.Stat(p)
		if err != nil {
			return st, fmt.Errorf("tls: %w", err)
		}
		st[i] = fi
	}
	return st, nil
}

func (r *Reloader) load() (material, error) {
	cert, err := tls.LoadX509KeyPair(r.files.Cert, r.files.Key)
	if err != nil {
		return material{}, fmt.Errorf("tls: loading %s with key %s: %w", r.files.Cert, r.files.Key, err)
	}
	caPEM, err := os.ReadFile(r.files.CA)
	if err != nil {
		return material{}, fmt.Errorf("tls: reading CA: %w", err)
	}
	pool, caNotAfter, err := parseCAs(caPEM)
	if err != nil {
		return material{}, fmt.Errorf("tls: %s: %w", r.files.CA, err)
	}
	// Our own certificate must verify against the CA we trust, or peers
	// using the same CA will refuse it; say so now rather than at each
	// handshake.
	id, err := verify(append([]*x509.Certificate{cert.Leaf}, parseRest(cert)...), pool, r.clock.Now(), x509.ExtKeyUsageAny, "")
	if err != nil {
		return material{}, fmt.Errorf("tls: %s (checked against %s): %w: %w", r.files.Cert, r.files.CA, ErrOwnCertUntrusted, err)
	}
	if r.want != nil {
		if err := r.want(id); err != nil {
			return material{}, fmt.Errorf("tls: %s: %w", r.files.Cert, err)
		}
	}
	return material{cert: &cert, id: id, pool: pool, caNotAfter: caNotAfter}, nil
}

// parseCAs reads the certificates of a CA file (several during a CA
// rotation) into a pool, with when the last of them expires.
func parseCAs(data []byte) (*x509.CertPool, time.Time, error) {
	pool := x509.NewCertPool()
	var last time.Time
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("parsing a CA certificate: %w", err)
		}
		pool.AddCert(cert)
		if cert.NotAfter.After(last) {
			last = cert.NotAfter
		}
	}
	if last.IsZero() {
		return nil, time.Time{}, errors.New("holds no PEM certificate")
	}
	return pool, last, nil
}

// parseRest parses the intermediates that follow the leaf in a chain file.
func parseRest(cert tls.Certificate) []*x509.Certificate {
	var out []*x509.Certificate
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// current returns the material in use, first reloading it if the files
// changed since the last look (at most once per checkEvery).
func (r *Reloader) current() material {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	if now.Sub(r.checked) < checkEvery {
		return r.cur
	}
	r.checked = now
	stamps, err := r.stat()
	if err != nil {
		if !r.missing {
			r.log.Warn("tls files unreadable, keeping the loaded certificates", zap.Error(err))
		}
		r.missing = true
		return r.cur
	}
	r.missing = false
	if sameFiles(stamps, r.stamps) {
		return r.cur
	}
	// Remembered even if loading fails, so a broken set is reported once
	// and retried when the files change again (the key of a new pair
	// usually lands a moment after its certificate).
	r.stamps = stamps
	m, err := r.load()
	if r.hook != nil {
		r.hook(err)
	}
	switch {
	case errors.Is(err, ErrOwnCertUntrusted):
		// Not a rotation caught halfway: files that contradict each other.
		r.log.Error("tls reload refused: the new CA does not verify this daemon's own certificate; keeping the previous certificates and CA", zap.Error(err))
		return r.cur
	case err != nil:
		r.log.Warn("tls files changed but do not load, keeping the previous certificates", zap.Error(err))
		return r.cur
	}
	r.cur = m
	r.log.Info("tls certificates reloaded", zap.Stringer("identity", m.id), zap.Time("not_after", m.cert.Leaf.NotAfter))
	return m
}

// Refresh looks at the files now (at most once per second, like every
// use), so that a change is noticed without a handshake.
func (r *Reloader) Refresh() { r.current() }

// CANotAfter is when the last certificate of the CA in use expires: no
// peer certificate verifies after it.
func (r *Reloader) CANotAfter() time.Time { return r.current().caNotAfter }

func sameFiles(a, b [3]os.FileInfo) bool {
	for i := range a {
		if !os.SameFile(a[i], b[i]) || !a[i].ModTime().Equal(b[i].ModTime()) || a[i].Size() != b[i].Size() {
			return false
		}
	}
	return true
}

// NotAfter is when this daemon's own certificate, as loaded now, expires.
func (r *Reloader) NotAfter() time.Time { return r.current().cert.Leaf.NotAfter }

// Identity is who this daemon's own certificate speaks for.
func (r *Reloader) Identity() Identity { return r.current().id }

// VerifyClient verifies a peer's client certificate chain against the CA
// as currently loaded.
func (r *Reloader) VerifyClient(chain []*x509.Certificate) (Identity, error) {
	v, err := r.VerifyClientAgain(ChainOf(chain), ClientVerification{})
	return v.ID, err
}

// Chain gives a client's certificate chain, leaf first, when it must be
// verified in full. A caller may keep a chain it holds for long in a
// cheaper form than parsed (the controller keeps a relayed agent's as DER)
// and parse it only then.
type Chain func() []*x509.Certificate

// ChainOf is the Chain of a chain already parsed.
func ChainOf(certs []*x509.Certificate) Chain {
	return func() []*x509.Certificate { return certs }
}

// ClientVerification is a client chain's verification against the CA as
// loaded then (VerifyClientAgain).
type ClientVerification struct {
	ID Identity
	// Serial and IssuedAt are the leaf's (Serial, IssuedAt): what a
	// deny-list checks, without the certificate.
	Serial   string
	IssuedAt time.Time
	pool     *x509.CertPool
	w        window
}

// VerifyClientAgain is VerifyClient for a chain that prev verified (the
// zero value: never). While the same CA is loaded and every certificate of
// the chain prev built is within its validity, the chain verifies as it did,
// so it is neither asked for nor checked again: re-verifying every
// agent's connection each tls.reverify_interval would cost CPU in
// proportion to the cluster for no change.
func (r *Reloader) VerifyClientAgain(chain Chain, prev ClientVerification) (ClientVerification, error) {
	pool := r.current().pool
	now := r.clock.Now()
	if prev.pool != nil && prev.pool == pool && prev.w.holds(now) {
		return prev, nil
	}
	certs := chain()
	if len(certs) == 0 {
		return ClientVerification{}, ErrNoCertificate
	}
	id, w, err := verifyWindow(certs, pool, now, x509.ExtKeyUsageClientAuth, "")
	if err != nil {
		return ClientVerification{}, err
	}
	return ClientVerification{ID: id, Serial: Serial(certs[0]), IssuedAt: IssuedAt(certs[0]), pool: pool, w: w}, nil
}

// TicketEpoch is how long one session ticket key seals new tickets; a
// ticket opens for one more epoch after that.
const TicketEpoch = 24 * time.Hour

// ServerConfig is the controller's TLS configuration. It asks for a client
// certificate but lets the handshake finish without a valid one, so that
// the API can refuse the call with a status that says why
// (Unauthenticated) instead of a bare connection error; every call is then
// checked with VerifyClient.
//
// ticketKey, if not nil, gives the session ticket key of each TicketEpoch
// (counted from the Unix epoch). Agents that reconnect then resume their
// TLS session: no certificates sent, signed or verified in the handshake,
// which is most of its cost, and what makes every agent reconnecting to a
// restarted or new leader at once a storm. Keys derived from a secret that
// every replica shares open each other's tickets and survive restarts. A
// resumed session still carries the client's certificate chain, and every
// call verifies it again (VerifyClient), as it does for a full handshake.
func (r *Reloader) ServerConfig(ticketKey func(epoch int64) [32]byte) *tls.Config {
	conf := &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequestClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return r.current().cert, nil
		},
	}
	if ticketKey == nil {
		return conf
	}
	var epoch atomic.Int64
	rotate := func() {
		e := r.clock.Now().UnixNano() / int64(TicketEpoch)
		if epoch.Swap(e) != e {
			// The first key seals, both open.
			conf.SetSessionTicketKeys([][32]byte{ticketKey(e), ticketKey(e - 1)})
		}
	}
	rotate()
	conf.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		rotate()
		return nil, nil
	}
	return conf
}

// VerifyingServerConfig is the TLS configuration of a server that serves
// no peer without a valid client certificate (the relay's agent port):
// the handshake requires one, and fails unless its chain verifies against
// the CA as loaded now and accept, if not nil, accepts the verification
// (a deny-list's check, a role). VerifyConnection runs on resumed
// sessions too, with the chain of their full handshake, so a certificate
// revoked since is refused there as well. Before it is verified, a peer
// can make the server read no more than crypto/tls takes of a handshake
// message (64 KiB; 256 KiB for its certificates), within the caller's
// handshake deadline; a refusal fails the handshake with a TLS alert and
// nothing past it is read.
func (r *Reloader) VerifyingServerConfig(accept func(ClientVerification) error) *tls.Config {
	conf := r.ServerConfig(nil)
	conf.ClientAuth = tls.RequireAnyClientCert
	conf.VerifyConnection = func(cs tls.ConnectionState) error {
		v, err := r.VerifyClientAgain(ChainOf(cs.PeerCertificates), ClientVerification{})
		if err != nil {
			return err
		}
		if accept != nil {
			return accept(v)
		}
		return nil
	}
	return conf
}

// ClientConfig is the TLS configuration for dialing the controller at addr
// (host:port): it presents this daemon's certificate and accepts only a
// controller certificate, valid for addr's host and signed by the CA as
// currently loaded.
func (r *Reloader) ClientConfig(addr string) (*tls.Config, error) {
	return r.clientConfig(addr, RoleController)
}

// RelayClientConfig is ClientConfig for dialing the relay at addr: it
// accepts only a relay certificate.
func (r *Reloader) RelayClientConfig(addr string) (*tls.Config, error) {
	return r.clientConfig(addr, RoleRelay)
}

func (r *Reloader) clientConfig(addr string, want Role) (*tls.Config, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%s address %q: %w", want, addr, err)
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: host,
		// Shared by every connection of this daemon, so that a reconnect
		// resumes (see ServerConfig). VerifyConnection runs on resumed
		// sessions too.
		ClientSessionCache: r.sessions,
		// The standard verification reads a fixed RootCAs; VerifyConnection
		// below does the same checks against the reloadable CA.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.current().cert, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("%s at %s sent no certificate", want, addr)
			}
			id, err := verify(cs.PeerCertificates, r.current().pool, r.clock.Now(), x509.ExtKeyUsageServerAuth, host)
			if err != nil {
				return fmt.Errorf("%s at %s: %w", want, addr, err)
			}
			if id.Role != want {
				return fmt.Errorf("the server at %s presented the certificate of %s, not of a %s", addr, id, want)
			}
			return nil
		},
	}, nil
}

// AgentPeerServerConfig is the TLS configuration of an agent's listener for
// other agents (in-memory checkpoint replicas): VerifyingServerConfig,
// accepting only agent certificates. The agent presents its own (client)
// certificate as the server's: agents' certificates name no host.
func (r *Reloader) AgentPeerServerConfig() *tls.Config {
	return r.VerifyingServerConfig(func(v ClientVerification) error {
		if v.ID.Role != RoleAgent {
			return fmt.Errorf("only agents may connect to an agent's peer listener, not %s", v.ID)
		}
		return nil
	})
}

// AgentPeerClientConfig is the TLS configuration for dialing node's agent
// peer listener: it presents this daemon's certificate and accepts only
// the agent certificate of node, signed by the CA as currently loaded.
func (r *Reloader) AgentPeerClientConfig(node string) *tls.Config {
	want := Identity{Role: RoleAgent, Name: node}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// VerifyConnection below verifies the chain against the reloadable
		// CA; an agent's certificate names no host to check.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.current().cert, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("agent %s sent no certificate", node)
			}
			id, err := verify(cs.PeerCertificates, r.current().pool, r.clock.Now(), x509.ExtKeyUsageClientAuth, "")
			if err != nil {
				return fmt.Errorf("agent %s: %w", node, err)
			}
			if id != want {
				return fmt.Errorf("the peer listener of node %s presented the certificate of %s", node, id)
			}
			return nil
		},
	}
}
