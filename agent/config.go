// Package agent is rdzv-agent: it describes its node to the controller,
// keeps a heartbeat, and runs and supervises the torchrun workers it is
// assigned.
package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/rdzv/rdzv/controller/ha"
	"github.com/rdzv/rdzv/controller/jobspec"
)

// Version is reported to the controller; set at build time with
// -ldflags "-X github.com/rdzv/rdzv/agent.Version=...".
var Version = "0.1.0-dev"

// Config is the agent's configuration (deploy/config/agent.yaml).
type Config struct {
	// Controller is the controller's host:port, or a comma-separated list
	// of replicas' addresses: the agent finds the leader among them.
	Controller string `json:"controller"`
	// NodeName defaults to the hostname. It names the node; it is never used
	// to find an address.
	NodeName string            `json:"node_name"`
	Labels   map[string]string `json:"labels"`
	// NCCLInterface forces the interface NCCL and Gloo use.
	NCCLInterface string `json:"nccl_interface"`
	// FakeGPUs invents this many GPUs on a CPU-only host, for scheduling
	// tests only; they are labelled fake everywhere.
	FakeGPUs int `json:"fake_gpus"`
	// StateDir holds job logs and scratch working directories.
	StateDir string `json:"state_dir"`
	// GossipPort is the memberlist port on the NCCL interface address; 0
	// picks a free one, -1 turns gossip off (then a node that loses the
	// controller fences itself without asking its peers).
	GossipPort int `json:"gossip_port"`
	// StopGrace is how long workers get between SIGTERM and SIGKILL.
	StopGrace jobspec.Duration `json:"stop_grace"`
	LogLevel  string           `json:"log_level"`
}

// DefaultConfig is an agent with no controller set.
func DefaultConfig() Config {
	return Config{
		StateDir:   "/var/lib/rdzv/agent",
		GossipPort: 7946,
		StopGrace:  jobspec.Duration{Duration: 10 * time.Second},
		LogLevel:   "info",
	}
}

// LoadConfig reads a YAML config file over DefaultConfig.
func LoadConfig(path string) (Config, error) {
	cfg := DefaultConfig()
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("reading agent config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return cfg, fmt.Errorf("parsing agent config %s: %w", path, err)
	}
	return cfg, nil
}

// Controllers is the list of controller addresses.
func (c Config) Controllers() ([]string, error) { return ha.ParseAddrs("controller", c.Controller) }

// Validate names each problem with its field.
func (c Config) Validate() error {
	var errs []error
	if _, err := c.Controllers(); err != nil {
		errs = append(errs, fmt.Errorf("%w (set --controller or RDZV_CONTROLLER to host:port[,host:port...])", err))
	}
	if c.NodeName != "" {
		if fe := jobspec.ValidateNodeName("node_name", c.NodeName); fe != nil {
			errs = append(errs, fe)
		}
	}
	for _, fe := range jobspec.ValidateLabels("labels", c.Labels) {
		errs = append(errs, fe)
	}
	if c.FakeGPUs < 0 || c.FakeGPUs > jobspec.MaxGPUsPerNode {
		errs = append(errs, fmt.Errorf("fake_gpus: must be between 0 and %d, got %d", jobspec.MaxGPUsPerNode, c.FakeGPUs))
	}
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		errs = append(errs, fmt.Errorf("state_dir: must be an absolute path, got %q", c.StateDir))
	}
	if c.GossipPort < -1 || c.GossipPort > 65535 {
		errs = append(errs, fmt.Errorf("gossip_port: must be -1 (off), 0 (any) or a port, got %d", c.GossipPort))
	}
	if c.StopGrace.Duration <= 0 {
		errs = append(errs, fmt.Errorf("stop_grace: must be positive, got %s", c.StopGrace))
	}
	return errors.Join(errs...)
}
