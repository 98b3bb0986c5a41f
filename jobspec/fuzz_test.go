package jobspec

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// FuzzParse feeds arbitrary job files to the parser and validator: neither
// may panic, and a spec they accept must survive the trip over the wire
// (rdzvctl sends it as proto, the controller and agents validate it again).
func FuzzParse(f *testing.F) {
	example, err := os.ReadFile("../examples/job.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		string(example), goodJob,
		"name: a\nnodes: {min: 1}\ncommand: [x.py]\nrestart: {max_restarts: 0}\n",
		"name: a\nnodes: {min: 1}\ncommand: [x]\nsecret_env: {TOKEN: abc}\nenv_files: {KEY: /etc/key}\nrun_as: \"65534:65534\"\n",
		"name: a\nnodes: {min: 1}\ncommand: [x]\nnodez: 3\n",
		"name: a\nnodes: {min: two}\ncommand: [x]\n",
		"name: a\nnodes: {min: 1}\ncommand: [x]\nrendezvous: {last_call: 10}\n",
		"name: [unclosed\n",
		"a: &a [*a, *a]\n",
		"name: ../../etc\nnodes: {min: 1}\ncommand: [x]\nworkdir: /a/../b\n",
		"name: a\nnodes: {min: 2}\ncommand: [x.py]\nlauncher: {extra_args: [--nn, \"1\", --role]}\nenv: {PET_NNODES: \"1\"}\n",
		"name: a\nnodes: {min: 2}\ncommand: [--node-rank=0, x.py]\nlauncher: {extra_args: [--rdzv_c=a=b]}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := Parse(data)
		if err != nil {
			return
		}
		if spec.Validate() != nil {
			return
		}
		msg := spec.ToProto()
		if n := proto.Size(msg); n > wire.MaxSpecBytes {
			t.Fatalf("accepted a spec of %d bytes", n)
		}
		b, err := proto.Marshal(msg)
		if err != nil {
			t.Fatalf("accepted spec does not marshal: %v", err)
		}
		var got rdzvv1.JobSpec
		if err := proto.Unmarshal(b, &got); err != nil {
			t.Fatalf("accepted spec does not unmarshal: %v", err)
		}
		back := FromProto(&got)
		if err := back.Validate(); err != nil {
			t.Fatalf("accepted spec fails validation after the round trip: %v", err)
		}
		if !proto.Equal(msg, back.ToProto()) {
			t.Fatalf("round trip changed the spec:\n%v\n%v", msg, back.ToProto())
		}
		checkNothingReserved(t, spec)
	})
}

// FuzzLauncherArgs feeds launcher.extra_args and command straight to the
// launcher rule, one argument per line: whatever it accepts, torchrun must
// not read as a reserved option.
func FuzzLauncherArgs(f *testing.F) {
	for _, seed := range []string{
		"--nnodes=2", "--nn\n2", "--node-rank=1", "--rdzv_c=x", "-m\n--nnodes=1", "--role\n--\nx.py",
		"--tee\n3", "--role=--nnodes=3", "-r3", "--no_python", "--\n--nnodes=1", "--nn=1 2",
	} {
		f.Add(seed, "train.py\n--lr\n1")
		f.Add(seed, "--nnodes=1\ntrain.py")
	}
	f.Fuzz(func(t *testing.T, extra, command string) {
		s, err := Parse([]byte(goodJob))
		if err != nil {
			t.Fatal(err)
		}
		s.Launcher.ExtraArgs, s.Command = splitArgs(extra), splitArgs(command)
		if s.Validate() != nil {
			return
		}
		checkNothingReserved(t, s)
	})
}

