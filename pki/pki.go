// Package pki is rdzv's small certificate authority: it creates a cluster
// CA, issues certificates that carry an rdzv identity (a role and a name),
// verifies peer certificates against the CA and reads the identity back.
//
// The identity is one URI SAN, rdzv://ROLE/NAME, so it cannot be confused
// with a hostname or be forged by a choice of subject: only the CA decides
// it. Keys are ECDSA P-256.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/rdzv/rdzv/wire"
)

// Role is what an identity may do; the controller authorizes by role.
type Role string

const (
	// RoleController serves the API. Its certificate is also a valid etcd
	// client certificate.
	RoleController Role = "controller"
	// RoleAgent is one node's agent; the name is the node name.
	RoleAgent Role = "agent"
	// RoleOperator reads and changes jobs and nodes.
	RoleOperator Role = "operator"
	// RoleViewer only reads.
	RoleViewer Role = "viewer"
	// RoleRelay carries the streams of the agents connected to it to the
	// controller over one connection (package relay). It verifies each
	// agent's certificate and forwards it with the stream; the controller
	// verifies it again and lets the stream speak for that agent's node
	// only. Like the controller's, its certificate names the hosts agents
	// dial.
	RoleRelay Role = "relay"
)

// Roles lists every role, in the order help texts show them.
var Roles = []Role{RoleController, RoleAgent, RoleOperator, RoleViewer, RoleRelay}

// Serves says whether role's certificates name hosts that clients dial.
func (r Role) Serves() bool { return r == RoleController || r == RoleRelay }

// ParseRole checks a role given by an operator.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("role: want controller, agent, operator, viewer or relay, got %q", s)
}

// uriScheme marks rdzv identities among a certificate's URI SANs.
const uriScheme = "rdzv"

// clockSkew backdates new certificates so that a peer whose clock is a
// little behind does not reject them as not yet valid.
const clockSkew = 5 * time.Minute

// Identity is who a certificate speaks for.
type Identity struct {
	Role Role
	Name string
}

func (id Identity) String() string { return string(id.Role) + "/" + id.Name }

// URI is the identity as it is written into certificates.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: uriScheme, Host: string(id.Role), Path: "/" + id.Name}
}

// Validate checks the role and that the name is a DNS-1123 label: agents
// are named after their node, and one rule for every role keeps names
// unambiguous in logs and file names.
func (id Identity) Validate() error {
	if _, err := ParseRole(string(id.Role)); err != nil {
		return err
	}
	if fe := wire.ValidateName("name", id.Name); fe != nil {
		return fe
	}
	return nil
}

// Verification failures, all of which the controller answers with
// Unauthenticated.
var (
	ErrNoCertificate = errors.New("no client certificate: connect with a certificate issued by `rdzvctl pki issue`")
	ErrForeignCA     = errors.New("certificate not signed by the cluster CA")
	ErrNoIdentity    = errors.New("certificate carries no rdzv identity (a rdzv://ROLE/NAME URI SAN); issue it with `rdzvctl pki issue`")
)

// ValidityError is a certificate used outside its validity period.
type ValidityError struct {
	Subject   string
	NotBefore time.Time
	NotAfter  time.Time
	Now       time.Time
}

func (e *ValidityError) Error() string {
	if e.Now.Before(e.NotBefore) {
		return fmt.Sprintf("certificate %s is not valid before %s (now %s)", e.Subject, e.NotBefore.UTC().Format(time.RFC3339), e.Now.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("certificate %s expired at %s", e.Subject, e.NotAfter.UTC().Format(time.RFC3339))
}

// IdentityOf reads the rdzv identity of a certificate. It does not verify
// the certificate: use Verify for a peer's.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var found []Identity
	for _, u := range cert.URIs {
		if u.Scheme != uriScheme {
			continue
		}
		id := Identity{Role: Role(u.Host), Name: u.Path}
		if len(id.Name) > 0 && id.Name[0] == '/' {
			id.Name = id.Name[1:]
		}
		if id.Validate() != nil || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return Identity{}, fmt.Errorf("certificate has a malformed rdzv identity %q", u.String())
		}
		found = append(found, id)
	}
	switch len(found) {
	case 0:
		return Identity{}, ErrNoIdentity
	case 1:
		return found[0], nil
	}
	return Identity{}, fmt.Errorf("certificate has %d rdzv identities; exactly one is allowed", len(found))
}

