package jobspec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/wire"
)

const goodJob = `
name: llama-pretrain
nodes: {min: 2, max: 4, spares: 1}
gpus_per_node: 8
command: ["train.py", "--lr", "3e-4"]
workdir: /shared/llama
env: {OMP_NUM_THREADS: "4"}
selector: {pool: train}
checkpoint: {dir: /shared/ckpt, memory: {replicas: 1}}
rendezvous: {last_call: 5s, timeout: 2m}
launcher: {torchrun: /usr/bin/torchrun, extra_args: ["--redirects", "2"]}
restart: {max_restarts: 5, backoff: {initial: 2s, max: 20s}}
health: {progress_timeout: 2m, preflight: {min_bandwidth_mbps: 1000}}
`

func TestParseGood(t *testing.T) {
	spec, err := Parse([]byte(goodJob))
	require.NoError(t, err)
	require.NoError(t, spec.Validate())
	require.Equal(t, "llama-pretrain", spec.Name)
	require.Equal(t, NodeRange{Min: 2, Max: 4, Spares: 1, Grow: GrowCheckpoint}, spec.Nodes, "nodes.grow defaults to checkpoint")
	require.Equal(t, 8, spec.ProcsPerNode, "procs_per_node defaults to gpus_per_node")
	require.Equal(t, 5*time.Second, spec.Rendezvous.LastCall.Duration)
	require.Equal(t, 2*time.Minute, spec.Rendezvous.Timeout.Duration)
	require.Equal(t, []string{"--redirects", "2"}, spec.Launcher.ExtraArgs)
	require.Equal(t, 5, *spec.Restart.MaxRestarts)
	require.Equal(t, 20*time.Second, spec.Restart.Backoff.Max.Duration)
	require.Equal(t, 2*time.Minute, spec.Health.ProgressTimeout.Duration)
	require.Equal(t, &Preflight{MinBandwidthMbps: 1000, Bytes: DefaultPreflightBytes, Timeout: wire.Dur(DefaultPreflightTimeout)}, spec.Health.Preflight)
}

func TestDefaults(t *testing.T) {
	spec, err := Parse([]byte("name: a\nnodes: {min: 3}\ncommand: [x.py]\n"))
	require.NoError(t, err)
	require.NoError(t, spec.Validate())
	require.Equal(t, 3, spec.Nodes.Max, "max defaults to min")
	require.Equal(t, 1, spec.ProcsPerNode, "one process per node without GPUs")
	require.Equal(t, DefaultLastCall, spec.Rendezvous.LastCall.Duration)
	require.Equal(t, DefaultTimeout, spec.Rendezvous.Timeout.Duration)
	require.Equal(t, KindWarm, spec.Launcher.Kind, "a Python script runs warm unless the job says otherwise")
	require.Equal(t, DefaultPreload, spec.Launcher.Preload)
	require.Equal(t, DefaultRestarts, *spec.Restart.MaxRestarts)
	require.Equal(t, DefaultBackoff, spec.Restart.Backoff.Initial.Duration)
	require.Equal(t, DefaultBackoffMax, spec.Restart.Backoff.Max.Duration)
	require.Equal(t, DefaultMarkers, spec.Checkpoint.Markers)
	require.Nil(t, spec.Health.ProgressTimeout, "the step timeout is derived unless set")
	require.Equal(t, DefaultCheckpointTimeout, spec.Health.CheckpointTimeout.Duration)
	require.Equal(t, DefaultStartupTimeout, spec.Health.StartupTimeout.Duration)
	require.Nil(t, FromProto(spec.ToProto()).Health.ProgressTimeout, "unset survives the proto")
}

func TestExplicitZeroRestartsIsKept(t *testing.T) {
	spec, err := Parse([]byte("name: a\nnodes: {min: 1}\ncommand: [x.py]\nrestart: {max_restarts: 0}\n"))
	require.NoError(t, err)
	require.Zero(t, *spec.Restart.MaxRestarts)
	require.Zero(t, *FromProto(spec.ToProto()).Restart.MaxRestarts)
}

