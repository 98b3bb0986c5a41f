// Package agent is rdzv-agent: it describes its node to the controller,
// keeps a heartbeat, and runs and supervises the torchrun workers it is
// assigned.
package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/health"
	"github.com/rdzv/rdzv/internal/httpserve"
	"github.com/rdzv/rdzv/pki"
	"github.com/rdzv/rdzv/wire"
	"github.com/rdzv/rdzv/wire/yamlcheck"
)

// Version is reported to the controller; set at build time with
// -ldflags "-X github.com/rdzv/rdzv/agent.Version=...".
var Version = "0.1.0-dev"

// Config is the agent's configuration (deploy/config/agent.yaml).
type Config struct {
	// Controller is the controller's host:port, or a comma-separated list
	// of replicas' addresses: the agent finds the leader among them.
	Controller string `json:"controller"`
	// Relays are rdzv-relay host:port addresses (comma-separated), tried
	// before the controller: on a large cluster, the relay of the node's
	// rack carries its stream. An agent whose relay fails reaches the
	// controller directly. Empty: always directly.
	Relays string `json:"relays"`
	// RelayReturn is how often an agent that went around its relays tries
	// to come back through one: it registers through the relay before it
	// drops its direct stream, so a failed try leaves it as it was. 0
	// stays direct until the next reconnect.
	RelayReturn wire.Duration `json:"relay_return"`
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
	// PeerPort is the port of the listener where agents exchange in-memory
	// checkpoint shards (mutual TLS, agent certificates only), on the NCCL
	// interface address; 0 picks a free one, -1 turns it off (shards then
	// stay on their node). Off when the agent runs insecure.
	PeerPort int `json:"peer_port"`
	// MemoryCheckpointDir is where workers write in-memory checkpoint
	// shards: shared memory, one directory per node, job and generation.
	MemoryCheckpointDir string `json:"memory_checkpoint_dir"`
	// StopGrace is how long workers get between SIGTERM and SIGKILL.
	StopGrace wire.Duration `json:"stop_grace"`
	// GPUHealth says which GPU faults are critical: they cordon the node.
	GPUHealth health.GPUConfig `json:"gpu_health"`
	// HealthChecks are the node health checks: a node failing one takes no
	// new work until it passes again.
	HealthChecks HealthChecksConfig `json:"health_checks"`
	// RestartGrace is how long workers keep running after the agent stops
	// (systemd restart, upgrade) for the next agent to adopt them; they are
	// killed if none does in time. 0 stops the workers with the agent.
	RestartGrace wire.Duration `json:"restart_grace"`
	LogLevel     string        `json:"log_level"`
	// SecretsDir holds the files a job's env_files may name; the agent
	// reads them as root, so a job must not be able to name any other file.
	SecretsDir string `json:"secrets_dir"`
	// RunAs is the user workers run as when the job names none (a user
	// name or uid[:gid]); empty (the default) gives each such job a
	// dynamic user of its own from DynamicUsers (dynuser.go).
	RunAs string `json:"run_as"`
	// DynamicUsers is the uid range of jobs' dynamic users.
	DynamicUsers DynamicUsers `json:"dynamic_users"`
	// AllowRoot lets workers run as root (uid 0, or with group 0), by
	// default or because a job asks to.
	AllowRoot bool `json:"allow_root"`
	// RunAsPolicy says which users and groups workers may run as, whoever
	// names them.
	RunAsPolicy RunAsPolicy `json:"run_as_policy"`
	// WorkerPath is PATH in the workers' environment, which starts clean
	// rather than from the agent's; it also finds launcher.torchrun.
	WorkerPath string `json:"worker_path"`
	// TLS is this node's agent certificate (its name is the node name) and
	// the cluster CA the controller's certificate must chain to.
	TLS pki.Files `json:"tls"`
	// Insecure connects without TLS, to a controller started insecure.
	// Local tests only.
	Insecure bool `json:"insecure"`
	// JobLogs caps the job logs kept on the node (joblogs.go).
	JobLogs JobLogsConfig `json:"job_logs"`
	// StandbyMinAvailableBytes is the least MemAvailable (/proc/meminfo)
	// with which the node keeps a warm standby for a job it does not run
	// (a spare's, or an idle node's): below it, checked each time the
	// controller tells the node again (every 30 s), the standby is dropped
	// and none is started. 0 keeps them whatever the memory.
	StandbyMinAvailableBytes uint64 `json:"standby_min_available_bytes"`
	// HTTP serves /metrics, /healthz and /readyz (docs/monitoring.md);
	// loopback by default, off when its listen is empty.
	HTTP httpserve.Config `json:"http"`
}