// Verify checks a peer's client certificate chain (leaf first) against the
// cluster CA at time now and returns the identity it speaks for.
func Verify(chain []*x509.Certificate, roots *x509.CertPool, now time.Time) (Identity, error) {
	if len(chain) == 0 {
		return Identity{}, ErrNoCertificate
	}
	return verify(chain, roots, now, x509.ExtKeyUsageClientAuth, "")
}

func verify(chain []*x509.Certificate, roots *x509.CertPool, now time.Time, usage x509.ExtKeyUsage, dnsName string) (Identity, error) {
	id, _, err := verifyWindow(chain, roots, now, usage, dnsName)
	return id, err
}

// window is when every certificate of a verified chain, root included, is
// valid: the chain verifies against the same roots at any time within it.
type window struct{ from, until time.Time }

func (w window) holds(now time.Time) bool { return !now.Before(w.from) && !now.After(w.until) }

// verifyWindow is verify, also returning the window of the chain it built.
func verifyWindow(chain []*x509.Certificate, roots *x509.CertPool, now time.Time, usage x509.ExtKeyUsage, dnsName string) (Identity, window, error) {
	leaf := chain[0]
	// Checked first, for a message that says when, not "invalid".
	if now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return Identity{}, window{}, &ValidityError{Subject: leaf.Subject.CommonName, NotBefore: leaf.NotBefore, NotAfter: leaf.NotAfter, Now: now}
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	chains, err := verifyApart(leaf, x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}, DNSName: dnsName})
	var unknown x509.UnknownAuthorityError
	switch {
	case errors.As(err, &unknown):
		return Identity{}, window{}, fmt.Errorf("%s: %w", leaf.Subject.CommonName, ErrForeignCA)
	case err != nil:
		return Identity{}, window{}, fmt.Errorf("verifying certificate %s: %w", leaf.Subject.CommonName, err)
	}
	w := window{from: leaf.NotBefore, until: leaf.NotAfter}
	for _, c := range chains[0] {
		if c.NotBefore.After(w.from) {
			w.from = c.NotBefore
		}
		if c.NotAfter.Before(w.until) {
			w.until = c.NotAfter
		}
	}
	id, err := IdentityOf(leaf)
	return id, w, err
}