func TestExplicitZeroTimeoutIsKept(t *testing.T) {
	spec, err := Parse([]byte("name: a\nnodes: {min: 1}\ncommand: [x.py]\nrendezvous: {timeout: 0s, last_call: 0s}\n"))
	require.NoError(t, err)
	require.Zero(t, spec.Rendezvous.Timeout.Duration)
	require.Zero(t, spec.Rendezvous.LastCall.Duration)
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		// wantField is the field the error must name.
		wantField string
	}{
		{"unknown field", "name: a\nnodes: {min: 1}\ncommand: [x]\nnodez: 3\n", "nodez"},
		{"unknown nested field", "name: a\nnodes: {min: 1, maxx: 2}\ncommand: [x]\n", "maxx"},
		{"wrong type", "name: a\nnodes: {min: two}\ncommand: [x]\n", "min"},
		{"duration as number", "name: a\nnodes: {min: 1}\ncommand: [x]\nrendezvous: {last_call: 10}\n", "duration"},
		{"bad duration", "name: a\nnodes: {min: 1}\ncommand: [x]\nrendezvous: {timeout: soon}\n", "soon"},
		{"not yaml", "name: [unclosed\n", "parsing job"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, tt.wantField)
		})
	}
}

func TestValidateRejects(t *testing.T) {
	tests := []struct {
		name      string
		mutate    func(*Spec)
		wantField string
	}{
		{"empty name", func(s *Spec) { s.Name = "" }, "name: is required"},
		{"uppercase name", func(s *Spec) { s.Name = "Llama" }, `name: must be a DNS-1123 label`},
		{"name with slash", func(s *Spec) { s.Name = "../etc" }, "name:"},
		{"long name", func(s *Spec) { s.Name = string(make([]byte, 64)) }, "name:"},
		{"min zero", func(s *Spec) { s.Nodes.Min = 0 }, "nodes.min: must be at least 1"},
		{"min above max", func(s *Spec) { s.Nodes.Min, s.Nodes.Max = 4, 2 }, "nodes.max: must be at least nodes.min (4) (got 2)"},
		{"too many nodes", func(s *Spec) { s.Nodes.Max = wire.MaxNodes + 1 }, "nodes.max: must be at most"},
		{"negative spares", func(s *Spec) { s.Nodes.Spares = -1 }, "nodes.spares: must be between 0 and 10000 (got -1)"},
		{"unknown grow", func(s *Spec) { s.Nodes.Grow = "always" }, `nodes.grow: must be "checkpoint" or "never" (got "always")`},
		{"negative gpus", func(s *Spec) { s.GPUsPerNode = -1 }, "gpus_per_node"},
		{"procs zero", func(s *Spec) { s.ProcsPerNode = 0 }, "procs_per_node"},
		{"empty command", func(s *Spec) { s.Command = nil }, "command: is required"},
		{"blank script", func(s *Spec) { s.Command = []string{" "} }, "command[0]"},
		{"relative workdir", func(s *Spec) { s.Workdir = "jobs/x" }, "workdir: must be an absolute path"},
		{"unclean workdir", func(s *Spec) { s.Workdir = "/jobs/../etc" }, "workdir: must be a clean path"},
		{"relative checkpoint", func(s *Spec) { s.Checkpoint.Dir = "ckpt" }, "checkpoint.dir"},
		{"bad env name", func(s *Spec) { s.Env = map[string]string{"1BAD": "x"} }, `env: variable names`},
		{"reserved env", func(s *Spec) { s.Env = map[string]string{"NCCL_SOCKET_IFNAME": "eth1"} }, "env.NCCL_SOCKET_IFNAME: is set for each worker by rdzv"},
		{"rdzv env prefix", func(s *Spec) { s.Env = map[string]string{"RDZV_JOB": "x"} }, "env.RDZV_JOB"},
		{"bad selector key", func(s *Spec) { s.Selector = map[string]string{"-bad": "x"} }, "selector:"},
		{"bad selector value", func(s *Spec) { s.Selector = map[string]string{"pool": "a b"} }, "selector.pool"},
		{"negative last call", func(s *Spec) { s.Rendezvous.LastCall = wire.Dur(-time.Second) }, "rendezvous.last_call"},
		{"negative timeout", func(s *Spec) { s.Rendezvous.Timeout = wire.Dur(-time.Second) }, "rendezvous.timeout"},
		{"empty torchrun", func(s *Spec) { s.Launcher.Torchrun = " " }, "launcher.torchrun"},
		{"agent-owned flag", func(s *Spec) { s.Launcher.ExtraArgs = []string{"--nnodes=4"} }, "launcher.extra_args[0]"},
		{"agent-owned flag spaced", func(s *Spec) { s.Launcher.ExtraArgs = []string{"--tee", "2", "--master_port", "1"} }, "launcher.extra_args[2]"},
		{"negative restarts", func(s *Spec) { n := -1; s.Restart.MaxRestarts = &n }, "restart.max_restarts"},
		{"backoff max below initial", func(s *Spec) { s.Restart.Backoff.Max = wire.Dur(time.Millisecond) }, "restart.backoff.max: must be at least restart.backoff.initial"},
		{"negative backoff", func(s *Spec) { s.Restart.Backoff.Initial = wire.Dur(-time.Second) }, "restart.backoff.initial"},
		{"marker with a slash", func(s *Spec) { s.Checkpoint.Markers = []string{"../x"} }, "checkpoint.markers[0]: must be a plain file name"},
		{"empty marker", func(s *Spec) { s.Checkpoint.Markers = []string{"COMPLETE", ""} }, "checkpoint.markers[1]"},
		{"too many memory replicas", func(s *Spec) { s.Checkpoint.Memory = &MemoryCheckpoint{Replicas: 4, MaxBytes: 1 << 30} },
			"checkpoint.memory.replicas: must be between 1 and 3 (got 4)"},
		{"tiny memory bound", func(s *Spec) { s.Checkpoint.Memory = &MemoryCheckpoint{Replicas: 1, MaxBytes: 10} },
			"checkpoint.memory.max_bytes: must be at least 1048576 (1 MiB) (got 10)"},
		{"negative persist_every", func(s *Spec) {
			s.Checkpoint.Memory = &MemoryCheckpoint{Replicas: 1, MaxBytes: 1 << 30, PersistEvery: -1}
		},
			"checkpoint.memory.persist_every: must be between 0 (never) and 1000000 (got -1)"},
		{"persist_every without a dir", func(s *Spec) {
			s.Checkpoint.Dir = ""
			s.Checkpoint.Memory = &MemoryCheckpoint{Replicas: 1, MaxBytes: 1 << 30, PersistEvery: 10}
		}, "checkpoint.memory.persist_every: needs checkpoint.dir, where the steps are persisted (got 10)"},
		{"negative progress timeout", func(s *Spec) { s.Health.ProgressTimeout = wire.Dur(-time.Second) }, "health.progress_timeout"},
		{"negative checkpoint timeout", func(s *Spec) { s.Health.CheckpointTimeout = wire.Dur(-time.Second) }, "health.checkpoint_timeout: must be 0s (off) or a positive duration (got -1s)"},
		{"negative startup timeout", func(s *Spec) { s.Health.StartupTimeout = wire.Dur(-time.Second) }, "health.startup_timeout"},
		{"negative preflight bandwidth", func(s *Spec) { s.Health.Preflight.MinBandwidthMbps = -1 }, "health.preflight.min_bandwidth_mbps: must be 0 (only failures exclude) or a bandwidth in Mbit/s (got -1)"},
		{"tiny preflight", func(s *Spec) { s.Health.Preflight.Bytes = 10 }, "health.preflight.bytes: must be between 4096 and 268435456 (got 10)"},
		{"long preflight", func(s *Spec) { s.Health.Preflight.Timeout = wire.Dur(time.Hour) }, "health.preflight.timeout: must be positive and at most 10m0s (got 1h0m0s)"},
		{"nul in arg", func(s *Spec) { s.Command = []string{"x.py", "a\x00b"} }, "command[1]"},
		{"long env name", func(s *Spec) { s.Env = map[string]string{strings.Repeat("A", 257): "x"} }, "env: variable names"},
		{"env value too big", func(s *Spec) { s.Env = map[string]string{"BIG": strings.Repeat("x", 32<<10+1)} }, "env.BIG: value must be at most"},
		{"bad secret name", func(s *Spec) { s.SecretEnv = map[string]string{"A-B": "x"} }, `secret_env: variable names`},
		{"reserved secret", func(s *Spec) { s.SecretEnv = map[string]string{"MASTER_ADDR": "x"} }, "secret_env.MASTER_ADDR: is set for each worker by rdzv"},
		{"secret also in env", func(s *Spec) { s.SecretEnv = map[string]string{"OMP_NUM_THREADS": "x"} }, "secret_env.OMP_NUM_THREADS: is already given in env"},
		{"env file also a secret", func(s *Spec) {
			s.SecretEnv = map[string]string{"TOKEN": "x"}
			s.EnvFiles = map[string]string{"TOKEN": "/etc/token"}
		}, "env_files.TOKEN: is already given in secret_env"},
		{"relative env file", func(s *Spec) { s.EnvFiles = map[string]string{"TOKEN": "token"} }, "env_files.TOKEN: must be an absolute path"},
		{"env file traversal", func(s *Spec) { s.EnvFiles = map[string]string{"TOKEN": "/run/../etc/shadow"} }, "env_files.TOKEN: must be a clean path"},
		{"empty env file", func(s *Spec) { s.EnvFiles = map[string]string{"TOKEN": ""} }, "env_files.TOKEN: must name the file"},
		{"too many variables", func(s *Spec) {
			s.Env, s.SecretEnv = map[string]string{}, map[string]string{}
			for i := range 200 {
				s.Env[fmt.Sprintf("E%d", i)], s.SecretEnv[fmt.Sprintf("S%d", i)] = "x", "y"
			}
		}, "env: at most 256 variables are allowed across env, secret_env and env_files (got 400)"},
		{"run_as with a space", func(s *Spec) { s.RunAs = "no body" }, `run_as: must be a user name`},
		{"run_as path", func(s *Spec) { s.RunAs = "../root" }, "run_as:"},
		{"run_as long name", func(s *Spec) { s.RunAs = strings.Repeat("u", 33) }, "run_as:"},
		{"run_as uid -1", func(s *Spec) { s.RunAs = "4294967295" }, "run_as: uid and gid must be below 4294967295"},
		{"run_as gid overflow", func(s *Spec) { s.RunAs = "1000:99999999999" }, "run_as: uid and gid"},
		{"run_as empty gid", func(s *Spec) { s.RunAs = "1000:" }, "run_as:"},
		{"whole spec too large", func(s *Spec) {
			// Every field within its own limit, the sum above wire.MaxSpecBytes.
			s.Command = []string{"x.py"}
			for range 200 {
				s.Command = append(s.Command, strings.Repeat("a", 4000))
			}
		}, "job: is larger than the 524288 bytes allowed in all"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := Parse([]byte(goodJob))
			require.NoError(t, err)
			tt.mutate(spec)
			err = spec.Validate()
			require.ErrorIs(t, err, ErrInvalid)
			var verr *ValidationError
			require.True(t, errors.As(err, &verr))
			require.ErrorContains(t, err, tt.wantField)
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	spec := &Spec{Name: "Bad_Name", Nodes: NodeRange{Min: 0}}
	spec.Default()
	var verr *ValidationError
	require.ErrorAs(t, spec.Validate(), &verr)
	require.Len(t, verr.Errors, 3) // name, nodes.min, command
}

func TestLoadFileResolvesRelativePaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "job.yaml")
	require.NoError(t, os.WriteFile(path, []byte("name: a\nnodes: {min: 1}\ncommand: [train.py]\nworkdir: .\ncheckpoint: {dir: ckpt}\n"), 0o600))
	spec, err := LoadFile(path)
	require.NoError(t, err)
	require.NoError(t, spec.Validate())
	require.Equal(t, dir, spec.Workdir)
	require.Equal(t, filepath.Join(dir, "ckpt"), spec.Checkpoint.Dir)
}

