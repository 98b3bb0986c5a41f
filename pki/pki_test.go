package pki_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/pki"
)

var now = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func newCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("test-ca", 10*365*24*time.Hour, now)
	require.NoError(t, err)
	return ca
}

func issue(t *testing.T, ca *pki.CA, role pki.Role, name string) *pki.Issued {
	t.Helper()
	is, err := ca.Issue(pki.Request{Identity: pki.Identity{Role: role, Name: name}, ValidFor: 24 * time.Hour, Now: now})
	require.NoError(t, err)
	return is
}

func pool(ca *pki.CA) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// signRaw signs a client certificate with whatever URIs, bypassing Issue's
// checks, as a careless or hostile CA operator could.
func signRaw(t *testing.T, ca *pki.CA, uris ...string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "raw"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, u := range uris {
		parsed, err := url.Parse(u)
		require.NoError(t, err)
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return cert
}

func TestIssueCarriesIdentity(t *testing.T) {
	ca := newCA(t)
	for _, role := range pki.Roles {
		t.Run(string(role), func(t *testing.T) {
			is := issue(t, ca, role, "gpu-01")
			require.Equal(t, []*url.URL{{Scheme: "rdzv", Host: string(role), Path: "/gpu-01"}}, is.Cert.URIs)
			id, err := pki.Verify([]*x509.Certificate{is.Cert}, pool(ca), now)
			require.NoError(t, err)
			require.Equal(t, pki.Identity{Role: role, Name: "gpu-01"}, id)
			_, serverErr := is.Cert.Verify(x509.VerifyOptions{Roots: pool(ca), CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			if role == pki.RoleController || role == pki.RoleRelay {
				require.NoError(t, serverErr, "a controller or relay certificate serves")
				require.Contains(t, is.Cert.DNSNames, "gpu-01", "the server's name is a DNS SAN")
			} else {
				require.Error(t, serverErr, "only a controller or relay certificate may serve")
			}
		})
	}
}

func TestIssueRefuses(t *testing.T) {
	ca := newCA(t)
	tests := []struct {
		name    string
		req     pki.Request
		wantErr string
	}{
		{"bad role", pki.Request{Identity: pki.Identity{Role: "admin", Name: "a"}, ValidFor: time.Hour}, `role: want controller, agent, operator, viewer or relay, got "admin"`},
		{"uppercase name", pki.Request{Identity: pki.Identity{Role: pki.RoleAgent, Name: "GPU01"}, ValidFor: time.Hour}, `name: must be a DNS-1123 label`},
		{"name with slash", pki.Request{Identity: pki.Identity{Role: pki.RoleOperator, Name: "a/b"}, ValidFor: time.Hour}, `name: must be a DNS-1123 label`},
		{"empty name", pki.Request{Identity: pki.Identity{Role: pki.RoleViewer}, ValidFor: time.Hour}, `name: must be a DNS-1123 label`},
		{"zero validity", pki.Request{Identity: pki.Identity{Role: pki.RoleAgent, Name: "a"}}, "valid_for: must be positive"},
		{"outlives the CA", pki.Request{Identity: pki.Identity{Role: pki.RoleAgent, Name: "a"}, ValidFor: 20 * 365 * 24 * time.Hour}, "would outlive the CA"},
		{"agent with a host name", pki.Request{Identity: pki.Identity{Role: pki.RoleAgent, Name: "a"}, ValidFor: time.Hour, DNSNames: []string{"a.example"}}, "only controller and relay certificates name hosts"},
		{"operator with an IP", pki.Request{Identity: pki.Identity{Role: pki.RoleOperator, Name: "a"}, ValidFor: time.Hour, IPs: []net.IP{net.IPv4(10, 0, 0, 1)}}, "only controller and relay certificates name hosts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.Now = now
			_, err := ca.Issue(tt.req)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestVerifyRefuses(t *testing.T) {
	ca := newCA(t)
	foreign := newCA(t)
	good := issue(t, ca, pki.RoleAgent, "gpu-01").Cert
	tests := []struct {
		name    string
		chain   []*x509.Certificate
		at      time.Time
		wantIs  error
		wantErr string
	}{
		{"no certificate", nil, now, pki.ErrNoCertificate, "no client certificate"},
		{"expired", []*x509.Certificate{good}, now.Add(25 * time.Hour), nil, "certificate agent/gpu-01 expired at 2030-01-03T03:04:05Z"},
		{"not yet valid", []*x509.Certificate{good}, now.Add(-time.Hour), nil, "is not valid before"},
		{"foreign CA", []*x509.Certificate{issue(t, foreign, pki.RoleAgent, "gpu-01").Cert}, now, pki.ErrForeignCA, "certificate not signed by the cluster CA"},
		{"no identity", []*x509.Certificate{signRaw(t, ca, "https://example.com/x")}, now, pki.ErrNoIdentity, "carries no rdzv identity"},
		{"two identities", []*x509.Certificate{signRaw(t, ca, "rdzv://agent/a", "rdzv://operator/b")}, now, nil, "has 2 rdzv identities"},
		{"unknown role", []*x509.Certificate{signRaw(t, ca, "rdzv://root/a")}, now, nil, "malformed rdzv identity"},
		{"nested name", []*x509.Certificate{signRaw(t, ca, "rdzv://agent/a/b")}, now, nil, "malformed rdzv identity"},
		{"the CA certificate itself", []*x509.Certificate{ca.Cert}, now, pki.ErrNoIdentity, "carries no rdzv identity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := pki.Verify(tt.chain, pool(ca), tt.at)
			require.ErrorContains(t, err, tt.wantErr)
			if tt.wantIs != nil {
				require.ErrorIs(t, err, tt.wantIs)
			}
		})
	}
	var ve *pki.ValidityError
	_, err := pki.Verify([]*x509.Certificate{good}, pool(ca), now.Add(25*time.Hour))
	require.ErrorAs(t, err, &ve)
	require.Equal(t, good.NotAfter, ve.NotAfter)
}

func TestSaveAndLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	ca := newCA(t)
	require.NoError(t, ca.Save(dir, false))
	fi, err := os.Stat(filepath.Join(dir, pki.CAKeyFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the CA key is private")

	err = newCA(t).Save(dir, false)
	require.ErrorIs(t, err, pki.ErrExists, "a second init must not replace the CA")
	loaded, err := pki.LoadCA(dir)
	require.NoError(t, err)
	require.True(t, loaded.Cert.Equal(ca.Cert), "the refused save changed nothing")

	is := issue(t, loaded, pki.RoleAgent, "gpu-01")
	prefix := pki.DefaultOut(dir, pki.Identity{Role: pki.RoleAgent, Name: "gpu-01"})
	certPath, keyPath, err := is.Save(prefix, false)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "agent-gpu-01.crt"), certPath)
	fi, err = os.Stat(keyPath)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	_, _, err = is.Save(prefix, false)
	require.ErrorIs(t, err, pki.ErrExists)
	_, _, err = issue(t, loaded, pki.RoleAgent, "gpu-01").Save(prefix, true)
	require.NoError(t, err, "--force replaces")
	got, err := pki.ReadCert(certPath)
	require.NoError(t, err)
	require.False(t, got.Equal(is.Cert))

	// A directory whose key does not belong to its certificate is refused.
	other := t.TempDir()
	require.NoError(t, newCA(t).Save(other, false))
	data, err := os.ReadFile(filepath.Join(dir, pki.CAKeyFile))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(other, pki.CAKeyFile), data, 0o600))
	_, err = pki.LoadCA(other)
	require.ErrorContains(t, err, "are not a CA certificate and its key")
}

func TestFilesValidate(t *testing.T) {
	err := pki.Files{Cert: "a.crt"}.Validate("tls")
	require.ErrorContains(t, err, "tls.key: required")
	require.ErrorContains(t, err, "tls.ca: required")
	require.NotContains(t, err.Error(), "tls.cert")
	require.NoError(t, pki.Files{Cert: "a", Key: "b", CA: "c"}.Validate("tls"))
}

func TestParseSerial(t *testing.T) {
	tests := []struct {
		in, want, wantErr string
	}{
		{in: "1f2e3d", want: "1f2e3d"},
		{in: "1F2E3D", want: "1f2e3d"},
		{in: "0x001f:2e:3d", want: "1f2e3d"},
		{in: "1F:2E:3D", want: "1f2e3d"},
		{in: "", wantErr: "serial: want a certificate serial number in hex"},
		{in: "0x", wantErr: "serial: want a certificate serial number in hex"},
		{in: "-1f", wantErr: "serial: want a certificate serial number in hex"},
		{in: "+1f", wantErr: "serial: want a certificate serial number in hex"},
		{in: "1_f", wantErr: "serial: want a certificate serial number in hex"},
		{in: "xyz", wantErr: "serial: want a certificate serial number in hex"},
		{in: "0", wantErr: "serial: a certificate serial number is positive"},
		{in: strings.Repeat("ff", 20), want: strings.Repeat("ff", 20)},
		{in: "1" + strings.Repeat("00", 20), wantErr: "at most 20 bytes"},
		{in: strings.Repeat("f", 100), wantErr: "serial: at most 20 bytes in hex, got 100 characters"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := pki.ParseSerial(tt.in)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
	cert := issue(t, newCA(t), pki.RoleAgent, "a").Cert
	got, err := pki.ParseSerial(fmt.Sprintf("%X", cert.SerialNumber))
	require.NoError(t, err)
	require.Equal(t, pki.Serial(cert), got, "what rdzvctl pki show prints parses back")
}

func TestParseIdentity(t *testing.T) {
	tests := []struct {
		in      string
		want    pki.Identity
		wantErr string
	}{
		{in: "agent/gpu-01", want: pki.Identity{Role: pki.RoleAgent, Name: "gpu-01"}},
		{in: "operator/alice", want: pki.Identity{Role: pki.RoleOperator, Name: "alice"}},
		{in: "gpu-01", wantErr: "identity: want ROLE/NAME"},
		{in: "admin/bob", wantErr: `role: want controller, agent, operator, viewer or relay, got "admin"`},
		{in: "agent/gpu/01", wantErr: "name: must be a DNS-1123 label"},
		{in: "agent/", wantErr: "name: must be a DNS-1123 label"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := pki.ParseIdentity(tt.in)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

// TestIssuedAt: the backdating of NotBefore is undone, to the second.
func TestIssuedAt(t *testing.T) {
	is, err := newCA(t).Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleAgent, Name: "a"}, ValidFor: time.Hour, Now: now.Add(700 * time.Millisecond)})
	require.NoError(t, err)
	require.Equal(t, now, pki.IssuedAt(is.Cert))
	require.True(t, is.Cert.NotBefore.Before(now), "NotBefore itself is backdated")
}