// CA is a loaded cluster certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// NewCA creates a self-signed CA valid from now for validFor.
func NewCA(commonName string, validFor time.Duration, now time.Time) (*CA, error) {
	if validFor <= 0 {
		return nil, fmt.Errorf("valid_for: must be positive, got %s", validFor)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"rdzv"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validFor),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing new CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Request describes a certificate to issue.
type Request struct {
	Identity Identity
	// DNSNames and IPs are the names clients dial; only controller
	// certificates are served, so only they may have any.
	DNSNames []string
	IPs      []net.IP
	ValidFor time.Duration
	Now      time.Time
}

// Issued is a new certificate and its private key.
type Issued struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// Issue signs a certificate for req. A controller's certificate works as a
// server and as a client (for etcd); every other role only as a client, so
// no agent or operator certificate can ever pose as the controller.
func (ca *CA) Issue(req Request) (*Issued, error) {
	if err := req.Identity.Validate(); err != nil {
		return nil, err
	}
	if req.ValidFor <= 0 {
		return nil, fmt.Errorf("valid_for: must be positive, got %s", req.ValidFor)
	}
	if notAfter := req.Now.Add(req.ValidFor); notAfter.After(ca.Cert.NotAfter) {
		return nil, fmt.Errorf("valid_for: %s would outlive the CA, which expires at %s", req.ValidFor, ca.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	dns := req.DNSNames
	if req.Identity.Role.Serves() {
		usage = append(usage, x509.ExtKeyUsageServerAuth)
		// A server's name is usually its hostname.
		dns = append([]string{req.Identity.Name}, dns...)
	} else if len(dns) > 0 || len(req.IPs) > 0 {
		return nil, fmt.Errorf("dns/ip: only controller and relay certificates name hosts; a %s certificate cannot", req.Identity.Role)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		// The subject is for people reading the certificate; the URI SAN is
		// what the controller trusts.
		Subject:     pkix.Name{CommonName: req.Identity.String(), Organization: []string{"rdzv"}, OrganizationalUnit: []string{string(req.Identity.Role)}},
		NotBefore:   req.Now.Add(-clockSkew),
		NotAfter:    req.Now.Add(req.ValidFor),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: usage,
		URIs:        []*url.URL{req.Identity.URI()},
		DNSNames:    dns,
		IPAddresses: req.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing certificate for %s: %w", req.Identity, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing new certificate: %w", err)
	}
	return &Issued{Cert: cert, Key: key}, nil
}

// IssuedAt is when a certificate of this package was issued: Issue
// backdates NotBefore by clockSkew. Revoking an identity revokes its
// certificates issued before a time; one issued right after must not count
// as earlier because of the backdating.
func IssuedAt(cert *x509.Certificate) time.Time { return cert.NotBefore.Add(clockSkew) }

// maxSerialBytes is the longest serial number RFC 5280 allows.
const maxSerialBytes = 20

// Serial is a certificate's serial number as rdzv shows and stores it:
// lowercase hex without leading zeros.
func Serial(cert *x509.Certificate) string { return cert.SerialNumber.Text(16) }

// ParseSerial reads a serial number given in hex, as `rdzvctl pki show`
// prints it, or with colons and any case as openssl does, with or without
// a 0x prefix; it returns it in the form Serial gives.
func ParseSerial(s string) (string, error) {
	if len(s) > 2+3*maxSerialBytes {
		return "", fmt.Errorf("serial: at most %d bytes in hex, got %d characters", maxSerialBytes, len(s))
	}
	hex := strings.ReplaceAll(strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X"), ":", "")
	n, ok := new(big.Int).SetString(hex, 16)
	if !ok || hex == "" || hex[0] == '+' || hex[0] == '-' || strings.Contains(hex, "_") {
		return "", fmt.Errorf("serial: want a certificate serial number in hex (as rdzvctl pki show prints it), got %q", s)
	}
	if n.Sign() <= 0 || len(n.Bytes()) > maxSerialBytes {
		return "", fmt.Errorf("serial: a certificate serial number is positive and at most %d bytes, got %q", maxSerialBytes, s)
	}
	return n.Text(16), nil
}

// ParseIdentity reads an identity written ROLE/NAME.
func ParseIdentity(s string) (Identity, error) {
	role, name, ok := strings.Cut(s, "/")
	if !ok {
		return Identity{}, fmt.Errorf("identity: want ROLE/NAME (e.g. agent/gpu-01), got %q", s)
	}
	id := Identity{Role: Role(role), Name: name}
	if err := id.Validate(); err != nil {
		return Identity{}, fmt.Errorf("identity %q: %w", s, err)
	}
	return id, nil
}

func newSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	return serial, nil
}

// verifyApart verifies leaf on a goroutine of its own. Checking an ECDSA
// signature grows the stack it runs on (P-256's arithmetic keeps its
// tables there), and the callers are streams' handlers, which then wait
// for weeks using a few hundred bytes of it. Their stacks stayed grown
// until collections shrank them, by half per collection: a relay or
// controller with thousands of agents would hold far more stack than
// they use, and copying the stacks smaller falls on the collections,
// which its goroutines mostly do themselves, stalling heartbeats. This
// goroutine's stack is freed with it, for the next.
func verifyApart(leaf *x509.Certificate, opts x509.VerifyOptions) ([][]*x509.Certificate, error) {
	type result struct {
		chains [][]*x509.Certificate
		err    error
	}
	done := make(chan result, 1)
	go func() {
		chains, err := leaf.Verify(opts)
		done <- result{chains, err}
	}()
	r := <-done
	return r.chains, r.err
}