func TestLoadFileRejectsOversized(t *testing.T) {
	path := filepath.Join(t.TempDir(), "job.yaml")
	require.NoError(t, os.WriteFile(path, make([]byte, MaxFileBytes+1), 0o600))
	_, err := LoadFile(path)
	require.ErrorIs(t, err, ErrInvalid)
}

func TestProtoRoundTrip(t *testing.T) {
	spec, err := Parse([]byte(goodJob))
	require.NoError(t, err)
	back := FromProto(spec.ToProto())
	spec.pos = nil // where fields were in the file does not travel
	require.Equal(t, spec, back)
}

func TestValidateAcceptsRunAsAndSecrets(t *testing.T) {
	for _, runAs := range []string{"", "nobody", "train_user", "svc-train.1", "65534", "1000:1000", "0"} {
		spec, err := Parse([]byte(goodJob))
		require.NoError(t, err)
		spec.RunAs = runAs
		spec.SecretEnv = map[string]string{"HF_TOKEN": "hf_abc"}
		spec.EnvFiles = map[string]string{"WANDB_API_KEY": "/etc/rdzv/wandb"}
		require.NoError(t, spec.Validate(), "run_as %q", runAs)
	}
}

// A secret's value must not leak through a validation error, which reaches
// rdzvctl's output and the controller's logs.
func TestValidateNeverQuotesSecretValues(t *testing.T) {
	const secret = "s3cr3t-value"
	for _, value := range []string{secret + "\x00", strings.Repeat(secret, 4000)} {
		spec, err := Parse([]byte(goodJob))
		require.NoError(t, err)
		spec.SecretEnv = map[string]string{"TOKEN": value}
		err = spec.Validate()
		require.ErrorContains(t, err, "secret_env.TOKEN")
		require.NotContains(t, err.Error(), secret)
	}
}

