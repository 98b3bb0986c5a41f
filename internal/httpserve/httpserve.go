// Package httpserve is the daemons' HTTP listener for operators' tools:
// Prometheus metrics (/metrics), liveness (/healthz) and readiness
// (/readyz), plus whatever a daemon mounts with Handle. It is separate from
// the gRPC port so that a scraper or a load balancer needs no cluster
// certificate, and loopback by default so that nothing is exposed until an
// operator chooses to.
package httpserve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/rdzv/rdzv/wire"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Config is the `http` section of a daemon's config.
type Config struct {
	// Listen is host:port; empty turns the listener off.
	Listen string `json:"listen"`
	// CertFile and KeyFile serve HTTPS instead of HTTP (both or neither).
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
	// ClientCAFile, with HTTPS, admits only clients presenting a
	// certificate that chains to it (Prometheus' tls_config cert_file).
	ClientCAFile string `json:"client_ca_file"`
}

// Enabled reports whether the listener is on.
func (c Config) Enabled() bool { return c.Listen != "" }

// Validate names the first problem per field; field is the config path
// ("http").
func (c Config) Validate(field string) error {
	var errs []error
	if c.Listen != "" {
		host, port, err := net.SplitHostPort(c.Listen)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.listen: %q is not host:port (empty turns the listener off): %w", field, c.Listen, err))
		} else if _, perr := strconv.ParseUint(port, 10, 16); perr != nil {
			errs = append(errs, wire.Fieldf(field+".listen", "%q has port %q, want a number 0-65535", c.Listen, port))
		} else if host != "" && net.ParseIP(host) == nil && !validHostname(host) {
			errs = append(errs, wire.Fieldf(field+".listen", "%q has host %q, want an IP address or a host name", c.Listen, host))
		}
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, fmt.Errorf("%s.cert_file, %s.key_file: give both or neither, got cert %q and key %q", field, field, c.CertFile, c.KeyFile))
	}
	if c.ClientCAFile != "" && c.CertFile == "" {
		errs = append(errs, wire.Fieldf(field+".client_ca_file", "%q needs %s.cert_file and %s.key_file (client certificates are verified over HTTPS only)", c.ClientCAFile, field, field))
	}
	return errors.Join(errs...)
}

// Private reports whether only this host, or only clients holding a
// certificate from ClientCAFile, can reach the listener: what may serve
// more than metrics and health (the controller's dashboard).
func (c Config) Private() bool {
	if c.ClientCAFile != "" {
		return true
	}
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func validHostname(h string) bool {
	if len(h) > 253 {
		return false
	}
	for _, r := range h {
		if !(r == '.' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// Readiness says why the daemon is not ready (nil: ready).
type Readiness func() error

// Server serves the endpoints. Handle may be called until Serve starts.
type Server struct {
	cfg   Config
	log   *zap.Logger
	mux   *http.ServeMux
	ready Readiness
	tls   *tls.Config
	// lis is set by Listen; guarded because tests ask for Addr from
	// another goroutine than the daemon's.
	mu  sync.Mutex
	lis net.Listener
}

// New builds a server exporting gatherer on /metrics and asking ready on
// /readyz. TLS files are read here, so that a bad one stops start-up.
func New(cfg Config, gatherer prometheus.Gatherer, ready Readiness, log *zap.Logger) (*Server, error) {
	s := &Server{cfg: cfg, log: log, mux: http.NewServeMux(), ready: ready}
	var err error
	if s.tls, err = s.tlsConfig(); err != nil {
		return nil, err
	}
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{
		// A collector that fails leaves its metrics out; the rest is
		// still worth scraping.
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      zap.NewStdLog(log.Named("metrics")),
	}))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprintln(w, "ok")
	})
	s.mux.HandleFunc("GET /readyz", s.readyz)
	return s, nil
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := s.ready(); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "not ready: %v\n", err)
		return
	}
	_, _ = fmt.Fprintln(w, "ready")
}

// Handle mounts h on pattern (net/http.ServeMux syntax), beside the
// built-in endpoints; for instance the controller's dashboard.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// tlsConfig is the HTTPS configuration; nil for plain HTTP.
func (s *Server) tlsConfig() (*tls.Config, error) {
	if s.cfg.CertFile == "" {
		return nil, nil
	}
	pair, err := loadKeyPair(s.cfg.CertFile, s.cfg.KeyFile, s.log)
	if err != nil {
		return nil, err
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: pair.get}
	if s.cfg.ClientCAFile != "" {
		pem, err := os.ReadFile(s.cfg.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("http.client_ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, wire.Fieldf("http.client_ca_file", "%s holds no PEM certificate", s.cfg.ClientCAFile)
		}
		conf.ClientCAs, conf.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return conf, nil
}

// Listen opens the listener, so that a port already taken stops start-up
// with an error naming it; Addr is valid from then on.
func (s *Server) Listen() error {
	lis, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("http.listen: %w", err)
	}
	if s.tls != nil {
		lis = tls.NewListener(lis, s.tls)
	}
	s.mu.Lock()
	s.lis = lis
	s.mu.Unlock()
	return nil
}

// Addr is where the server listens, once Listen returned.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lis.Addr()
}

// Start listens, then serves in the background until stop, which ends
// the server and returns how it failed, if it did: for a daemon whose
// metrics and health answer before its other parts start.
func (s *Server) Start(ctx context.Context) (stop func() error, err error) {
	if err := s.Listen(); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Serve(sctx) }()
	return func() error {
		cancel()
		return <-done
	}, nil
}

// maxHeaderBytes bounds a request's headers (net/http allows 4 KiB more).
const maxHeaderBytes = 64 << 10

// shutdownGrace bounds how long requests in flight may finish once the
// daemon stops.
const shutdownGrace = 5 * time.Second

// Serve serves on the listener opened by Listen until ctx ends, then lets
// requests in flight finish for up to shutdownGrace.
func (s *Server) Serve(ctx context.Context) error {
	// Every handler answers GET and reads no body. Headers are bounded
	// (net/http's default is 1 MiB), and so is how long an idle
	// connection stays; no ReadTimeout, which would end the dashboard's
	// event streams.
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes: maxHeaderBytes, IdleTimeout: 2 * time.Minute,
		ErrorLog: zap.NewStdLog(s.log.WithOptions(zap.IncreaseLevel(zap.WarnLevel)))}
	s.mu.Lock()
	lis := s.lis
	s.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	scheme := "http"
	if s.cfg.CertFile != "" {
		scheme = "https"
	}
	s.log.Info("serving metrics and health", zap.String("url", scheme+"://"+lis.Addr().String()),
		zap.Bool("client_certificates", s.cfg.ClientCAFile != ""))
	select {
	case err := <-done:
		return fmt.Errorf("serving http on %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving http on %s: %w", lis.Addr(), err)
	}
	return nil
}
