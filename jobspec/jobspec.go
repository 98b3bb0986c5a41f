// Package jobspec parses, defaults and validates job.yaml. rdzvctl validates
// before it submits and the controller validates again on every StartJob, so
// both share this one implementation. It must stay free of cgo and etcd.
package jobspec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/rdzv/rdzv/wire"
	"github.com/rdzv/rdzv/wire/yamlcheck"
)

// MaxFileBytes bounds a job file.
const MaxFileBytes = 1 << 20

// Defaults applied by Default.
const (
	DefaultLastCall   = 10 * time.Second
	DefaultTimeout    = 15 * time.Minute
	DefaultTorchrun   = "torchrun"
	DefaultRestarts   = 3
	DefaultBackoff    = time.Second
	DefaultBackoffMax = time.Minute
	// DefaultCheckpointTimeout bounds a checkpoint save (health.checkpoint_timeout):
	// saving a large model to shared storage takes minutes, never an hour.
	DefaultCheckpointTimeout = time.Hour
	// DefaultStartupTimeout bounds the start of a generation of a job that
	// reported steps before (health.startup_timeout): imports, process group
	// set-up and loading the checkpoint.
	DefaultStartupTimeout = 30 * time.Minute
)

// DefaultMarkers recognise torch.distributed.checkpoint (.metadata, written
// last), Hugging Face Trainer (trainer_state.json, written after the
// weights) and rdzv's example (COMPLETE).
var DefaultMarkers = []string{".metadata", "trainer_state.json", "COMPLETE"}

// Spec is job.yaml. Field tags are the YAML names (sigs.k8s.io/yaml goes
// through JSON).
type Spec struct {
	Name         string            `json:"name"`
	Nodes        NodeRange         `json:"nodes"`
	GPUsPerNode  int               `json:"gpus_per_node"`
	ProcsPerNode int               `json:"procs_per_node"`
	Command      []string          `json:"command"`
	Workdir      string            `json:"workdir"`
	Env          map[string]string `json:"env"`
	Selector     map[string]string `json:"selector"`
	Checkpoint   Checkpoint        `json:"checkpoint"`
	Rendezvous   Rendezvous        `json:"rendezvous"`
	Launcher     Launcher          `json:"launcher"`
	Restart      Restart           `json:"restart"`
	Health       Health            `json:"health"`
	// SecretEnv is environment whose values never appear in API responses,
	// events or logs.
	SecretEnv map[string]string `json:"secret_env"`
	// EnvFiles maps variable names to files each node's agent reads when it
	// starts the workers, so the values never pass through the controller.
	EnvFiles map[string]string `json:"env_files"`
	// RunAs is the user the workers run as (name or uid[:gid]); empty uses
	// the agent's run_as, by default a dynamic user of the job's own on
	// each node (agent/dynuser.go).
	RunAs string `json:"run_as"`

	// pos is where each field was in the job file, for Validate's errors;
	// nil for a spec that did not come from one.
	pos yamlcheck.Positions
}

// NodeRange is nodes: a number, a range "2-4" or {min: 2, max: 4}.
type NodeRange struct {
	Min int `json:"min"`
	Max int `json:"max"`
	// Spares is how many healthy idle nodes are held for the job while it
	// runs, so that a recovery never waits for a free node.
	Spares int `json:"spares"`
	// Grow says when a job running on fewer than Max nodes takes eligible
	// idle nodes: GrowCheckpoint (the default) restarts it on more nodes
	// right after its next complete checkpoint, GrowNever keeps its width
	// until a failure restarts it.
	Grow string `json:"grow"`
}

// The values of nodes.grow.
const (
	GrowCheckpoint = "checkpoint"
	GrowNever      = "never"
)

type Checkpoint struct {
	Dir string `json:"dir"`
	// Markers are file names whose presence in a step directory under Dir
	// marks that checkpoint complete; any one suffices.
	Markers []string `json:"markers"`
	// Memory turns on in-memory checkpoints replicated to peers
	// (docs/checkpoints.md); nil is off.
	Memory *MemoryCheckpoint `json:"memory"`
}

