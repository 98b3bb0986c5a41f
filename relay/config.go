// Package relay is rdzv-relay: it carries the streams of many agents to
// the controller as frames of one stream (rdzv.v1.RelayService.Carry). A
// directly connected agent costs the controller per connection and per
// stream, not per message (a TLS session, HTTP/2 transport and a few
// goroutines each, and a system call or two for every heartbeat); a few
// relays, each carrying thousands of agents, let the controller hold one
// stream per relay, with every agent's messages batched on it, while each
// agent's stream stays its own as far as the agent and the controller's
// logic can tell.
//
// Agents speak to the relay in frames over TLS (wire.AgentProtocol); the
// relay speaks gRPC to the controller only.
//
// Trust: the relay's TLS handshake admits only a certificate that
// verifies against the cluster CA and is off the leader's deny-list
// (docs/security.md, "Relay"); the relay forwards it when it opens the
// agent's stream (rdzv.v1.OpenStream), and the controller verifies it
// again against its CA and deny-list and lets the stream speak for that
// node only. A relay's certificate (role relay) can carry agents
// and do nothing else.
package relay

import (
	"errors"
	"fmt"
	"time"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/internal/httpserve"
	"github.com/rdzv/rdzv/pki"
	"github.com/rdzv/rdzv/wire"
	"github.com/rdzv/rdzv/wire/yamlcheck"
)

// DefaultListen is the relay's address for agents (wire.AgentProtocol).
const DefaultListen = "0.0.0.0:7071"

// DefaultHTTPListen is the relay's metrics and health address.
const DefaultHTTPListen = "127.0.0.1:9403"

// Config is the relay's configuration (deploy/config/relay.yaml).
type Config struct {
	// Listen is where agents connect (their `relays` setting).
	Listen string `json:"listen"`
	// Controller is the controller's host:port, or a comma-separated list
	// of replicas' addresses: the relay finds the leader among them.
	Controller string `json:"controller"`
	// TLS is the relay's certificate (rdzvctl pki issue relay NAME --ip
	// ADDR: agents check it names the address they dial) and the cluster
	// CA, which agents' and controllers' certificates must chain to.
	TLS pki.Files `json:"tls"`
	// HTTP serves /metrics, /healthz and /readyz; loopback by default,
	// off when its listen is empty.
	HTTP     httpserve.Config `json:"http"`
	LogLevel string           `json:"log_level"`
	// RevocationsRefresh is how often the relay reads the leader's
	// certificate deny-list (CertificateService.ListRevocations), which
	// its agent port refuses at the TLS handshake, as the controller
	// does. A certificate revoked since is refused by the controller when
	// the relay forwards it, and its streams ended, either way.
	RevocationsRefresh wire.Duration `json:"revocations_refresh"`
}

// DefaultConfig is a relay with no controller and no certificate set.
func DefaultConfig() Config {
	return Config{Listen: DefaultListen, HTTP: httpserve.Config{Listen: DefaultHTTPListen}, LogLevel: "info",
		RevocationsRefresh: wire.Duration{Duration: 10 * time.Second}}
}

// LoadConfig reads a YAML config file over DefaultConfig, strictly: an
// unknown field or a value of the wrong kind is an error at its line and
// column (wire/yamlcheck), so a typo never silently falls back to a
// default. It returns where each field is, for Validate's errors.
func LoadConfig(path string) (Config, yamlcheck.Positions, error) {
	return yamlcheck.LoadFile(path, DefaultConfig())
}

// Controllers is the list of controller addresses.
func (c Config) Controllers() ([]string, error) { return client.ParseAddrs("controller", c.Controller) }

// Validate names each problem with its field. A relay has no insecure
// mode: it exists to vouch for agents, which takes certificates.
func (c Config) Validate() error {
	var errs []error
	if _, err := c.Controllers(); err != nil {
		errs = append(errs, fmt.Errorf("%w (set --controller to host:port[,host:port...])", err))
	}
	if _, err := client.ParseAddrs("listen", c.Listen); err != nil {
		errs = append(errs, err)
	}
	if c.RevocationsRefresh.Duration < time.Second {
		errs = append(errs, wire.Fieldf("revocations_refresh", "must be at least 1s, got %s", c.RevocationsRefresh))
	}
	errs = append(errs, c.TLS.Validate("tls"), c.HTTP.Validate("http"))
	return errors.Join(errs...)
}
