package httpserve_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/rdzv/rdzv/internal/httpserve"
	"github.com/rdzv/rdzv/pki"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  httpserve.Config
		want string // the field named in the error; "" for none
	}{
		{"off", httpserve.Config{}, ""},
		{"loopback", httpserve.Config{Listen: "127.0.0.1:9401"}, ""},
		{"any port", httpserve.Config{Listen: ":0"}, ""},
		{"host name", httpserve.Config{Listen: "localhost:9401"}, ""},
		{"no port", httpserve.Config{Listen: "127.0.0.1"}, "http.listen"},
		{"port not a number", httpserve.Config{Listen: "127.0.0.1:metrics"}, "http.listen"},
		{"port too big", httpserve.Config{Listen: "127.0.0.1:70000"}, "http.listen"},
		{"bad host", httpserve.Config{Listen: "exa mple:80"}, "http.listen"},
		{"cert without key", httpserve.Config{Listen: ":1", CertFile: "c"}, "http.cert_file"},
		{"client ca without cert", httpserve.Config{Listen: ":1", ClientCAFile: "ca"}, "http.client_ca_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate("http")
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// serve runs s until the test ends and returns its base URL.
func serve(t *testing.T, s *httpserve.Server, scheme string) string {
	t.Helper()
	stop, err := s.Start(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, stop()) })
	return scheme + "://" + s.Addr().String()
}

func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestEndpoints(t *testing.T) {
	reg := httpserve.NewRegistry()
	hits := prometheus.NewCounter(prometheus.CounterOpts{Name: "rdzv_test_hits_total", Help: "test"})
	reg.MustRegister(hits)
	hits.Add(3)
	var notReady error = errors.New("etcd unreachable")
	s, err := httpserve.New(httpserve.Config{Listen: "127.0.0.1:0"}, reg, func() error { return notReady }, zaptest.NewLogger(t))
	require.NoError(t, err)
	s.Handle("GET /extra", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "mounted") }))
	base := serve(t, s, "http")
	c := &http.Client{Timeout: 10 * time.Second}

	code, body := get(t, c, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body = get(t, c, base+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "etcd unreachable", "the body says why")
	notReady = nil
	code, _ = get(t, c, base+"/readyz")
	require.Equal(t, http.StatusOK, code)
	code, body = get(t, c, base+"/extra")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "mounted", body)

	resp, err := c.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 3.0, families["rdzv_test_hits_total"].GetMetric()[0].GetCounter().GetValue())
	require.Equal(t, 1.0, families["rdzv_build_info"].GetMetric()[0].GetGauge().GetValue())
	require.Contains(t, families, "go_goroutines")
}

func TestClientCertificates(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, err := pki.NewCA("test-ca", 2*time.Hour, now)
	require.NoError(t, err)
	require.NoError(t, ca.Save(dir, false))
	save := func(id pki.Identity, ips ...net.IP) (cert, key string) {
		is, err := ca.Issue(pki.Request{Identity: id, IPs: ips, ValidFor: time.Hour, Now: now})
		require.NoError(t, err)
		cert, key, err = is.Save(pki.DefaultOut(dir, id), false)
		require.NoError(t, err)
		return cert, key
	}
	srvCert, srvKey := save(pki.Identity{Role: pki.RoleController, Name: "c"}, net.IPv4(127, 0, 0, 1))
	cliCert, cliKey := save(pki.Identity{Role: pki.RoleViewer, Name: "prometheus"})
	caFile := filepath.Join(dir, pki.CACertFile)

	s, err := httpserve.New(httpserve.Config{Listen: "127.0.0.1:0", CertFile: srvCert, KeyFile: srvKey, ClientCAFile: caFile},
		prometheus.NewRegistry(), func() error { return nil }, zaptest.NewLogger(t))
	require.NoError(t, err)
	base := serve(t, s, "https")

	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	anonymous := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	t.Cleanup(anonymous.CloseIdleConnections)
	_, err = anonymous.Get(base + "/healthz")
	require.Error(t, err, "a client without a certificate is refused in the handshake")

	pair, err := tls.LoadX509KeyPair(cliCert, cliKey)
	require.NoError(t, err)
	withCert := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}}}}
	t.Cleanup(withCert.CloseIdleConnections)
	code, _ := get(t, withCert, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
}

func TestBadTLSFilesStopStartUp(t *testing.T) {
	_, err := httpserve.New(httpserve.Config{Listen: "127.0.0.1:0", CertFile: "/nonexistent.crt", KeyFile: "/nonexistent.key"},
		prometheus.NewRegistry(), func() error { return nil }, zaptest.NewLogger(t))
	require.ErrorContains(t, err, "http.cert_file")
}

func TestPortTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	s, err := httpserve.New(httpserve.Config{Listen: l.Addr().String()}, prometheus.NewRegistry(), func() error { return nil }, zaptest.NewLogger(t))
	require.NoError(t, err)
	require.ErrorContains(t, s.Listen(), "http.listen")
	_, err = s.Start(context.Background())
	require.ErrorContains(t, err, "http.listen", "Start stops at the taken port too")
}

// A certificate renewed in place is served from a later handshake on,
// without a restart.
func TestCertificateReload(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, err := pki.NewCA("test-ca", 2*time.Hour, now)
	require.NoError(t, err)
	id := pki.Identity{Role: pki.RoleController, Name: "c"}
	issue := func() *pki.Issued {
		is, err := ca.Issue(pki.Request{Identity: id, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, ValidFor: time.Hour, Now: now})
		require.NoError(t, err)
		_, _, err = is.Save(pki.DefaultOut(dir, id), true)
		require.NoError(t, err)
		return is
	}
	first := issue()
	cert, key := pki.DefaultOut(dir, id)+".crt", pki.DefaultOut(dir, id)+".key"
	s, err := httpserve.New(httpserve.Config{Listen: "127.0.0.1:0", CertFile: cert, KeyFile: key},
		prometheus.NewRegistry(), func() error { return nil }, zaptest.NewLogger(t))
	require.NoError(t, err)
	serve(t, s, "https")
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	served := func() string {
		conn, err := tls.Dial("tcp", s.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
		require.NoError(t, err)
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	require.Equal(t, first.Cert.SerialNumber.String(), served())

	second := issue()
	require.NotEqual(t, first.Cert.SerialNumber, second.Cert.SerialNumber)
	require.Eventually(t, func() bool { return served() == second.Cert.SerialNumber.String() }, 30*time.Second, 50*time.Millisecond,
		"the renewed certificate is never served")
}

func TestConfigPrivate(t *testing.T) {
	for _, tc := range []struct {
		cfg  httpserve.Config
		want bool
	}{
		{httpserve.Config{Listen: "127.0.0.1:9401"}, true},
		{httpserve.Config{Listen: "[::1]:9401"}, true},
		{httpserve.Config{Listen: "localhost:9401"}, true},
		{httpserve.Config{Listen: ":9401"}, false},
		{httpserve.Config{Listen: "0.0.0.0:9401"}, false},
		{httpserve.Config{Listen: "10.0.0.5:9401"}, false},
		{httpserve.Config{Listen: "10.0.0.5:9401", CertFile: "c", KeyFile: "k", ClientCAFile: "ca"}, true},
		{httpserve.Config{Listen: "10.0.0.5:9401", CertFile: "c", KeyFile: "k"}, false},
	} {
		require.Equal(t, tc.want, tc.cfg.Private(), "%+v", tc.cfg)
	}
}
