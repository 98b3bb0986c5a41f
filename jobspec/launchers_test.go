package jobspec

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

var assigned = Assigned{Job: "llm", Generation: 3, NNodes: 2, NodeRank: 1, ProcsPerNode: 4, MasterAddr: "10.0.0.1", MasterPort: 29500, Hostfile: "/var/lib/rdzv/jobs/llm/hostfile.3"}

// Each kind gets the assignment in its own flags, then extra_args, then
// command.
func TestLaunchEachKind(t *testing.T) {
	tests := []struct {
		name     string
		launcher string
		program  string
		args     []string
	}{
		{"torchrun by default", "{extra_args: [--tee, \"3\"]}", "torchrun",
			[]string{"--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "4", "--master_addr", "10.0.0.1", "--master_port", "29500", "--tee", "3", "train.py", "--lr", "1"}},
		{"torchrun path", "{kind: torchrun, torchrun: /opt/venv/bin/torchrun}", "/opt/venv/bin/torchrun",
			[]string{"--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "4", "--master_addr", "10.0.0.1", "--master_port", "29500", "train.py", "--lr", "1"}},
		{"python-module defaults", "{kind: python-module}", "python3",
			[]string{"-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "4", "--master_addr", "10.0.0.1", "--master_port", "29500", "train.py", "--lr", "1"}},
		{"python-module own python and module", "{kind: python-module, python: /opt/venv/bin/python, module: my.run}", "/opt/venv/bin/python",
			[]string{"-m", "my.run", "--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "4", "--master_addr", "10.0.0.1", "--master_port", "29500", "train.py", "--lr", "1"}},
		{"accelerate", "{kind: accelerate, extra_args: [--multi_gpu, --mixed_precision, bf16]}", "accelerate",
			[]string{"launch", "--num_machines", "2", "--machine_rank", "1", "--num_processes", "8", "--main_process_ip", "10.0.0.1", "--main_process_port", "29500", "--rdzv_backend", "static",
				"--multi_gpu", "--mixed_precision", "bf16", "train.py", "--lr", "1"}},
		{"deepspeed", "{kind: deepspeed, executable: /opt/venv/bin/deepspeed}", "/opt/venv/bin/deepspeed",
			[]string{"--no_ssh", "--hostfile", "/var/lib/rdzv/jobs/llm/hostfile.3", "--num_nodes", "2", "--node_rank", "1", "--num_gpus", "4", "--master_addr", "10.0.0.1", "--master_port", "29500", "train.py", "--lr", "1"}},
		{"custom", "{kind: custom, argv: [/opt/launch.sh, \"--nodes={nnodes}\", \"--rank={node_rank}\", \"{nproc_per_node}\", \"{master_addr}:{master_port}\", \"{world_size}\", \"{rdzv_id}\", \"{job}/{generation}\", \"{\\\"json\\\": 1}\"], extra_args: [--verbose]}", "/opt/launch.sh",
			[]string{"--nodes=2", "--rank=1", "4", "10.0.0.1:29500", "8", "llm-3", "llm/3", `{"json": 1}`, "--verbose", "train.py", "--lr", "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := Parse([]byte("name: llm\nnodes: 2\ncommand: [train.py, --lr, \"1\"]\nlauncher: " + tt.launcher + "\n"))
			require.NoError(t, err)
			require.NoError(t, spec.Validate())
			program, args := spec.Launch(assigned)
			require.Equal(t, tt.program, program)
			require.Equal(t, tt.args, args)
			require.Equal(t, spec.Launcher, FromProto(spec.ToProto()).Launcher, "the launcher survives the wire")
		})
	}
}

func TestDeepSpeedHostfile(t *testing.T) {
	require.Equal(t, "rdzv-node-0 slots=4\nrdzv-node-1 slots=4\n", string(DeepSpeedHostfile(assigned)))
}

// Nothing a job gives, in any kind's spelling, overrides what rdzv assigns;
// fields of another kind are refused rather than ignored.
func TestValidateLauncherRejects(t *testing.T) {
	tests := []struct {
		name     string
		launcher string
		command  string
		want     string
	}{
		{"unknown kind", "{kind: acelerate}", "[x.py]", `launcher.kind: must be one of accelerate, auto, custom, deepspeed, python-module, torchrun, warm; did you mean accelerate? (got "acelerate")`},
		{"field of another kind", "{kind: accelerate, torchrun: /usr/bin/torchrun}", "[x.py]", "launcher.torchrun: applies only to launcher.kind torchrun, not accelerate"},
		{"python for torchrun", "{kind: torchrun, python: python3.11}", "[x.py]", "launcher.python: applies only to launcher.kind python-module or warm, not torchrun"},
		{"preload for torchrun", "{kind: torchrun, preload: [torch]}", "[x.py]", "launcher.preload: applies only to launcher.kind warm, not torchrun"},
		{"warm extra args", "{kind: warm, extra_args: [--nnodes=3]}", "[x.py]", `launcher.extra_args: does not apply to launcher.kind warm: there is no launcher to take options; the workers get torchrun's environment (got "--nnodes=3")`},
		{"warm bad preload", "{kind: warm, preload: [torch, \"torch/nn\"]}", "[x.py]", `launcher.preload[1]: must be a dotted Python module name like torch.distributed`},
		{"warm preload only a mark", "{kind: warm, preload: [torch, \"?\"]}", "[x.py]", `launcher.preload[1]: must be a dotted Python module name like torch.distributed, optionally ending in "?"`},
		{"warm preload two marks", "{kind: warm, preload: [\"deepspeed??\"]}", "[x.py]", `launcher.preload[0]: must be a dotted Python module name`},
		{"warm launcher option in command", "{kind: warm}", "[--nproc_per_node=8, x.py]", `command[0]: must be the training script or -m <module>: launcher.kind warm takes no launcher options`},
		{"warm -m without module", "{kind: warm}", "[-m]", `command[1]: must be the module that -m runs`},
		{"warm empty python", "{kind: warm, python: \" \"}", "[x.py]", `launcher.python: must name the python to run`},
		{"warm without preflight", "{kind: warm}", "[x.py]\nhealth: {preflight: {}}", `health.preflight: is not supported with launcher.kind warm`},
		{"warm still guards env", "{kind: warm}", "[x.py]\nenv: {RANK: \"1\"}", "env.RANK: is set for each worker"},
		{"argv for deepspeed", "{kind: deepspeed, argv: [x]}", "[x.py]", "launcher.argv: applies only to launcher.kind custom"},
		{"bad module", "{kind: python-module, module: \"torch/run\"}", "[x.py]", "launcher.module: must be a dotted Python module name"},
		{"python-module keeps torchrun's rule", "{kind: python-module, extra_args: [--nnodes=3]}", "[x.py]", "launcher.extra_args[0]: spells torchrun's --nnodes"},
		{"accelerate machines", "{kind: accelerate, extra_args: [--num_machines, \"3\"]}", "[x.py]", "launcher.extra_args[0]: spells accelerate launch's --num_machines, which rdzv sets"},
		{"accelerate dashed prefix", "{kind: accelerate, extra_args: [--main-process-i=1.2.3.4]}", "[x.py]", "spells accelerate launch's --main_process_ip"},
		{"accelerate in command", "{kind: accelerate, extra_args: [--mixed_precision]}", "[bf16, --num_processes=2, x.py]", "command[1]: spells accelerate launch's --num_processes"},
		{"accelerate gpu ids", "{kind: accelerate, extra_args: [--gpu_ids=0,1]}", "[x.py]", "spells accelerate launch's --gpu_ids"},
		{"deepspeed hostfile", "{kind: deepspeed, extra_args: [-H, /etc/hosts]}", "[x.py]", "launcher.extra_args[0]: spells deepspeed's --hostfile"},
		{"deepspeed hostfile attached", "{kind: deepspeed, extra_args: [-H/etc/hosts]}", "[x.py]", "spells deepspeed's --hostfile"},
		{"deepspeed include", "{kind: deepspeed, extra_args: [--include=localhost:0]}", "[x.py]", "spells deepspeed's --include"},
		{"deepspeed gpus", "{kind: deepspeed, extra_args: [--num_g, \"8\"]}", "[x.py]", "spells deepspeed's --num_gpus"},
		{"custom without argv", "{kind: custom}", "[x.py]", "launcher.argv: is required for launcher.kind custom"},
		{"custom unknown placeholder", "{kind: custom, argv: [run.sh, \"{node_rnk}\"]}", "[x.py]", "launcher.argv[1]: unknown placeholder {node_rnk}; did you mean {node_rank}?"},
		{"custom placeholder program", "{kind: custom, argv: [\"{master_addr}\"]}", "[x.py]", "launcher.argv[0]: must name the launcher executable"},
		{"custom still guards env", "{kind: custom, argv: [run.sh]}", "[x.py]\nenv: {MASTER_PORT: \"1\"}", "env.MASTER_PORT: is set for each worker"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := Parse([]byte("name: llm\nnodes: 2\ncommand: " + tt.command + "\nlauncher: " + tt.launcher + "\n"))
			require.NoError(t, err)
			err = spec.Validate()
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// What each kind leaves to the job stays the job's.
func TestValidateLauncherAccepts(t *testing.T) {
	for _, launcher := range []string{
		"{kind: accelerate, extra_args: [--multi_gpu, --mixed_precision, bf16, --config_file, /etc/acc.yaml, --same_network]}",
		"{kind: deepspeed, extra_args: [--no_local_rank, --enable_each_rank_log, /tmp/ds]}",
		"{kind: custom, argv: [run.sh, --nnodes=1, --master_port=9]}", // the template is the job's own
		"{kind: python-module, module: torch.distributed.run, extra_args: [--tee, \"3\"]}",
		"{kind: warm}",
		"{kind: warm, python: /opt/venv/bin/python, preload: [torch, numpy, my_pkg.model]}",
		"{kind: warm, preload: [torch, \"deepspeed?\", \"transformers.models?\"]}",
	} {
		spec, err := Parse([]byte("name: llm\nnodes: 2\ncommand: [x.py]\nlauncher: " + launcher + "\n"))
		require.NoError(t, err)
		require.NoError(t, spec.Validate(), launcher)
	}
}

// Every example job under examples/launchers is valid, and together they
// show every kind.
func TestLauncherExamples(t *testing.T) {
	paths, err := filepath.Glob("../examples/launchers/*.yaml")
	require.NoError(t, err)
	kinds := map[string]bool{}
	for _, p := range append(paths, "../examples/job.yaml") {
		spec, err := LoadFile(p)
		require.NoError(t, err, p)
		require.NoError(t, spec.Validate(), p)
		kinds[spec.Launcher.Kind] = true
		kinds[KindAuto] = kinds[KindAuto] || spec.Launcher.KindReason != ""
	}
	for _, k := range KindNames() {
		require.True(t, kinds[k], "no example job for launcher.kind %s", k)
	}
}

// A job that names no kind (or auto) runs warm exactly where warm runs it
// as torchrun would, and torchrun otherwise; the resolved kind and why
// survive the wire and the export, and a forged reason is refused.
func TestAutoKind(t *testing.T) {
	tests := []struct {
		name     string
		launcher string
		command  string
		kind     string
		reason   string
	}{
		{"script", "{}", "[train.py, --lr, \"1\"]", KindWarm, autoWarm},
		{"auto named", "{kind: auto}", "[train.py]", KindWarm, autoWarm},
		{"module", "{}", "[-m, pkg.train, --steps, \"3\"]", KindWarm, autoWarm},
		{"own python", "{python: /opt/venv/bin/python}", "[train.py]", KindWarm, autoWarm},
		{"own preload", "{preload: [torch, numpy]}", "[train.py]", KindWarm, autoWarm},
		{"torchrun options", "{extra_args: [--tee, \"2\"]}", "[train.py]", KindTorchrun, autoExtraArgs},
		{"launcher option in command", "{}", "[--max_restarts=2, train.py]", KindTorchrun, autoCommand},
		{"not a .py script", "{}", "[./train.sh]", KindTorchrun, autoCommand},
		{"-m without a module", "{}", "[-m]", KindTorchrun, autoCommand},
		{"own torchrun", "{torchrun: /opt/venv/bin/torchrun}", "[train.py]", KindTorchrun, autoTorchrun},
		{"preflight", "{}", "[train.py]\nhealth: {preflight: {}}", KindTorchrun, autoPreflight},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := Parse([]byte("name: llm\nnodes: 2\ncommand: " + tt.command + "\nlauncher: " + tt.launcher + "\n"))
			require.NoError(t, err)
			require.Equal(t, tt.kind, spec.Launcher.Kind)
			require.Equal(t, tt.reason, spec.Launcher.KindReason)
			if tt.command != "[-m]" {
				require.NoError(t, spec.Validate())
			}
			again := FromProto(spec.ToProto())
			require.Equal(t, spec.Launcher, again.Launcher, "the resolution survives the wire")
			e, err := Export(spec.ToProto())
			require.NoError(t, err)
			y, err := e.YAML()
			require.NoError(t, err)
			require.Contains(t, string(y), "kind: auto # resolved to "+tt.kind+": "+tt.reason)
		})
	}
	for _, kind := range []string{KindTorchrun, KindWarm} {
		spec, err := Parse([]byte("name: llm\nnodes: 2\ncommand: [train.py]\nlauncher: {kind: " + kind + "}\n"))
		require.NoError(t, err)
		require.Empty(t, spec.Launcher.KindReason, "a kind the job names has no reason")
		p := spec.ToProto()
		p.LauncherKindReason = autoWarm
		if kind == KindWarm {
			p.LauncherKindReason = autoExtraArgs
		}
		require.ErrorContains(t, FromProto(p).Validate(), "launcher.kind_reason: is rdzv's account")
	}
}
