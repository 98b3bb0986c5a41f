package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/pki"
	"github.com/rdzv/rdzv/wire"
)

type globals struct {
	controller string
	output     string
	timeout    time.Duration
	// tlsDir holds ca.crt, rdzvctl.crt and rdzvctl.key; the file flags
	// override single files.
	tlsDir, tlsCert, tlsKey, tlsCA string
	insecure                       bool
	// configFile and context choose the context (config.go).
	configFile, context string
}

// Files rdzvctl looks for in its TLS directory.
const (
	clientCertFile = "rdzvctl.crt"
	clientKeyFile  = "rdzvctl.key"
)

func defaultGlobals() *globals {
	addr := os.Getenv("RDZV_CONTROLLER")
	if addr == "" {
		addr = "127.0.0.1:7070"
	}
	dir := os.Getenv("RDZV_TLS_DIR")
	if home, err := os.UserHomeDir(); dir == "" && err == nil {
		dir = filepath.Join(home, ".rdzv")
	}
	return &globals{controller: addr, output: "table", timeout: 10 * time.Second, tlsDir: dir}
}

func (g *globals) register(fs *pflag.FlagSet) {
	fs.StringVar(&g.controller, "controller", g.controller, "controller host:port, or every replica's host:port,host:port,... (env RDZV_CONTROLLER)")
	fs.StringVarP(&g.output, "output", "o", g.output, "output format: "+outputFormats+" (each command's help says which it prints; text-only commands take table alone)")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "per-request timeout")
	fs.StringVar(&g.tlsDir, "tls-dir", g.tlsDir, "directory with ca.crt, rdzvctl.crt and rdzvctl.key (env RDZV_TLS_DIR)")
	fs.StringVar(&g.tlsCert, "tls-cert", g.tlsCert, "client certificate (default TLS_DIR/rdzvctl.crt)")
	fs.StringVar(&g.tlsKey, "tls-key", g.tlsKey, "client key (default TLS_DIR/rdzvctl.key)")
	fs.StringVar(&g.tlsCA, "tls-ca", g.tlsCA, "cluster CA certificate (default TLS_DIR/ca.crt)")
	fs.BoolVar(&g.insecure, "insecure", g.insecure, "no TLS, for a controller started with --insecure")
	fs.StringVar(&g.configFile, "config", "", "config file of named contexts (env RDZV_CONFIG; default ~/.config/rdzv/config.yaml)")
	fs.StringVar(&g.context, "context", "", "the context to use (env RDZV_CONTEXT; default the config file's current_context): its controller, TLS directory, insecure and timeout stand where these flags and their environment are not given")
}

func (g *globals) tlsFiles() pki.Files {
	f := pki.Files{Cert: g.tlsCert, Key: g.tlsKey, CA: g.tlsCA}
	for _, d := range []struct {
		path *string
		name string
	}{{&f.Cert, clientCertFile}, {&f.Key, clientKeyFile}, {&f.CA, pki.CACertFile}} {
		if *d.path == "" {
			*d.path = filepath.Join(g.tlsDir, d.name)
		}
	}
	return f
}

// newClient is a client of the controllers named by --controller: mutual
// TLS with the operator's certificate, or none with --insecure.
func (g *globals) newClient() (*client.Client, error) {
	addrs, err := client.ParseAddrs("--controller", g.controller)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	cfg := client.DefaultConfig()
	cfg.Endpoints, cfg.Insecure = addrs, g.insecure
	if g.insecure {
		return client.New(cfg)
	}
	cfg.TLS = &client.TLS{Files: g.tlsFiles()}
	c, err := client.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w; rdzvctl needs a valid client certificate: put ca.crt, %s and %s in --tls-dir or $RDZV_TLS_DIR (now %q), "+
			"e.g. `rdzvctl pki issue operator NAME --out %s` on the CA host; or pass --insecure for a controller started with --insecure",
			err, clientCertFile, clientKeyFile, g.tlsDir, filepath.Join(g.tlsDir, "rdzvctl"))
	}
	return c, nil
}

type command struct {
	*globals
	out, errOut io.Writer
	// in is stdin when it is a pipe or file; nil when it is a terminal.
	in     io.Reader
	client *client.Client
	// ran is set once a command's own code runs: errors before that are
	// cobra's refusals of the command line.
	ran bool
	// noCommand is set when rdzvctl was given no command.
	noCommand bool
	clock     clockwork.Clock
	// flags are the global flags, to tell those given from defaults;
	// contextDone is set once the context has been applied.
	flags       *pflag.FlagSet
	contextDone bool
	// controllerContext names the context --controller came from, for
	// messages; empty when it did not come from one.
	controllerContext string
}

// dial prepares calls to the controllers; each call finds the leader among
// them (see package client).
func (c *command) dial() (*client.Client, error) {
	if c.client == nil {
		if err := c.applyContext(); err != nil {
			return nil, err
		}
		cl, err := c.newClient()
		if err != nil {
			return nil, err
		}
		c.client = cl
	}
	return c.client, nil
}

func (c *command) close() {
	if c.client != nil {
		_ = c.client.Close()
	}
}

// rpcErr turns a gRPC error into an operator-facing one.
func (c *command) rpcErr(what string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", what, err)
	}
	if reason, _, ok := wire.Parse(err); ok {
		if reason == wire.ReasonEtcdUnavailable {
			return fmt.Errorf("%s: refused by the controller: %s", what, st.Message())
		}
		return fmt.Errorf("%s: no controller at %s leads right now (election or failover under way; retry): %s", what, c.controller, st.Message())
	}
	if expired := c.certExpired(); expired != "" && (st.Code() == codes.Unavailable || st.Code() == codes.Unauthenticated) {
		// The controller closes a connection once its client certificate
		// expires, which a call in flight sees as a dropped connection.
		return fmt.Errorf("%s: %s", what, expired)
	}
	switch st.Code() {
	case codes.Unavailable:
		hint := ""
		if c.insecure {
			// A TLS controller just drops a plaintext connection.
			hint = " (is the controller using TLS? --insecure works only with a controller started with --insecure)"
		}
		set := "set --controller or RDZV_CONTROLLER"
		if c.controllerContext != "" {
			set = fmt.Sprintf("from context %s; set the context's controller, or --controller or RDZV_CONTROLLER", c.controllerContext)
		}
		return fmt.Errorf("%s: cannot reach the controller at %s (%s)%s: %s", what, c.controller, set, hint, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: the controller at %s did not answer within %s", what, c.controller, c.timeout)
	}
	return fmt.Errorf("%s: %s", what, st.Message())
}

// certExpired says how rdzvctl's own certificate has expired, or "" when it
// has not (or cannot be read: the call's own error says more then).
func (c *command) certExpired() string {
	if c.insecure {
		return ""
	}
	path := c.tlsFiles().Cert
	cert, err := pki.ReadCert(path)
	if err != nil || time.Now().Before(cert.NotAfter) {
		return ""
	}
	return fmt.Sprintf("this client's certificate %s expired at %s, and the controller refuses or closes connections made with it: "+
		"issue a new one (rdzvctl pki issue operator NAME on the CA host) into %s",
		path, cert.NotAfter.UTC().Format(time.RFC3339), filepath.Dir(path))
}

func (c *command) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}

// unary makes one request of the controller under --timeout; what says
// what failed.
func unary[R any](ctx context.Context, c *command, what string, call func(context.Context, *client.Client) (R, error)) (R, error) {
	var none R
	cl, err := c.dial()
	if err != nil {
		return none, err
	}
	cctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := call(cctx, cl)
	if err != nil {
		return none, c.rpcErr(what, err)
	}
	return resp, nil
}
