package jobspec

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// launcherCase is extra_args and command, and the field the error names
// ("" when they are accepted).
type launcherCase struct {
	name    string
	extra   []string
	command []string
	want    string
	// v2only cases give options only torch 2.x's torchrun has.
	v2only bool
}

var launcherCases = []launcherCase{
	// Every spelling class of a reserved option.
	{"canonical", []string{"--nnodes", "1"}, nil, "launcher.extra_args[0]: spells torchrun's --nnodes, which rdzv sets: the number of nodes", false},
	{"canonical with =", []string{"--nnodes=1"}, nil, "launcher.extra_args[0]: spells torchrun's --nnodes", false},
	{"dash variant", []string{"--node-rank", "0"}, nil, "launcher.extra_args[0]: spells torchrun's --node_rank, which rdzv sets: this node's rank", false},
	{"dash variant with =", []string{"--nproc-per-node=8"}, nil, "spells torchrun's --nproc_per_node, which rdzv sets: procs_per_node", false},
	{"prefix", []string{"--nn", "1"}, nil, "launcher.extra_args[0]: spells torchrun's --nnodes", false},
	{"prefix with =", []string{"--nnod=1"}, nil, "spells torchrun's --nnodes", false},
	{"prefix of an address", []string{"--master_a=10.0.0.9"}, nil, "spells torchrun's --master_addr, which rdzv sets: the address", false},
	{"dashed prefix", []string{"--master-p", "1"}, nil, "spells torchrun's --master_port", false},
	{"rdzv_conf", []string{"--rdzv_conf=join_timeout=1"}, nil, "spells torchrun's --rdzv_conf, which rdzv sets: rdzv runs the rendezvous itself", false},
	{"rdzv_conf prefix", []string{"--rdzv-c", "x=y"}, nil, "spells torchrun's --rdzv_conf", false},
	{"standalone", []string{"--standalone"}, nil, "spells torchrun's --standalone", false},
	{"ambiguous prefix", []string{"--rdzv=x"}, nil, "could be read by torchrun as --rdzv_backend or --rdzv_endpoint or --rdzv_id or --rdzv_conf", false},
	{"upper case", []string{"--NNODES=1"}, nil, "spells torchrun's --nnodes", false},
	{"single dash", []string{"-nnodes", "1"}, nil, "spells torchrun's --nnodes", false},
	{"single dash prefix", []string{"-n", "1"}, nil, "could be read by torchrun as --nnodes or --nproc_per_node or --node_rank", false},
	{"single dash short letter with =", []string{"-rdzv_id=x"}, nil, "spells torchrun's --rdzv_id", false},
	{"triple dash", []string{"---nnodes=1"}, nil, "spells torchrun's --nnodes", false},
	{"value with a space", []string{"--nn=1 2"}, nil, "spells torchrun's --nnodes", false},
	{"later in the list", []string{"--tee", "3", "--log_dir", "/tmp/x", "--master_port=1"}, nil, "launcher.extra_args[4]: spells torchrun's --master_port", false},
	{"after --", []string{"--", "--nnodes=1"}, nil, "launcher.extra_args[1]", false},
	// torchrun reads command as options too, up to the training script.
	{"option before the script", nil, []string{"--nnodes=1", "train.py"}, "command[0]: spells torchrun's --nnodes, which rdzv sets: the number of nodes the controller admitted, within nodes.min and nodes.max (torchrun reads command up to the training script", false},
	{"dash variant before the script", []string{"--tee", "3"}, []string{"--node-rank", "0", "train.py"}, "command[0]: spells torchrun's --node_rank", false},
	{"value from command", []string{"--role"}, []string{"x", "--nnodes=1", "train.py"}, "command[1]: spells torchrun's --nnodes", false},
	{"short value from command", []string{"-r"}, []string{"3", "--nn", "1", "train.py"}, "command[1]: spells torchrun's --nnodes", false},
	{"flag cluster ending in a value", []string{"-mr"}, []string{"3", "--master_addr=x", "train.py"}, "command[1]: spells torchrun's --master_addr", false},
	{"unknown option takes a value", []string{"--some-future-option"}, []string{"x", "--nnodes=1", "train.py"}, "command[1]: spells torchrun's --nnodes", false},

	// What a job may give.
	{"other options", []string{"--tee", "3", "--log_dir", "/tmp/x", "--monitor_interval=1", "--role", "w"}, nil, "", false},
	{"exact name that no reserved option starts with", []string{"--max_restarts=1", "--no_python"}, nil, "", false},
	{"prefix of a free option", []string{"--tee=3", "--mon", "1", "--red", "3"}, nil, "", false},
	{"torch 2.x options", []string{"--log-dir", "/tmp/x", "--local_addr", "10.0.0.2", "--local-r=0", "--virtual-local-rank"}, nil, "", true},
	{"value that looks reserved", []string{"--role=--nnodes=3"}, nil, "", false},
	{"short options", []string{"-m", "-r3", "-t", "2"}, nil, "", false},
	{"ends with a flag", []string{"--no_python"}, nil, "", false},
	{"ends with a short flag", []string{"-m"}, []string{"pkg.train", "--nnodes", "4"}, "", false},
	{"module in command", nil, []string{"-m", "pkg.train", "--nnodes", "4"}, "", false},
	{"value from command, then the script", []string{"--role"}, []string{"w", "train.py", "--nnodes=4"}, "", false},
	{"flag cluster ending in a value, then the script", []string{"-mr"}, []string{"3", "pkg.train"}, "", false},
	{"script arguments are the script's", nil, []string{"train.py", "--nnodes", "4", "--master_addr=x"}, "", false},
	{"negative number", []string{"--role", "w"}, []string{"train.py", "-1"}, "", false},
}