// DefaultHTTPListen is the agent's metrics and health address.
const DefaultHTTPListen = "127.0.0.1:9402"

// DefaultConfig is an agent with no controller set.
func DefaultConfig() Config {
	return Config{
		StateDir:   "/var/lib/rdzv/agent",
		HTTP:       httpserve.Config{Listen: DefaultHTTPListen},
		GossipPort: 7946,
		PeerPort:   DefaultPeerPort,
		// tmpfs: a shard costs a copy in memory, no disk.
		MemoryCheckpointDir: "/dev/shm/rdzv-memckpt",
		StopGrace:           wire.Duration{Duration: 10 * time.Second},
		// A relay restarted for an upgrade gets its rack back within a
		// minute or two: until then each of its agents costs the
		// controller a connection, its TLS state and goroutines.
		RelayReturn: wire.Duration{Duration: time.Minute},
		// Time for systemd to restart the agent and for it to start, with
		// room to spare; the controller waits this long before moving the
		// job on if the agent does not come back.
		RestartGrace: wire.Duration{Duration: 15 * time.Second},
		LogLevel:     "info",
		SecretsDir:   "/etc/rdzv/secrets",
		DynamicUsers: DefaultDynamicUsers(),
		RunAsPolicy:  DefaultRunAsPolicy(),
		WorkerPath:   DefaultWorkerPath,
		HealthChecks: DefaultHealthChecks(),
		JobLogs:      DefaultJobLogs(),
		// A standby with torch imported holds a few hundred MB; keeping
		// one must never be what pushes a node into swapping or the OOM
		// killer.
		StandbyMinAvailableBytes: DefaultStandbyMinAvailable,
	}
}

// DefaultStandbyMinAvailable is the default StandbyMinAvailableBytes.
const DefaultStandbyMinAvailable = 4 << 30

// DefaultWorkerPath is Debian's PATH for root, which holds every system
// directory where an administrator installs torchrun and Python.
const DefaultWorkerPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// LoadConfig reads a YAML config file over DefaultConfig, strictly: an
// unknown field or a value of the wrong kind is an error at its line and
// column (wire/yamlcheck), so a typo never silently falls back to a
// default. It returns where each field is, for Validate's errors.
func LoadConfig(path string) (Config, yamlcheck.Positions, error) {
	return yamlcheck.LoadFile(path, DefaultConfig())
}

// nodeName is the configured node name, or the hostname.
func (c Config) nodeName() (string, error) {
	if c.NodeName != "" {
		return c.NodeName, nil
	}
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("reading hostname for the node name: %w", err)
	}
	return host, nil
}

// Controllers is the list of controller addresses.
func (c Config) Controllers() ([]string, error) { return client.ParseAddrs("controller", c.Controller) }

// RelayAddrs is the list of relay addresses, empty without relays.
func (c Config) RelayAddrs() ([]string, error) {
	if strings.TrimSpace(c.Relays) == "" {
		return nil, nil
	}
	return client.ParseAddrs("relays", c.Relays)
}

// MinRelayReturn bounds relay_return from below: each try holds the
// agent's heartbeats for up to a second (relayTryTimeout).
const MinRelayReturn = 10 * time.Second