// MemoryCheckpoint is checkpoint.memory.
type MemoryCheckpoint struct {
	// Replicas is how many peer nodes hold a copy of each node's shards:
	// the nodes of the next node ranks, wrapping.
	Replicas int `json:"replicas"`
	// MaxBytes bounds the shards, own and replicas, a node keeps for the
	// job; the oldest step goes first.
	MaxBytes int64 `json:"max_bytes"`
	// PersistEvery makes a step saved in memory whose number is a
	// multiple of it durable too: the workers write it to Dir in the
	// background (docs/checkpoints.md). 0 never.
	PersistEvery int `json:"persist_every"`
	// Replicated says every rank's state is the same (DDP's), so a
	// generation whose world size changed (a node lost and none to take
	// its place, or the job grown back) resumes from memory too, rank R
	// from the shard of rank R modulo the saving world size. Without it
	// such a generation resumes from the durable checkpoint: a sharded
	// state (FSDP, DCP, ZeRO partitions) does not fit another world.
	Replicated bool `json:"replicated"`
}

// Defaults of checkpoint.memory.
const (
	DefaultMemoryReplicas = 1
	DefaultMemoryMaxBytes = 8 << 30
	// MaxMemoryReplicas bounds checkpoint.memory.replicas.
	MaxMemoryReplicas = 3
	// MaxPersistEvery bounds checkpoint.memory.persist_every.
	MaxPersistEvery = 1_000_000
)

type Restart struct {
	// MaxRestarts is how many failed attempts are restarted before the job
	// fails; 0 never restarts.
	MaxRestarts *int    `json:"max_restarts"`
	Backoff     Backoff `json:"backoff"`
}

// Backoff is the wait before a restart: Initial, doubled per consecutive
// failure, capped at Max.
type Backoff struct {
	Initial *wire.Duration `json:"initial"`
	Max     *wire.Duration `json:"max"`
}

type Health struct {
	// ProgressTimeout: no training step reported for this long is a hang
	// and restarts the job. Unset derives it from the observed step time
	// (health.StepTimeout); 0s turns hang detection off in every phase.
	ProgressTimeout *wire.Duration `json:"progress_timeout"`
	// CheckpointTimeout bounds a checkpoint save the workers announced
	// (rdzv.checkpoint_begin); 0s never takes a save for a hang.
	CheckpointTimeout *wire.Duration `json:"checkpoint_timeout"`
	// StartupTimeout bounds a generation's start, up to its first step
	// report, for a job that reported steps in an earlier generation; 0s
	// is off.
	StartupTimeout *wire.Duration `json:"startup_timeout"`
	// Preflight is the round smoke test; nil is off.
	Preflight *Preflight `json:"preflight"`
}

// Preflight is the round smoke test run before the training command: a
// node whose links are slower than MinBandwidthMbps is left out of the
// round, which is planned again without it.
type Preflight struct {
	MinBandwidthMbps float64 `json:"min_bandwidth_mbps"`
	// Bytes is the size of the all-reduce and of each timed transfer.
	Bytes int64 `json:"bytes"`
	// Timeout bounds the whole test, torch's import included.
	Timeout *wire.Duration `json:"timeout"`
}

// Preflight defaults and bounds: a few MB tell a 1 Gbit/s link from a
// 100 Gbit/s one, and the test must stay a small part of a start.
const (
	DefaultPreflightBytes   = 4 << 20
	DefaultPreflightTimeout = time.Minute
	MinPreflightBytes       = 4 << 10
	MaxPreflightBytes       = 256 << 20
	MaxPreflightTimeout     = 10 * time.Minute
)

type Rendezvous struct {
	// LastCall is how long to wait for more nodes once min are available.
	LastCall *wire.Duration `json:"last_call"`
	// Timeout is how long a job may wait for min nodes before it fails; 0s
	// waits forever.
	Timeout *wire.Duration `json:"timeout"`
}

// Launcher is what starts the workers on each node (see launchers.go).
type Launcher struct {
	// Kind is auto (the default), torchrun, python-module, accelerate,
	// deepspeed, custom or warm; auto is resolved by Default (AutoKind).
	Kind string `json:"kind"`
	// KindReason says why auto resolved to Kind; empty for a kind the job
	// named. Not job.yaml's: the proto carries it, and Export shows it as
	// a comment on kind.
	KindReason string `json:"-"`
	// Torchrun is the torchrun executable (kind torchrun).
	Torchrun string `json:"torchrun"`
	// Python and Module run `<python> -m <module>` with torchrun's options
	// (kind python-module); Python also runs warm's standbys.
	Python string `json:"python"`
	Module string `json:"module"`
	// Executable is accelerate's or deepspeed's launcher.
	Executable string `json:"executable"`
	// Argv is a custom launcher's command line with placeholders.
	Argv      []string `json:"argv"`
	ExtraArgs []string `json:"extra_args"`
	// Preload are the modules a warm standby imports before its
	// assignment (kind warm).
	Preload []string `json:"preload"`
}

