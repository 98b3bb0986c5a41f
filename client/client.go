// Package client is the Go client of the rdzv API, used by rdzvctl and the
// agent, and meant for programs of your own that start, watch and stop
// jobs.
//
// A Client talks to one controller or to a set of replicas: each call goes
// to the leading one, following a follower's redirect, and a call made
// while no controller leads (an election after a failover) is retried
// until one does, within the call's deadline. Calls are mutual TLS with a
// certificate from the cluster CA (`rdzvctl pki issue operator NAME`), and
// the client accepts only a controller's certificate valid for the address
// it dialled.
//
//	cfg := client.DefaultConfig()
//	cfg.Endpoints = []string{"ctl-a:7070", "ctl-b:7070"}
//	cfg.TLS = &client.TLS{Files: pki.Files{Cert: "me.crt", Key: "me.key", CA: "ca.crt"}}
//	c, err := client.New(cfg)
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
//	defer cancel()
//	resp, err := c.GetJob(ctx, &rdzvv1.GetJobRequest{Name: "train"})
//
// The Client embeds the generated clients of JobService, NodeService,
// CertificateService, AgentService and ServerService (package proto/rdzv/v1). examples/goclient starts a job
// from a job file and follows it to its end.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// Config configures a Client. Start from DefaultConfig.
type Config struct {
	// Endpoints are controller host:port addresses: one controller's, or
	// every replica's (the client finds the leader). Required.
	Endpoints []string
	// Relays are rdzv-relay host:port addresses, tried before Endpoints:
	// an agent on a large cluster reaches the controller through a relay,
	// which carries many agents' streams as frames of one stream. A relay that
	// fails is skipped for the endpoints; the client stays with what
	// answered until it fails in turn. Only an agent's streams can be
	// relayed.
	Relays []string
	// TLS is this client's certificate and the cluster CA. Required unless
	// Insecure.
	TLS *TLS
	// Insecure connects without TLS and without a certificate, to a
	// controller started with --insecure: local tests only.
	Insecure bool
	// DialTimeout bounds one attempt to connect to an endpoint, so that a
	// controller gone from the network is given up on and the call goes
	// to the next endpoint. A call's own deadline can cut it shorter.
	DialTimeout time.Duration
	// Logger receives the client's log lines (a new leader, certificates
	// reloaded); nil logs nothing.
	Logger *zap.Logger
	// DialOptions are added to every gRPC connection (keepalive
	// parameters, interceptors).
	DialOptions []grpc.DialOption
	// Dialer, if not nil, makes every connection's TCP connection, gRPC's
	// and an agent stream's to a relay alike (a source address of its
	// own, say).
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
}

// TLS is a client's TLS material: files (the usual), or a tls.Config.
type TLS struct {
	// Files are the client's certificate and key and the cluster CA
	// certificate, PEM. They are re-read when they change, so a renewed
	// certificate is presented on the next connection without a restart.
	Files pki.Files
	// Identity, if not nil, must accept the identity the client's own
	// certificate speaks for, when the files are loaded and at every
	// reload (an agent's must name its node).
	Identity func(pki.Identity) error
	// Config is used instead of Files when set: its certificate is
	// presented and its RootCAs verify the controllers, with ServerName set
	// to each endpoint's host. The controller's certificate must still be
	// a controller's.
	Config *tls.Config
}

// DefaultConfig is a Config without endpoints or TLS, which must be set.
func DefaultConfig() Config {
	// gRPC's own default connect timeout.
	return Config{DialTimeout: 20 * time.Second}
}

// Validate names each problem with its field.
func (c Config) Validate() error {
	var errs []error
	if len(c.Endpoints) == 0 {
		errs = append(errs, errors.New("endpoints: at least one controller host:port is required"))
	}
	for i, e := range c.Endpoints {
		if _, _, err := net.SplitHostPort(e); err != nil {
			errs = append(errs, fmt.Errorf("endpoints[%d]: %q is not host:port: %w", i, e, err))
		}
	}
	for i, r := range c.Relays {
		if _, _, err := net.SplitHostPort(r); err != nil {
			errs = append(errs, fmt.Errorf("relays[%d]: %q is not host:port: %w", i, r, err))
		}
		if slices.Contains(c.Endpoints, r) {
			errs = append(errs, fmt.Errorf("relays[%d]: %q is also an endpoint: a relay and a controller cannot share an address", i, r))
		}
	}
	if len(c.Relays) > 0 && c.TLS == nil {
		errs = append(errs, errors.New("relays: need tls (an agent's certificate): a relay admits agents by their certificate"))
	}
	switch {
	case c.Insecure && c.TLS != nil:
		errs = append(errs, errors.New("tls: must not be set with insecure"))
	case !c.Insecure && c.TLS == nil:
		errs = append(errs, errors.New("tls: required (a certificate issued with `rdzvctl pki issue`); set insecure only for a controller started with --insecure"))
	case c.TLS != nil && c.TLS.Config != nil:
		if c.TLS.Files != (pki.Files{}) || c.TLS.Identity != nil {
			errs = append(errs, errors.New("tls: set files or config, not both"))
		}
	case c.TLS != nil:
		errs = append(errs, c.TLS.Files.Validate("tls"))
	}
	if c.DialTimeout <= 0 {
		errs = append(errs, fmt.Errorf("dial_timeout: must be positive, got %s", c.DialTimeout))
	}
	return errors.Join(errs...)
}

