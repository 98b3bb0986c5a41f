package controller

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/rdzv/rdzv/controller/jobspec"
	"github.com/rdzv/rdzv/pki"
)

// Config is the controller's configuration (deploy/config/controller.yaml).
type Config struct {
	// Listen is the gRPC address agents and rdzvctl connect to.
	Listen string `json:"listen"`
	// DataDir holds the embedded etcd's data; unused with external etcd.
	DataDir      string             `json:"data_dir"`
	Etcd         EtcdConfig         `json:"etcd"`
	EmbeddedEtcd EmbeddedEtcdConfig `json:"embedded_etcd"`
	Heartbeat    HeartbeatConfig    `json:"heartbeat"`
	// MasterPortRange is where torchrun's master port is picked; the rank 0
	// node's agent confirms the port is free before the round commits.
	MasterPortRange PortRange `json:"master_port_range"`
	// FlakyNodes cordons a node that keeps failing the jobs it runs.
	FlakyNodes FlakyNodesConfig `json:"flaky_nodes"`
	LogLevel   string           `json:"log_level"`
	// TLS is the controller's certificate (role controller) and the cluster
	// CA that agents' and operators' certificates must chain to.
	TLS pki.Files `json:"tls"`
	// Insecure serves without TLS and without authentication: anyone who
	// reaches Listen can run commands on every node. Local tests only.
	Insecure bool `json:"insecure"`
}

// FlakyNodesConfig: a node lost this many times within Window while running
// a job is cordoned until an operator uncordons it. Losses are what is
// unambiguously the node's doing (heartbeats stopped, cut off, agent gone);
// a worker exiting non-zero is not counted, since when one node dies its
// peers' workers fail too, and a program's own bug fails the same rank on
// the same node every time.
type FlakyNodesConfig struct {
	// Losses is the threshold; 0 turns this off.
	Losses int              `json:"losses"`
	Window jobspec.Duration `json:"window"`
}

type EtcdConfig struct {
	// Endpoints of an external etcd cluster; empty runs an embedded one.
	Endpoints   []string         `json:"endpoints"`
	DialTimeout jobspec.Duration `json:"dial_timeout"`
}

type EmbeddedEtcdConfig struct {
	ClientURL string `json:"client_url"`
	PeerURL   string `json:"peer_url"`
}

type HeartbeatConfig struct {
	// Interval is how often agents send a heartbeat.
	Interval jobspec.Duration `json:"interval"`
	// Timeout is how long without a heartbeat before a node is lost.
	Timeout jobspec.Duration `json:"timeout"`
}

type PortRange struct {
	Min int `json:"min"`
	Max int `json:"max"`
}

// DefaultConfig is a single controller with embedded etcd.
func DefaultConfig() Config {
	return Config{
		Listen:          "0.0.0.0:7070",
		DataDir:         "/var/lib/rdzv/controller",
		Etcd:            EtcdConfig{DialTimeout: jobspec.Duration{Duration: 5 * time.Second}},
		EmbeddedEtcd:    EmbeddedEtcdConfig{ClientURL: "http://127.0.0.1:2379", PeerURL: "http://127.0.0.1:2380"},
		Heartbeat:       HeartbeatConfig{Interval: jobspec.Duration{Duration: time.Second}, Timeout: jobspec.Duration{Duration: 5 * time.Second}},
		MasterPortRange: PortRange{Min: 29500, Max: 29999},
		FlakyNodes:      FlakyNodesConfig{Losses: 3, Window: jobspec.Duration{Duration: time.Hour}},
		LogLevel:        "info",
	}
}

// LoadConfig reads a YAML config file over DefaultConfig; unknown fields are
// errors so a typo never silently falls back to a default.
func LoadConfig(path string) (Config, error) {
	cfg := DefaultConfig()
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("reading controller config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return cfg, fmt.Errorf("parsing controller config %s: %w", path, err)
	}
	return cfg, nil
}

// Embedded reports whether the controller runs its own etcd.
func (c Config) Embedded() bool { return len(c.Etcd.Endpoints) == 0 }

// Validate names the first problem per field.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen: %q is not host:port: %w", c.Listen, err))
	}
	if c.Embedded() {
		if c.DataDir == "" {
			errs = append(errs, errors.New("data_dir: required with embedded etcd"))
		}
		for field, u := range map[string]string{"embedded_etcd.client_url": c.EmbeddedEtcd.ClientURL, "embedded_etcd.peer_url": c.EmbeddedEtcd.PeerURL} {
			if parsed, err := url.Parse(u); err != nil || parsed.Host == "" || (parsed.Scheme != "http" && parsed.Scheme != "https") {
				errs = append(errs, fmt.Errorf("%s: %q is not an http(s)://host:port URL", field, u))
			}
		}
	}
	if c.Etcd.DialTimeout.Duration <= 0 {
		errs = append(errs, fmt.Errorf("etcd.dial_timeout: must be positive, got %s", c.Etcd.DialTimeout))
	}
	if c.Heartbeat.Interval.Duration <= 0 {
		errs = append(errs, fmt.Errorf("heartbeat.interval: must be positive, got %s", c.Heartbeat.Interval))
	}
	if c.Heartbeat.Timeout.Duration < 2*c.Heartbeat.Interval.Duration {
		errs = append(errs, fmt.Errorf("heartbeat.timeout: must be at least twice heartbeat.interval (%s), got %s", c.Heartbeat.Interval, c.Heartbeat.Timeout))
	}
	if !c.Insecure {
		if err := c.TLS.Validate("tls"); err != nil {
			errs = append(errs, err)
		}
	}
	if r := c.MasterPortRange; r.Min < 1024 || r.Max > 65535 || r.Min > r.Max {
		errs = append(errs, fmt.Errorf("master_port_range: want 1024 <= min <= max <= 65535, got %d-%d", r.Min, r.Max))
	}
	if c.FlakyNodes.Losses < 0 {
		errs = append(errs, fmt.Errorf("flaky_nodes.losses: must be 0 (off) or more, got %d", c.FlakyNodes.Losses))
	}
	if c.FlakyNodes.Losses > 0 && c.FlakyNodes.Window.Duration <= 0 {
		errs = append(errs, fmt.Errorf("flaky_nodes.window: must be positive, got %s", c.FlakyNodes.Window))
	}
	return errors.Join(errs...)
}
