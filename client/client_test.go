package client_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/big"
	"net"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func TestConfigValidate(t *testing.T) {
	files := pki.Files{Cert: "/pki/me.crt", Key: "/pki/me.key", CA: "/pki/ca.crt"}
	tests := []struct {
		name string
		edit func(*client.Config)
		// want are substrings of the error; none means valid.
		want []string
	}{
		{name: "files", edit: func(c *client.Config) { c.TLS = &client.TLS{Files: files} }},
		{name: "tls config", edit: func(c *client.Config) { c.TLS = &client.TLS{Config: &tls.Config{}} }},
		{name: "insecure", edit: func(c *client.Config) { c.Insecure = true }},
		{name: "no endpoints", edit: func(c *client.Config) { c.Endpoints, c.Insecure = nil, true }, want: []string{"endpoints: at least one controller host:port is required"}},
		{name: "endpoint without port", edit: func(c *client.Config) { c.Endpoints, c.Insecure = []string{"a:7070", "b"}, true }, want: []string{`endpoints[1]: "b" is not host:port`}},
		{name: "no tls", want: []string{"tls: required"}},
		{name: "tls and insecure", edit: func(c *client.Config) { c.TLS, c.Insecure = &client.TLS{Files: files}, true }, want: []string{"tls: must not be set with insecure"}},
		{name: "files and config", edit: func(c *client.Config) { c.TLS = &client.TLS{Files: files, Config: &tls.Config{}} }, want: []string{"tls: set files or config, not both"}},
		{name: "missing key file", edit: func(c *client.Config) { c.TLS = &client.TLS{Files: pki.Files{Cert: files.Cert, CA: files.CA}} }, want: []string{"tls.key: required"}},
		{name: "relays", edit: func(c *client.Config) { c.Relays, c.TLS = []string{"relay:7071"}, &client.TLS{Files: files} }},
		{name: "relays for an insecure client", edit: func(c *client.Config) { c.Relays, c.Insecure = []string{"relay:7071"}, true }, want: []string{"relays: need tls"}},
		{name: "relay without port", edit: func(c *client.Config) { c.Relays, c.Insecure = []string{"relay"}, true }, want: []string{`relays[0]: "relay" is not host:port`}},
		{name: "relay at an endpoint", edit: func(c *client.Config) { c.Relays, c.Insecure = []string{"ctl:7070"}, true }, want: []string{`relays[0]: "ctl:7070" is also an endpoint`}},
		{name: "no dial timeout", edit: func(c *client.Config) { c.Insecure, c.DialTimeout = true, 0 }, want: []string{"dial_timeout: must be positive, got 0s"}},
		{name: "everything wrong at once", edit: func(c *client.Config) { c.Endpoints, c.DialTimeout = nil, -time.Second },
			want: []string{"endpoints:", "tls: required", "dial_timeout:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := client.DefaultConfig()
			cfg.Endpoints = []string{"ctl:7070"}
			if tt.edit != nil {
				tt.edit(&cfg)
			}
			err := cfg.Validate()
			if len(tt.want) == 0 {
				require.NoError(t, err)
				return
			}
			for _, w := range tt.want {
				require.ErrorContains(t, err, w)
			}
			_, err = client.New(cfg)
			require.Error(t, err, "New refuses what Validate refuses")
		})
	}
}

// testCA is a cluster CA whose certificates are valid now, as real
// handshakes need.
type testCA struct{ *pki.CA }

func newTestCA(t *testing.T) testCA {
	t.Helper()
	ca, err := pki.NewCA("test-ca", 24*time.Hour, time.Now())
	require.NoError(t, err)
	return testCA{ca}
}

func (ca testCA) issue(t *testing.T, id pki.Identity, ips ...net.IP) *pki.Issued {
	t.Helper()
	is, err := ca.Issue(pki.Request{Identity: id, IPs: ips, ValidFor: time.Hour, Now: time.Now()})
	require.NoError(t, err)
	return is
}