// Client calls the rdzv API on the leading controller. Its methods are
// those of the generated service clients it embeds; it is safe for
// concurrent use.
type Client struct {
	rdzvv1.JobServiceClient
	rdzvv1.NodeServiceClient
	rdzvv1.CertificateServiceClient
	rdzvv1.AgentServiceClient
	rdzvv1.RelayServiceClient
	rdzvv1.ServerServiceClient
	conn *Conn
}

// New checks cfg and loads the TLS material; nothing is dialled until the
// first call.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	tlsFor, err := tlsConfigFor(cfg, log)
	if err != nil {
		return nil, err
	}
	creds := func(string) (credentials.TransportCredentials, error) { return insecure.NewCredentials(), nil }
	if tlsFor != nil {
		creds = func(addr string) (credentials.TransportCredentials, error) {
			conf, err := tlsFor(addr)
			if err != nil {
				return nil, err
			}
			return credentials.NewTLS(conf), nil
		}
	}
	opts := []grpc.DialOption{
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: cfg.DialTimeout}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wire.MaxMessageBytes), grpc.MaxCallSendMsgSize(wire.MaxMessageBytes)),
	}
	if cfg.Dialer != nil {
		opts = append(opts, grpc.WithContextDialer(cfg.Dialer))
	}
	conn := newConn(append(slices.Clone(cfg.Relays), cfg.Endpoints...), creds, log, append(opts, cfg.DialOptions...)...)
	conn.tlsFor = tlsFor
	if cfg.Dialer != nil {
		conn.dial = cfg.Dialer
	}
	conn.relays = map[string]bool{}
	for _, r := range cfg.Relays {
		conn.relays[r] = true
	}
	return &Client{
		JobServiceClient:         rdzvv1.NewJobServiceClient(conn),
		NodeServiceClient:        rdzvv1.NewNodeServiceClient(conn),
		CertificateServiceClient: rdzvv1.NewCertificateServiceClient(conn),
		AgentServiceClient:       rdzvv1.NewAgentServiceClient(conn),
		RelayServiceClient:       rdzvv1.NewRelayServiceClient(conn),
		ServerServiceClient:      rdzvv1.NewServerServiceClient(conn),
		conn:                     conn,
	}, nil
}

// Close closes the connections; calls under way fail.
func (c *Client) Close() error { return c.conn.Close() }

// Leader is the endpoint that last served a call, or "" before any did.
func (c *Client) Leader() string { return c.conn.Leader() }

// Relayed says whether the endpoint that last served a call is one of
// Config.Relays.
func (c *Client) Relayed() bool { return c.conn.Relayed() }

// tlsConfigFor builds the TLS configuration of one endpoint, nil when
// Insecure: TLS checks the controller's certificate, or a relay's at a
// relay's address, against the host dialled.
func tlsConfigFor(cfg Config, log *zap.Logger) (func(addr string) (*tls.Config, error), error) {
	want := func(addr string) pki.Role {
		if slices.Contains(cfg.Relays, addr) {
			return pki.RoleRelay
		}
		return pki.RoleController
	}
	switch {
	case cfg.Insecure:
		return nil, nil
	case cfg.TLS.Config != nil:
		base := cfg.TLS.Config
		return func(addr string) (*tls.Config, error) {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, fmt.Errorf("controller address %q: %w", addr, err)
			}
			conf := base.Clone()
			conf.ServerName = host
			own := conf.VerifyConnection
			// After the standard checks (chain, host): only a controller
			// may serve the API.
			conf.VerifyConnection = func(cs tls.ConnectionState) error {
				if own != nil {
					if err := own(cs); err != nil {
						return err
					}
				}
				return serverCert(addr, want(addr), cs)
			}
			return conf, nil
		}, nil
	}
	r, err := pki.NewReloader(cfg.TLS.Files, cfg.TLS.Identity, log.Named("tls"))
	if err != nil {
		return nil, err
	}
	return func(addr string) (*tls.Config, error) {
		if want(addr) == pki.RoleRelay {
			return r.RelayClientConfig(addr)
		}
		return r.ClientConfig(addr)
	}, nil
}

// serverCert refuses a server whose certificate is not of role want.
func serverCert(addr string, want pki.Role, cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("%s at %s sent no certificate", want, addr)
	}
	id, err := pki.IdentityOf(cs.PeerCertificates[0])
	if err != nil {
		return fmt.Errorf("%s at %s: %w", want, addr, err)
	}
	if id.Role != want {
		return fmt.Errorf("the server at %s presented the certificate of %s, not of a %s", addr, id, want)
	}
	return nil
}
