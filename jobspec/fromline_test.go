package jobspec

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFromLaunchLine(t *testing.T) {
	for _, tt := range []struct {
		line    string
		fields  string
		dropped []string // the dropped options, as spelled
	}{
		{"torchrun --nproc_per_node=4 train.py --lr 1", "procs_per_node: 4, command: [train.py, --lr, \"1\"]", nil},
		{"torchrun --nnodes 1:4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint host:29400 --max-restarts 3 train.py",
			"nodes: {min: 1, max: 4}, procs_per_node: 8, launcher: {extra_args: [--max-restarts, \"3\"]}, command: [train.py]",
			[]string{"--rdzv-backend c10d", "--rdzv-endpoint host:29400"}},
		{"torchrun --nnodes=2 --node_rank=0 --master_addr=10.0.0.1 --master_port=29500 --nproc_per_node=gpu -m pkg.train",
			"nodes: 2, command: [-m, pkg.train]", []string{"--node_rank=0", "--master_addr=10.0.0.1", "--master_port=29500", "--nproc_per_node=gpu"}},
		{"torchrun --standalone --nproc_per_node 2 train.py", "procs_per_node: 2, command: [train.py]", []string{"--standalone"}},
		{"python3 -m torch.distributed.run --nproc_per_node 2 train.py", "procs_per_node: 2, launcher: {kind: python-module}, command: [train.py]", nil},
		{"/opt/venv/bin/python -m torch.distributed.run train.py", "launcher: {kind: python-module, python: /opt/venv/bin/python}, command: [train.py]", nil},
		{"python train.py --epochs 3", "command: [train.py, --epochs, \"3\"]", nil},
		{"python -u -W ignore train.py", "command: [train.py]", []string{"-W ignore"}},
		{"python3.11 -m pkg.train", "command: [-m, pkg.train]", nil},
		{"/opt/venv/bin/python train.py", "launcher: {kind: python-module, python: /opt/venv/bin/python}, command: [train.py]", nil},
		{"deepspeed --num_gpus 8 --num_nodes 2 --hostfile hosts train.py --deepspeed ds.json",
			"nodes: 2, procs_per_node: 8, launcher: {kind: deepspeed}, command: [train.py, --deepspeed, ds.json]", []string{"--hostfile hosts"}},
		{"deepspeed --bind_cores_to_rank train.py", "launcher: {kind: deepspeed, extra_args: [--bind_cores_to_rank]}, command: [train.py]", nil},
		{"accelerate launch --num_machines 2 --num_processes 16 --mixed_precision bf16 --machine_rank 0 train.py",
			"nodes: 2, procs_per_node: 8, launcher: {kind: accelerate, extra_args: [--mixed_precision, bf16]}, command: [train.py]", []string{"--machine_rank 0"}},
	} {
		t.Run(tt.line, func(t *testing.T) {
			tr, ok := FromLaunchLine(strings.Fields(tt.line))
			require.True(t, ok)
			require.Equal(t, tt.fields, tr.Fields())
			var dropped []string
			for _, d := range tr.Dropped {
				dropped = append(dropped, d.Arg)
				require.NotEmpty(t, d.Why)
			}
			require.Equal(t, tt.dropped, dropped)
		})
	}
	for _, line := range []string{"train.py", "./run.sh", "-m pkg.train", "torchrun.py"} {
		_, ok := FromLaunchLine(strings.Fields(line))
		require.False(t, ok, line)
	}
}

// What init writes is a job.yaml that validates, whatever the line.
func TestTranslationYAMLValidates(t *testing.T) {
	for _, line := range []string{
		"torchrun --nproc_per_node=4 train.py",
		"torchrun --nnodes 1:4 --nproc-per-node 8 --max-restarts 3 train.py --lr 1e-4",
		"deepspeed --num_gpus 8 --num_nodes 2 train.py --deepspeed ds.json",
		"accelerate launch --num_machines 2 --num_processes 16 train.py",
		"python -m torch.distributed.run --nproc_per_node 2 -m pkg.my_train",
		"/opt/venv/bin/python3 -m torch.distributed.run train.py",
		"python My_Train.py yes",
		"accelerate launch",
	} {
		t.Run(line, func(t *testing.T) {
			tr, ok := FromLaunchLine(strings.Fields(line))
			require.True(t, ok)
			spec, err := Parse([]byte(tr.YAML(tr.NameFor(), line)))
			require.NoError(t, err, tr.YAML(tr.NameFor(), line))
			require.NoError(t, spec.Validate(), tr.YAML(tr.NameFor(), line))
			require.Equal(t, spec.ProcsPerNode, spec.GPUsPerNode)
		})
	}
}