// Validate names each problem with its field.
func (c Config) Validate() error {
	var errs []error
	if _, err := c.Controllers(); err != nil {
		errs = append(errs, fmt.Errorf("%w (set --controller or RDZV_CONTROLLER to host:port[,host:port...])", err))
	}
	if _, err := c.RelayAddrs(); err != nil {
		errs = append(errs, err)
	} else if c.Relays != "" && c.Insecure {
		errs = append(errs, wire.Fieldf("relays", "a relay vouches for agents by their certificates; it cannot carry an insecure agent"))
	}
	if d := c.RelayReturn.Duration; d != 0 && d < MinRelayReturn {
		errs = append(errs, wire.Fieldf("relay_return", "must be 0 (stay direct until the next reconnect) or at least %s, got %s", MinRelayReturn, c.RelayReturn))
	}
	if c.NodeName != "" {
		if fe := wire.ValidateName("node_name", c.NodeName); fe != nil {
			errs = append(errs, fe)
		}
	}
	for _, fe := range wire.ValidateLabels("labels", c.Labels) {
		errs = append(errs, fe)
	}
	if c.FakeGPUs < 0 || c.FakeGPUs > wire.MaxGPUsPerNode {
		errs = append(errs, wire.Fieldf("fake_gpus", "must be between 0 and %d, got %d", wire.MaxGPUsPerNode, c.FakeGPUs))
	}
	if fe := wire.CheckPath("state_dir", c.StateDir, ""); fe != nil {
		errs = append(errs, fe)
	}
	if c.PeerPort < -1 || c.PeerPort > 65535 {
		errs = append(errs, wire.Fieldf("peer_port", "must be -1 (off), 0 (any) or a port, got %d", c.PeerPort))
	}
	if !filepath.IsAbs(c.MemoryCheckpointDir) {
		errs = append(errs, wire.Fieldf("memory_checkpoint_dir", "must be an absolute path, got %s", wire.Quote(c.MemoryCheckpointDir)))
	}
	if c.GossipPort < -1 || c.GossipPort > 65535 {
		errs = append(errs, wire.Fieldf("gossip_port", "must be -1 (off), 0 (any) or a port, got %d", c.GossipPort))
	}
	if fe := wire.CheckPath("secrets_dir", c.SecretsDir, ""); fe != nil {
		errs = append(errs, fe)
	}
	if c.RunAs == "" {
		if err := c.DynamicUsers.Validate("dynamic_users"); err != nil {
			errs = append(errs, err)
		}
	} else if fe := wire.ValidateRunAs("run_as", c.RunAs); fe != nil {
		errs = append(errs, fe)
	}
	if err := c.RunAsPolicy.Validate("run_as_policy"); err != nil {
		errs = append(errs, err)
	}
	if err := validateWorkerPath(c.WorkerPath); err != nil {
		errs = append(errs, err)
	}
	if c.StopGrace.Duration <= 0 {
		errs = append(errs, wire.Fieldf("stop_grace", "must be positive, got %s", c.StopGrace))
	}
	if _, err := c.GPUHealth.Policy("gpu_health"); err != nil {
		errs = append(errs, err)
	}
	if err := c.HealthChecks.Validate("health_checks"); err != nil {
		errs = append(errs, err)
	}
	if c.RestartGrace.Duration < 0 || c.RestartGrace.Duration > MaxRestartGrace {
		errs = append(errs, wire.Fieldf("restart_grace", "must be between 0 (stop workers with the agent) and %s, got %s", MaxRestartGrace, c.RestartGrace))
	}
	if err := c.JobLogs.Validate("job_logs"); err != nil {
		errs = append(errs, err)
	}
	if !c.Insecure {
		if err := c.TLS.Validate("tls"); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.HTTP.Validate("http"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validateWorkerPath wants absolute directories only: an empty or relative
// entry would look the launcher and every command up in the working
// directory, which the job chooses.
func validateWorkerPath(path string) error {
	if path == "" || strings.ContainsRune(path, 0) {
		return wire.Fieldf("worker_path", "must list the directories workers find commands in, e.g. %s", DefaultWorkerPath)
	}
	for _, dir := range strings.Split(path, ":") {
		if fe := wire.CheckPath("worker_path", dir, ""); fe != nil {
			return fmt.Errorf("%w (each entry of %q must be an absolute directory)", fe, path)
		}
	}
	return nil
}

// MaxRestartGrace bounds restart_grace: a job whose agent is gone cannot
// recover from a real failure on that node for this long.
const MaxRestartGrace = 5 * time.Minute
