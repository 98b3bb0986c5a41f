package agent

import (
	"errors"
	"fmt"
	"time"

	"github.com/rdzv/rdzv/wire"
)

// HealthChecksConfig configures the node health checks (health_checks in
// the agent config).
type HealthChecksConfig struct {
	// Interval is how often every check runs; they also run when the agent
	// starts and right before the node's workers start.
	Interval wire.Duration `json:"interval"`
	// Timeout bounds each built-in check, and each command without its own.
	Timeout wire.Duration      `json:"timeout"`
	GPU     GPUCheckConfig     `json:"gpu"`
	Network NetworkCheckConfig `json:"network"`
	Storage StorageCheckConfig `json:"storage"`
	// Commands are the operator's checks (Slurm HealthCheckProgram style).
	Commands []CommandCheck `json:"commands"`
	// RunAs is the user the commands run as (name or uid[:gid]); empty runs
	// them as the agent. It must pass run_as_policy, like workers' users.
	RunAs string `json:"run_as"`
}

// GPUCheckConfig configures the built-in gpu checks.
type GPUCheckConfig struct {
	// ExpectedCount GPUs must be present; 0 expects as many as the agent
	// found when it started.
	ExpectedCount int `json:"expected_count"`
	// MaxTemperatureC fails a GPU this hot; 0 leaves heat to the throttle
	// reasons.
	MaxTemperatureC uint32 `json:"max_temperature_c"`
	// PersistenceMode fails a GPU whose persistence mode is off.
	PersistenceMode bool `json:"persistence_mode"`
}

// NetworkCheckConfig configures the built-in network check of the chosen
// NCCL interface.
type NetworkCheckConfig struct {
	// SpeedMbps is the least link speed expected; 0 does not check it.
	SpeedMbps int `json:"speed_mbps"`
	// MTU is the MTU expected; 0 does not check it.
	MTU int `json:"mtu"`
	// InfiniBand wants every InfiniBand port on the node ACTIVE.
	InfiniBand bool `json:"infiniband"`
}

// StorageCheckConfig configures the built-in storage check.
type StorageCheckConfig struct {
	// Paths are the checkpoint roots to check; none, no storage check.
	Paths []string `json:"paths"`
	// MinFreeBytes and MinFreePercent are the least free space each path's
	// filesystem must have, for unprivileged users; 0 does not check.
	MinFreeBytes   uint64  `json:"min_free_bytes"`
	MinFreePercent float64 `json:"min_free_percent"`
	// RequireMount wants each path on a filesystem other than the root
	// one: a shared filesystem that failed to mount leaves an empty
	// directory behind, where checkpoints would silently go.
	RequireMount bool `json:"require_mount"`
}

// CommandCheck is an operator's check: an executable that exits 0 when the
// node is healthy.
type CommandCheck struct {
	// Name names the check everywhere (a DNS-1123 label).
	Name string   `json:"name"`
	Path string   `json:"path"`
	Args []string `json:"args"`
	// Timeout is the check's own; 0 takes health_checks.timeout.
	Timeout wire.Duration `json:"timeout"`
	// Critical also stops the node's running job when the check fails.
	Critical bool `json:"critical"`
}

// Built-in checks' names.
const (
	checkGPU            = "gpu"
	checkGPUPerformance = "gpu-performance"
	checkNetwork        = "network"
	checkStorage        = "storage"
)

// maxCommandChecks bounds the operator's checks; each is one process per
// interval.
const maxCommandChecks = 32

// DefaultHealthChecks runs the built-ins every minute.
func DefaultHealthChecks() HealthChecksConfig {
	return HealthChecksConfig{
		Interval: wire.Duration{Duration: time.Minute},
		Timeout:  wire.Duration{Duration: 10 * time.Second},
		GPU:      GPUCheckConfig{PersistenceMode: true},
		Network:  NetworkCheckConfig{InfiniBand: true},
	}
}

// Validate names each problem with its field, under prefix.
func (h HealthChecksConfig) Validate(prefix string) error {
	var errs []error
	if h.Interval.Duration <= 0 {
		errs = append(errs, wire.Fieldf(prefix+".interval", "must be positive, got %s", h.Interval))
	}
	if h.Timeout.Duration <= 0 {
		errs = append(errs, wire.Fieldf(prefix+".timeout", "must be positive, got %s", h.Timeout))
	}
	if n := h.GPU.ExpectedCount; n < 0 || n > wire.MaxGPUsPerNode {
		errs = append(errs, wire.Fieldf(prefix+".gpu.expected_count", "must be between 0 (as found at start) and %d, got %d", wire.MaxGPUsPerNode, n))
	}
	if h.Network.SpeedMbps < 0 {
		errs = append(errs, wire.Fieldf(prefix+".network.speed_mbps", "must be 0 (not checked) or more, got %d", h.Network.SpeedMbps))
	}
	if h.Network.MTU < 0 || h.Network.MTU > 65536 {
		errs = append(errs, wire.Fieldf(prefix+".network.mtu", "must be 0 (not checked) or an MTU up to 65536, got %d", h.Network.MTU))
	}
	for i, p := range h.Storage.Paths {
		if fe := wire.CheckPath(fmt.Sprintf("%s.storage.paths[%d]", prefix, i), p, ""); fe != nil {
			errs = append(errs, fe)
		}
	}
	if p := h.Storage.MinFreePercent; p < 0 || p >= 100 {
		errs = append(errs, wire.Fieldf(prefix+".storage.min_free_percent", "must be at least 0 and below 100, got %g", p))
	}
	if len(h.Commands) > maxCommandChecks {
		errs = append(errs, wire.Fieldf(prefix+".commands", "at most %d, got %d", maxCommandChecks, len(h.Commands)))
	}
	names := map[string]bool{checkGPU: true, checkGPUPerformance: true, checkNetwork: true, checkStorage: true}
	for i, c := range h.Commands {
		field := fmt.Sprintf("%s.commands[%d]", prefix, i)
		if fe := wire.ValidateName(field+".name", c.Name); fe != nil {
			errs = append(errs, fe)
		} else if names[c.Name] {
			errs = append(errs, wire.Fieldf(field+".name", "%q is taken by a built-in or an earlier command", c.Name))
		}
		names[c.Name] = true
		if fe := wire.CheckPath(field+".path", c.Path, ""); fe != nil {
			errs = append(errs, fe)
		}
		if c.Timeout.Duration < 0 {
			errs = append(errs, wire.Fieldf(field+".timeout", "must be 0 (health_checks.timeout) or positive, got %s", c.Timeout))
		}
	}
	if h.RunAs != "" {
		if fe := wire.ValidateRunAs(prefix+".run_as", h.RunAs); fe != nil {
			errs = append(errs, fe)
		}
	}
	return errors.Join(errs...)
}