func splitArgs(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// checkNothingReserved fails when an accepted spec sets, in any spelling
// torch 1.13's or 2.x's torchrun reads, an option or a variable rdzv sets.
// It models argparse (argparseModel) rather than reusing the validator.
func checkNothingReserved(t *testing.T, s *Spec) {
	t.Helper()
	args := append(append([]string{}, s.Launcher.ExtraArgs...), s.Command...)
	for _, v2 := range []bool{false, true} {
		for _, dest := range argparseModel(v2, args) {
			if modelReserved[dest] {
				t.Fatalf("accepted extra_args %q and command %q, which torchrun (2.x: %v) reads as --%s", s.Launcher.ExtraArgs, s.Command, v2, dest)
			}
		}
	}
	for _, env := range []map[string]string{s.Env, s.SecretEnv, s.EnvFiles} {
		for k := range env {
			if strings.HasPrefix(k, "PET_") || strings.HasPrefix(k, "RDZV_") || strings.HasPrefix(k, "TORCHELASTIC_") || modelWorkerEnv[k] {
				t.Fatalf("accepted the variable %s, which torchrun or rdzv sets", k)
			}
		}
	}
}

// modelReserved are the dests of the torchrun options rdzv sets.
var modelReserved = map[string]bool{
	"nnodes": true, "nproc_per_node": true, "node_rank": true, "master_addr": true, "master_port": true,
	"rdzv_backend": true, "rdzv_endpoint": true, "rdzv_id": true, "rdzv_conf": true, "standalone": true,
}

// modelWorkerEnv are the variables torchrun 1.13 sets for each worker
// (torch/distributed/elastic/agent/server/local_elastic_agent.py) and those
// rdzv sets.
var modelWorkerEnv = map[string]bool{
	"LOCAL_RANK": true, "RANK": true, "GROUP_RANK": true, "ROLE_RANK": true, "ROLE_NAME": true,
	"LOCAL_WORLD_SIZE": true, "WORLD_SIZE": true, "GROUP_WORLD_SIZE": true, "ROLE_WORLD_SIZE": true,
	"MASTER_ADDR": true, "MASTER_PORT": true,
	"NCCL_SOCKET_IFNAME": true, "GLOO_SOCKET_IFNAME": true, "CUDA_VISIBLE_DEVICES": true,
}

// argparseModel is Python's argparse (3.11, whose rules later versions
// keep) parsing args with torchrun's options: torch 1.13's, or 2.x's with
// both '_' and '-' spellings. It returns the dests the arguments set, or
// nothing where argparse would fail. Abbreviations of aliases of one
// option count as one match, as Python 3.12 and later read them.
func argparseModel(v2 bool, args []string) []string {
	type action struct {
		dest string
		flag bool
	}
	actions := map[string]action{}
	for _, o := range torchrunOptions {
		if o.since2 && !v2 {
			continue
		}
		a := action{o.name, o.flag}
		actions["--"+o.name] = a
		if v2 {
			actions["--"+strings.ReplaceAll(o.name, "_", "-")] = a
		}
		if o.short != 0 {
			actions["-"+string(o.short)] = a
		}
	}
	type match struct {
		a        action
		opt      string
		explicit *string
	}
	negative := regexp.MustCompile(`^-\d+$|^-\d*\.\d+$`)
	// parseOptional is argparse's _parse_optional: nil for a positional,
	// a match with an empty opt for an unknown option; ok false on error.
	parseOptional := func(arg string) (m *match, ok bool) {
		if arg == "" || arg[0] != '-' {
			return nil, true
		}
		if a, found := actions[arg]; found {
			return &match{a: a, opt: arg}, true
		}
		if len(arg) == 1 {
			return nil, true
		}
		if opt, val, has := strings.Cut(arg, "="); has {
			if a, found := actions[opt]; found {
				return &match{a: a, opt: opt, explicit: &val}, true
			}
		}
		var found []match
		seen := map[string]bool{}
		add := func(m match) {
			if !seen[m.a.dest] {
				seen[m.a.dest] = true
				found = append(found, m)
			}
		}
		if arg[1] == '-' {
			prefix, val, has := strings.Cut(arg, "=")
			for opt, a := range actions {
				if strings.HasPrefix(opt, prefix) {
					m := match{a: a, opt: opt}
					if has {
						m.explicit = &val
					}
					add(m)
				}
			}
		} else {
			for opt, a := range actions {
				if opt == arg[:2] {
					rest := arg[2:]
					add(match{a: a, opt: opt, explicit: &rest})
				} else if strings.HasPrefix(opt, arg) {
					add(match{a: a, opt: opt})
				}
			}
		}
		switch {
		case len(found) > 1:
			return nil, false
		case len(found) == 1:
			return &found[0], true
		case negative.MatchString(arg), strings.Contains(arg, " "):
			return nil, true
		}
		return &match{}, true
	}
	var set []string
	for i := 0; i < len(args); i++ {
		if args[i] == "--" {
			break
		}
		m, ok := parseOptional(args[i])
		if !ok {
			return nil
		}
		if m == nil {
			break // the training script: the rest is its arguments
		}
		if m.opt == "" {
			return nil // unrecognized arguments
		}
		for m.explicit != nil && m.a.flag {
			// -mr3: a short flag, then more short options in its tail.
			if m.opt[1] == '-' || *m.explicit == "" {
				return nil
			}
			set = append(set, m.a.dest)
			next, found := actions["-"+(*m.explicit)[:1]]
			if !found {
				return nil
			}
			rest := (*m.explicit)[1:]
			m = &match{a: next, opt: "-" + (*m.explicit)[:1]}
			if rest != "" {
				m.explicit = &rest
			}
		}
		if !m.a.flag && m.explicit == nil {
			if i+1 >= len(args) || args[i+1] == "--" {
				return nil
			}
			if next, ok := parseOptional(args[i+1]); !ok || next != nil {
				return nil // expected one argument
			}
			i++
		}
		set = append(set, m.a.dest)
	}
	return set
}

// FuzzFromShellLine feeds arbitrary lines to `rdzvctl init --from`'s
// reader: it may not panic, and whatever it reads as a launch line becomes
// a job.yaml that parses back with the same command.
func FuzzFromShellLine(f *testing.F) {
	for _, s := range []string{
		"torchrun --nnodes 1:4 --nproc-per-node=8 -m pkg.train --lr 1e-4",
		`A=1 python -u train.py 'a b' "c\"d"`,
		"deepspeed --num_gpus 8 train.py --deepspeed ds.json",
		"accelerate launch --num_processes 16 --num_machines 2 train.py",
		"python -m torch.distributed.run --nproc_per_node 2 train.py",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		tr, err := FromShellLine(line)
		if err != nil {
			return
		}
		spec, err := Parse([]byte(tr.YAML(tr.NameFor(), line)))
		if err != nil {
			t.Fatalf("init's job.yaml does not parse: %v\n%s", err, tr.YAML(tr.NameFor(), line))
		}
		if len(tr.Command) > 0 && !slices.Equal(spec.Command, tr.Command) {
			t.Fatalf("command %q read back as %q", tr.Command, spec.Command)
		}
	})
}