func TestParseSecretsAndRunAs(t *testing.T) {
	spec, err := Parse([]byte(goodJob + "secret_env: {HF_TOKEN: hf_abc}\nenv_files: {WANDB_API_KEY: /etc/rdzv/wandb}\nrun_as: \"1000:100\"\n"))
	require.NoError(t, err)
	require.NoError(t, spec.Validate())
	require.Equal(t, map[string]string{"HF_TOKEN": "hf_abc"}, spec.SecretEnv)
	require.Equal(t, map[string]string{"WANDB_API_KEY": "/etc/rdzv/wandb"}, spec.EnvFiles)
	require.Equal(t, "1000:100", spec.RunAs)
	spec.pos = nil
	require.Equal(t, spec, FromProto(spec.ToProto()))
}

func TestRedactSpec(t *testing.T) {
	spec, err := Parse([]byte(goodJob + "secret_env: {HF_TOKEN: hf_abc}\n"))
	require.NoError(t, err)
	stored := spec.ToProto()
	shown := RedactSpec(stored)
	require.Equal(t, map[string]string{"HF_TOKEN": Redacted}, shown.GetSecretEnv())
	require.Equal(t, "hf_abc", stored.GetSecretEnv()["HF_TOKEN"], "the stored record keeps the value")
	require.Equal(t, spec.Env, shown.GetEnv(), "plain env is shown")
	plain := (&Spec{Name: "a"}).ToProto()
	require.Same(t, plain, RedactSpec(plain), "nothing to redact, nothing copied")
}