func TestLauncherArgsEverySpelling(t *testing.T) {
	for _, tt := range launcherCases {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse([]byte(goodJob))
			require.NoError(t, err)
			s.Launcher.ExtraArgs = tt.extra
			s.Launcher.KindReason = "" // torchrun's rule, as if named
			if tt.command != nil {
				s.Command = tt.command
			}
			err = s.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				checkNothingReserved(t, s)
				return
			}
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestReservedEnvEveryName(t *testing.T) {
	tests := []struct {
		name, want string
	}{
		{"NCCL_SOCKET_IFNAME", "env.NCCL_SOCKET_IFNAME: is set for each worker by rdzv and torchrun: the node's NCCL interface"},
		{"CUDA_VISIBLE_DEVICES", "the GPUs the agent gave the job"},
		{"MASTER_PORT", "the port the controller chose"},
		{"WORLD_SIZE", "env.WORLD_SIZE: is set for each worker"},
		{"RANK", "env.RANK:"},
		{"LOCAL_RANK", "env.LOCAL_RANK:"},
		{"GROUP_RANK", "env.GROUP_RANK:"},
		{"NODE_RANK", "env.NODE_RANK:"},
		{"LOCAL_WORLD_SIZE", "env.LOCAL_WORLD_SIZE:"},
		{"RDZV_NODE", "env.RDZV_NODE: is set by the rdzv agent"},
		{"TORCHELASTIC_RUN_ID", "env.TORCHELASTIC_RUN_ID: is torchrun's own"},
		{"TORCHELASTIC_USE_AGENT_STORE", "env.TORCHELASTIC_USE_AGENT_STORE: is torchrun's own"},
		{"PET_NNODES", "env.PET_NNODES: is read by torchrun as its --nnodes, which rdzv sets: the number of nodes"},
		{"PET_RDZV_CONF", "env.PET_RDZV_CONF: is read by torchrun as its --rdzv_conf, which rdzv sets"},
		{"PET_STANDALONE", "env.PET_STANDALONE: is read by torchrun as its --standalone"},
		{"PET_ROLE", "env.PET_ROLE: is read by torchrun as its --role option; give that in launcher.extra_args instead"},
		{"PET_", "env.PET_: is in torchrun's namespace"},
		{"OMP_NUM_THREADS", ""},
		{"NCCL_DEBUG", ""},
		{"PETER", ""},
		{"MASTER", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse([]byte(goodJob))
			require.NoError(t, err)
			s.Env = map[string]string{tt.name: "1"}
			err = s.Validate()
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// torchrunParser runs the installed torchrun's own argument parser
// (torch.distributed.run.get_args_parser) from Debian's python3-torch.
func torchrunParser(t *testing.T, script string, input any) []byte {
	t.Helper()
	if err := exec.Command("/usr/bin/python3", "-c", "import torch.distributed.run").Run(); err != nil {
		t.Skipf("no torchrun to compare with (apt-get install python3-torch): %v", err)
	}
	in, err := json.Marshal(input)
	require.NoError(t, err)
	cmd := exec.Command("/usr/bin/python3", "-c", script)
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.Output()
	require.NoError(t, err, "%s", out)
	return out
}

// TestTorchrunOptionsAsInstalled holds torchrunOptions to the installed
// torchrun: every option it has is listed, with its short form and whether
// it takes a value, and every option listed for torch 1.13 is there.
func TestTorchrunOptionsAsInstalled(t *testing.T) {
	out := torchrunParser(t, `
import json, sys, argparse
from torch.distributed.run import get_args_parser
opts = []
for a in get_args_parser()._actions:
    if not a.option_strings:
        continue
    opts.append({"dest": a.dest, "strings": a.option_strings, "flag": a.nargs == 0})
json.dump(opts, sys.stdout)
`, nil)
	var installed []struct {
		Dest    string
		Strings []string
		Flag    bool
	}
	require.NoError(t, json.Unmarshal(out, &installed))
	known := map[string]launcherOption{}
	for _, o := range torchrunOptions {
		known[o.name] = o
	}
	have := map[string]bool{}
	for _, in := range installed {
		have[in.Dest] = true
		o, ok := known[in.Dest]
		require.True(t, ok, "torchrun's --%s is missing from torchrunOptions", in.Dest)
		require.Equal(t, in.Flag, o.flag, "--%s", in.Dest)
		for _, s := range in.Strings {
			if len(s) == 2 {
				require.Equal(t, s[1], o.short, "--%s", in.Dest)
			} else {
				require.Equal(t, in.Dest, strings.ReplaceAll(strings.TrimPrefix(s, "--"), "-", "_"))
			}
		}
	}
	for _, o := range torchrunOptions {
		if !o.since2 {
			require.True(t, have[o.name], "--%s is listed for torch 1.13 but the installed torchrun lacks it", o.name)
		}
	}
}

// TestLauncherRuleMatchesTorchrun parses every case with the installed
// torchrun's parser after the options rdzv gives: what the rule accepts
// leaves each reserved option as rdzv set it, and the spellings refused for
// being abbreviations really are read as the reserved option.
func TestLauncherRuleMatchesTorchrun(t *testing.T) {
	rdzvArgs := []string{"--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "2", "--master_addr", "10.0.0.1", "--master_port", "29500"}
	var reserved []string
	for _, o := range torchrunOptions {
		if o.setBy != "" {
			reserved = append(reserved, o.name)
		}
	}
	var argvs [][]string
	for _, tt := range launcherCases {
		command := tt.command
		if command == nil {
			command = []string{"train.py"}
		}
		argvs = append(argvs, append(append(append([]string{}, rdzvArgs...), tt.extra...), command...))
	}
	out := torchrunParser(t, `
import json, sys, io, contextlib
from torch.distributed.run import get_args_parser
req = json.load(sys.stdin)
base = vars(get_args_parser().parse_args(req["argvs"][0][:10] + ["train.py"]))
res = []
for argv in req["argvs"]:
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            got = vars(get_args_parser().parse_args(argv))
    except SystemExit:
        res.append(None)
        continue
    res.append([d for d in req["reserved"] if got[d] != base[d]])
json.dump(res, sys.stdout)
`, map[string]any{"argvs": argvs, "reserved": reserved})
	var changed [][]string
	require.NoError(t, json.Unmarshal(out, &changed))
	require.Len(t, changed, len(launcherCases))
	byName := map[string][]string{}
	for i, tt := range launcherCases {
		byName[tt.name] = changed[i]
		if tt.want == "" {
			if !tt.v2only {
				require.NotNil(t, changed[i], "%s: torchrun refuses what rdzv accepts", tt.name)
			}
			require.Empty(t, changed[i], "%s: accepted, yet torchrun reads a reserved option", tt.name)
		}
	}
	// The bypasses found in review, as torchrun 1.13 and later read them.
	for name, dest := range map[string]string{
		"prefix": "nnodes", "prefix with =": "nnodes", "prefix of an address": "master_addr",
		"rdzv_conf": "rdzv_conf", "later in the list": "master_port", "value from command": "nnodes",
		"option before the script": "nnodes", "short value from command": "nnodes",
	} {
		require.Equal(t, []string{dest}, byName[name], name)
	}
}