func TestNameFor(t *testing.T) {
	for line, want := range map[string]string{
		"python My_Train.py": "my-train", "python -m pkg.fine_tune": "fine-tune", "python": "train", "python --x": "train",
	} {
		tr, _ := FromLaunchLine(strings.Fields(line))
		require.Equal(t, want, tr.NameFor(), line)
	}
}

// A command that starts with a launcher or an interpreter validates no
// more: rdzv's launcher is already in front of it.
func TestValidateCommandLauncher(t *testing.T) {
	for _, tt := range []struct {
		kind    string
		command []string
		want    string // in the reason; "" for no error
	}{
		{"", []string{"torchrun", "--nproc_per_node=4", "train.py"}, "write instead: procs_per_node: 4, command: [train.py]"},
		{"", []string{"python", "train.py"}, "a Python interpreter (python)"},
		{"", []string{"deepspeed", "train.py"}, "launcher: {kind: deepspeed}"},
		{"", []string{"accelerate", "launch", "train.py"}, "launcher: {kind: accelerate}"},
		{"", []string{"python3", "-m", "torch.distributed.run", "train.py"}, "launcher: {kind: python-module}"},
		{"warm", []string{"/usr/bin/python3", "train.py"}, "command: [train.py]"},
		{"", []string{"/opt/venv/bin/python3.11", "-m", "pkg.train"}, "launcher: {kind: python-module, python: /opt/venv/bin/python3.11}, command: [-m, pkg.train]"},
		{"", []string{"train.py", "python"}, ""},
		{"custom", []string{"python", "train.py"}, ""},
	} {
		t.Run(strings.Join(tt.command, " "), func(t *testing.T) {
			s := &Spec{Name: "j", Nodes: NodeRange{Min: 1}, Command: tt.command, Launcher: Launcher{Kind: tt.kind}}
			if tt.kind == KindCustom {
				s.Launcher.Argv = []string{"srun"}
			}
			s.Default()
			err := s.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			var ve *ValidationError
			require.True(t, errors.As(err, &ve), "%v", err)
			require.Len(t, ve.Errors, 1, "%v", err)
			require.Equal(t, "command", ve.Errors[0].Field)
			require.Contains(t, ve.Errors[0].Reason, tt.want)
			require.Contains(t, ve.Errors[0].Reason, "rdzvctl init --from")
		})
	}
}

func TestSplitLine(t *testing.T) {
	for _, tt := range []struct {
		line string
		want []string
		err  bool
	}{
		{"torchrun  --nproc_per_node=4 train.py", []string{"torchrun", "--nproc_per_node=4", "train.py"}, false},
		{`python train.py --name 'a b' --msg "say \"hi\" \$x" ''`, []string{"python", "train.py", "--name", "a b", "--msg", `say "hi" $x`, ""}, false},
		{"torchrun \\\n  --nnodes 2 \\\n  train.py", []string{"torchrun", "--nnodes", "2", "train.py"}, false},
		{`a\ b c`, []string{"a b", "c"}, false},
		{"", nil, false},
		{`python 'open`, nil, true},
		{`python "open`, nil, true},
	} {
		got, err := SplitLine(tt.line)
		if tt.err {
			require.ErrorIs(t, err, ErrNotALaunchLine, tt.line)
			continue
		}
		require.NoError(t, err, tt.line)
		require.Equal(t, tt.want, got, tt.line)
	}
}

func TestFromShellLine(t *testing.T) {
	tr, err := FromShellLine("NCCL_DEBUG=INFO CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node 2 train.py")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"NCCL_DEBUG": "INFO"}, tr.Env)
	require.Equal(t, "CUDA_VISIBLE_DEVICES=0,1", tr.Dropped[0].Arg)
	spec, err := Parse([]byte(tr.YAML(tr.NameFor(), "line")))
	require.NoError(t, err)
	require.NoError(t, spec.Validate())
	require.Equal(t, map[string]string{"NCCL_DEBUG": "INFO"}, spec.Env)

	for _, line := range []string{"./train.sh", "A=1", "", "torchrun 'x"} {
		_, err := FromShellLine(line)
		require.ErrorIs(t, err, ErrNotALaunchLine, line)
	}
}

// A command's words go into job.yaml plain only where YAML reads them back
// as the same string.
func TestFlowScalar(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"train.py", "train.py"},
		{"--lr", "--lr"},
		{"_private", "_private"},
		{"./run.sh", "./run.sh"},
		{"yes", `"yes"`},
		{"Off", `"Off"`},
		{"null", `"null"`},
		{"1e-4", `"1e-4"`},
		{"-_000", `"-_000"`}, // YAML 1.1 drops the underscore: 0
		{"-_0x1F", `"-_0x1F"`},
		{"a b", `"a b"`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			require.Equal(t, tc.want, flowScalar(tc.in))
		})
	}
}
