package jobspec

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Each mistake an operator makes in job.yaml is reported with the field,
// where it is in the file and what would be right, in YAML's terms: never
// Go type names nor JSON.
func TestParseMistakesSayWhereAndWhat(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string
	}{
		{"misspelt field", "name: a\nnodes: 2\ncommand: [x.py]\ngpu_per_node: 8\n",
			"line 4, column 1: gpu_per_node: unknown field; did you mean gpus_per_node?"},
		{"misspelt nested field", "name: a\nnodes: 2\ncommand: [x.py]\nlauncher:\n  torchrn: /usr/bin/torchrun\n",
			"line 5, column 3: launcher.torchrn: unknown field; did you mean torchrun?"},
		{"field nothing is near", "name: a\nnodes: 2\ncommand: [x.py]\nzzzzzz: 1\n",
			"line 4, column 1: zzzzzz: unknown field; known fields here: name, nodes, gpus_per_node"},
		{"nodes as text", "name: a\nnodes: abc\ncommand: [x.py]\n",
			`line 2, column 8: nodes: expected a number or a range like 2-4 (or {min: 2, max: 4}), got string "abc"`},
		{"nodes.min as text", "name: a\nnodes: {min: two}\ncommand: [x.py]\n",
			`line 2, column 14: nodes.min: expected a whole number, got string "two"`},
		{"gpus as a list", "name: a\nnodes: 1\ngpus_per_node: [8]\ncommand: [x.py]\n",
			"line 3, column 16: gpus_per_node: expected a whole number, got a list"},
		{"command as text", "name: a\nnodes: 1\ncommand: train.py --lr 3\n",
			`line 3, column 10: command: expected a list like [a, b], got string "train.py --lr 3"`},
		{"duration as a number", "name: a\nnodes: 1\ncommand: [x.py]\nrendezvous: {last_call: 10}\n",
			"line 4, column 25: rendezvous.last_call: expected a duration like 30s, 5m or 1h30m, got number 10"},
		{"duration without a unit", "name: a\nnodes: 1\ncommand: [x.py]\nrestart:\n  backoff: {initial: soon}\n",
			`line 5, column 22: restart.backoff.initial: expected a duration like 30s, 5m or 1h30m (units ns, us, ms, s, m, h), got string "soon"`},
		{"env as a list", "name: a\nnodes: 1\ncommand: [x.py]\nenv: [A=1]\n",
			"line 4, column 6: env: expected a mapping like {KEY: value}, got a list"},
		{"env value a mapping", "name: a\nnodes: 1\ncommand: [x.py]\nenv: {A: {b: 1}}\n",
			"line 4, column 10: env.A: expected text, got a mapping"},
		{"section as text", "name: a\nnodes: 1\ncommand: [x.py]\ncheckpoint: /shared/ckpt\n",
			`line 4, column 13: checkpoint: expected a mapping of dir, markers, memory, got string "/shared/ckpt"`},
		{"field given twice", "name: a\nnodes: 1\ncommand: [x.py]\nname: b\n",
			"line 4, column 1: name: is given twice (first at line 1, column 1)"},
		{"not yaml", "name: [unclosed\n", "parsing job: not valid YAML: yaml: line 1"},
		// Found by Validate, after parsing, and still placed in the file.
		{"invalid name", "nodes: 1\ncommand: [x.py]\nname: Llama_7B\n", "line 3, column 7: name: must be a DNS-1123 label"},
		{"reserved flag", "name: a\nnodes: 2\ncommand: [x.py]\nlauncher:\n  extra_args: [--tee, \"2\", --nnodes=4]\n",
			"line 5, column 28: launcher.extra_args[2]: spells torchrun's --nnodes"},
		{"relative workdir from the API", "name: a\nnodes: 1\ncommand: [x.py]\nworkdir: jobs/x\n", "line 4, column 10: workdir: must be an absolute path"},
		{"nodes left empty", "name: a\nnodes:\ncommand: [x.py]\n", "line 2, column 7: nodes.min: must be at least 1 (got 0)"},
		{"max below min", "name: a\nnodes: 4-2\ncommand: [x.py]\n", "line 2, column 8: nodes.max: must be at least nodes.min (4) (got 2)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := Parse([]byte(tt.yaml))
			if err == nil {
				err = spec.Validate()
			}
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, tt.want)
			for _, leak := range []string{"JSON", "json", "Go struct", "jobspec.", "unmarshal"} {
				require.NotContains(t, err.Error(), leak)
			}
		})
	}
}

func TestParseNodesForms(t *testing.T) {
	for in, want := range map[string]NodeRange{
		"3":                             {Min: 3, Max: 3, Grow: GrowCheckpoint},
		"2-4":                           {Min: 2, Max: 4, Grow: GrowCheckpoint},
		`"2 - 4"`:                       {Min: 2, Max: 4, Grow: GrowCheckpoint},
		"{min: 2, max: 4}":              {Min: 2, Max: 4, Grow: GrowCheckpoint},
		"{min: 2}":                      {Min: 2, Max: 2, Grow: GrowCheckpoint},
		"{min: 2, max: 4, grow: never}": {Min: 2, Max: 4, Grow: GrowNever},
	} {
		spec, err := Parse([]byte("name: a\ncommand: [x.py]\nnodes: " + in + "\n"))
		require.NoError(t, err, in)
		require.Equal(t, want, spec.Nodes, in)
	}
}