// files saves is and the CA certificate into a new directory.
func (ca testCA) files(t *testing.T, is *pki.Issued) pki.Files {
	t.Helper()
	dir := t.TempDir()
	cert, key, err := is.Save(filepath.Join(dir, "me"), false)
	require.NoError(t, err)
	require.NoError(t, ca.Save(dir, false))
	return pki.Files{Cert: cert, Key: key, CA: filepath.Join(dir, pki.CACertFile)}
}

func (ca testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// serverWithoutRole is a certificate from the cluster CA good for serving
// 127.0.0.1 but speaking for an agent: pki never issues one (an agent's
// certificate cannot serve), so only the client's role check refuses it.
func (ca testCA) serverWithoutRole(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7),
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		URIs:         []*url.URL{pki.Identity{Role: pki.RoleAgent, Name: "node-a"}.URI()},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Over mutual TLS a client accepts only a controller's certificate valid
// for the address dialled, with its TLS given as files or as a tls.Config.
func TestTLS(t *testing.T) {
	ca := newTestCA(t)
	loopback := net.IPv4(127, 0, 0, 1)
	controller := ca.issue(t, pki.Identity{Role: pki.RoleController, Name: "ctl"}, loopback)
	operator := ca.issue(t, pki.Identity{Role: pki.RoleOperator, Name: "alice"})
	asTLS := func(is *pki.Issued) tls.Certificate {
		return tls.Certificate{Certificate: [][]byte{is.Cert.Raw}, PrivateKey: is.Key, Leaf: is.Cert}
	}
	viaFiles := func(t *testing.T) *client.TLS { return &client.TLS{Files: ca.files(t, operator)} }
	viaConfig := func(*testing.T) *client.TLS {
		return &client.TLS{Config: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{asTLS(operator)}, RootCAs: ca.pool()}}
	}
	tests := []struct {
		name   string
		server tls.Certificate
		tls    func(*testing.T) *client.TLS
		// host is what the client dials; the server listens on loopback.
		host    string
		wantErr string
	}{
		{name: "files", server: asTLS(controller), tls: viaFiles, host: "127.0.0.1"},
		{name: "tls config", server: asTLS(controller), tls: viaConfig, host: "127.0.0.1"},
		{name: "files: host not in the certificate", server: asTLS(controller), tls: viaFiles, host: "localhost", wantErr: "localhost"},
		{name: "tls config: host not in the certificate", server: asTLS(controller), tls: viaConfig, host: "localhost", wantErr: "localhost"},
		{name: "files: not a controller", server: ca.serverWithoutRole(t), tls: viaFiles, host: "127.0.0.1", wantErr: "not of a controller"},
		{name: "tls config: not a controller", server: ca.serverWithoutRole(t), tls: viaConfig, host: "127.0.0.1", wantErr: "not of a controller"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srvConf := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{tt.server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.pool()}
			addr, _ := serve(t, func(s *grpc.Server) { rdzvv1.RegisterJobServiceServer(s, &electing{}) }, grpc.Creds(credentials.NewTLS(srvConf)))
			_, port, err := net.SplitHostPort(addr)
			require.NoError(t, err)
			cfg := client.DefaultConfig()
			cfg.Endpoints, cfg.TLS, cfg.Logger = []string{net.JoinHostPort(tt.host, port)}, tt.tls(t), zaptest.NewLogger(t)
			c, err := client.New(cfg)
			require.NoError(t, err)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := c.ListJobs(ctx, &rdzvv1.ListJobsRequest{})
			if tt.wantErr != "" {
				require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Len(t, resp.GetJobs(), 1)
		})
	}
}

// A client whose own certificate is not the one expected is refused at
// New, before any call.
func TestNewChecksOwnIdentity(t *testing.T) {
	ca := newTestCA(t)
	files := ca.files(t, ca.issue(t, pki.Identity{Role: pki.RoleAgent, Name: "node-b"}))
	errWrongNode := errors.New("wrong node")
	cfg := client.DefaultConfig()
	cfg.Endpoints = []string{"ctl:7070"}
	cfg.TLS = &client.TLS{Files: files, Identity: func(id pki.Identity) error {
		if id != (pki.Identity{Role: pki.RoleAgent, Name: "node-a"}) {
			return errWrongNode
		}
		return nil
	}}
	_, err := client.New(cfg)
	require.ErrorIs(t, err, errWrongNode)
}