// LoadFile reads, parses and defaults a job file. Relative workdir and
// checkpoint.dir are resolved against the file's directory, which is where
// an operator naturally keeps a job's script. It does not validate.
func LoadFile(path string) (*Spec, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("reading job file: %w", err)
	}
	if info.Size() > MaxFileBytes {
		return nil, fmt.Errorf("job file %s is %d bytes, more than the %d allowed: %w", path, info.Size(), MaxFileBytes, ErrInvalid)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading job file: %w", err)
	}
	spec, err := ParseIn(data, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return spec, nil
}

// ParseIn parses a job file's content (Parse) and resolves its relative
// workdir and checkpoint.dir against dir: the file's directory, or the
// working directory for a job read from stdin.
func ParseIn(data []byte, dir string) (*Spec, error) {
	spec, err := Parse(data)
	if err != nil {
		return nil, err
	}
	base, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("resolving job file directory: %w", err)
	}
	spec.Workdir = resolve(base, spec.Workdir)
	spec.Checkpoint.Dir = resolve(base, spec.Checkpoint.Dir)
	return spec, nil
}

func resolve(base, p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(base, p)
}

// Parse decodes job.yaml strictly (unknown fields and wrong types are
// errors, each with its line and column) and applies defaults.
func Parse(data []byte) (*Spec, error) {
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("job is %d bytes, more than the %d allowed: %w", len(data), MaxFileBytes, ErrInvalid)
	}
	pos, errs, err := checkYAML(data)
	if err != nil {
		return nil, fmt.Errorf("parsing job: not valid YAML: %v: %w", err, ErrInvalid)
	}
	if len(errs) > 0 {
		return nil, &ValidationError{Errors: errs}
	}
	var spec Spec
	// checkYAML has already refused what this would; an error here is a
	// case it missed, still refused.
	if err := yaml.UnmarshalStrict(data, &spec); err != nil {
		return nil, fmt.Errorf("parsing job: %v: %w", err, ErrInvalid)
	}
	spec.pos = pos
	spec.Default()
	return &spec, nil
}

// Default fills in what the operator left out.
func (s *Spec) Default() {
	if s.Nodes.Max == 0 {
		s.Nodes.Max = s.Nodes.Min
	}
	if s.Nodes.Grow == "" {
		s.Nodes.Grow = GrowCheckpoint
	}
	if s.ProcsPerNode == 0 {
		s.ProcsPerNode = max(s.GPUsPerNode, 1)
	}
	if s.Rendezvous.LastCall == nil {
		s.Rendezvous.LastCall = wire.Dur(DefaultLastCall)
	}
	if s.Rendezvous.Timeout == nil {
		s.Rendezvous.Timeout = wire.Dur(DefaultTimeout)
	}
	s.defaultLauncher()
	if s.Restart.MaxRestarts == nil {
		n := DefaultRestarts
		s.Restart.MaxRestarts = &n
	}
	if s.Restart.Backoff.Initial == nil {
		s.Restart.Backoff.Initial = wire.Dur(DefaultBackoff)
	}
	if s.Restart.Backoff.Max == nil {
		s.Restart.Backoff.Max = wire.Dur(max(DefaultBackoffMax, s.Restart.Backoff.Initial.Duration))
	}
	if len(s.Checkpoint.Markers) == 0 {
		s.Checkpoint.Markers = append([]string(nil), DefaultMarkers...)
	}
	if m := s.Checkpoint.Memory; m != nil {
		if m.Replicas == 0 {
			m.Replicas = DefaultMemoryReplicas
		}
		if m.MaxBytes == 0 {
			m.MaxBytes = DefaultMemoryMaxBytes
		}
	}
	// ProgressTimeout stays unset: the controller derives it.
	if s.Health.CheckpointTimeout == nil {
		s.Health.CheckpointTimeout = wire.Dur(DefaultCheckpointTimeout)
	}
	if s.Health.StartupTimeout == nil {
		s.Health.StartupTimeout = wire.Dur(DefaultStartupTimeout)
	}
	if pf := s.Health.Preflight; pf != nil {
		if pf.Bytes == 0 {
			pf.Bytes = DefaultPreflightBytes
		}
		if pf.Timeout == nil {
			pf.Timeout = wire.Dur(DefaultPreflightTimeout)
		}
	}
}

// ErrInvalid marks every validation failure so callers can map it (to
// InvalidArgument at the gRPC boundary) with errors.Is.
var ErrInvalid = errors.New("invalid job")
