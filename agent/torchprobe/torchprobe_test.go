package torchprobe

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/jobspec"
)

// interpreters are the Pythons with torch this machine has: Debian's
// (torch 1.13), and the venvs `make e2e` names (the newest torch rdzv
// supports, and the oldest 2.x).
func interpreters(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		out["debian"] = "/usr/bin/python3"
	}
	for _, v := range []string{"RDZV_VENV", "RDZV_VENV_OLDEST"} {
		dir := os.Getenv(v)
		if dir == "" {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is unset in CI", v)
			}
			continue
		}
		out[v] = filepath.Join(dir, "bin", "python")
	}
	return out
}

// The table jobspec checks submitted jobs against (the controller cannot
// ask a node) is a superset of every real torchrun's parser: each option,
// whether it takes a value, and whether torch 1.13 has it. Each real
// parser's spellings all reach their option in jobspec's reading ('-' as
// '_'), so a reserved option cannot be given in a spelling the table
// misses. The worker environment is what rdzv's warm standby emulates.
func TestProbeRealTorch(t *testing.T) {
	if testing.Short() {
		t.Skip("runs torchrun")
	}
	pythons := interpreters(t)
	if len(pythons) == 0 {
		t.Skip("no Python with torch here")
	}
	for name, python := range pythons {
		t.Run(name, func(t *testing.T) {
			r, err := Run(context.Background(), python, []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir()}, nil)
			if err != nil && strings.Contains(err.Error(), "No module named 'torch'") && name == "debian" {
				t.Skip("Debian's python3 has no torch here")
			}
			require.NoError(t, err)
			t.Logf("torch %s on Python %v: std_bug %v, worker env %v", r.Torch, r.Python, r.StdBug, r.Env)
			for _, o := range r.Options {
				info, ok := jobspec.LookupTorchrunOption(o.Dest)
				require.True(t, ok, "torch %s's --%s is missing from jobspec's torchrunOptions", r.Torch, o.Dest)
				require.Equal(t, o.Flag, info.Flag, "torch %s's --%s: flag", r.Torch, o.Dest)
				if strings.HasPrefix(r.Torch, "1.") {
					require.False(t, info.Since2, "torch %s has --%s", r.Torch, o.Dest)
				}
				for _, s := range o.Strings {
					if strings.HasPrefix(s, "--") {
						require.Equal(t, o.Dest, strings.ReplaceAll(strings.TrimPrefix(s, "--"), "-", "_"), "torch %s spells --%s as %s", r.Torch, o.Dest, s)
					}
				}
			}
			major := strings.SplitN(r.Torch, ".", 2)[0]
			require.Equal(t, major == "1" && r.Python[0] == 3 && r.Python[1] >= 11, r.StdBug)
			for _, k := range []string{"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE"} {
				require.Contains(t, r.Env, k)
			}
			require.Equal(t, "1", r.Env["LOCAL_RANK"])
			require.FileExists(t, r.Module, "the answer names torch's module, which keeps it on disk")
			require.Equal(t, "True", r.Env["TORCHELASTIC_USE_AGENT_STORE"], "the static rendezvous's agent hosts the store")
		})
	}
}

func TestResolve(t *testing.T) {
	r := &Result{Options: []Option{
		{Dest: "nnodes", Strings: []string{"--nnodes"}},
		{Dest: "nproc_per_node", Strings: []string{"--nproc-per-node", "--nproc_per_node"}},
		{Dest: "node_rank", Strings: []string{"--node-rank", "--node_rank"}},
		{Dest: "redirects", Strings: []string{"-r", "--redirects"}},
		{Dest: "module", Strings: []string{"-m", "--module"}, Flag: true},
	}}
	dests := func(os []Option) []string {
		var out []string
		for _, o := range os {
			out = append(out, o.Dest)
		}
		return out
	}
	for _, tt := range []struct {
		arg  string
		want []string
	}{
		{"--nnodes", []string{"nnodes"}},
		{"--nnodes=2", []string{"nnodes"}},
		{"--nproc-per-node=4", []string{"nproc_per_node"}},
		{"--nproc", []string{"nproc_per_node"}},
		{"--n", []string{"nnodes", "nproc_per_node", "node_rank"}},
		{"--node-r", []string{"node_rank"}},
		{"-r3", []string{"redirects"}},
		{"-m", []string{"module"}},
		{"train.py", nil},
		{"--", nil},
		{"--other", nil},
	} {
		require.Equal(t, tt.want, dests(r.Resolve(tt.arg)), tt.arg)
	}
}

func TestCacheProbesOnce(t *testing.T) {
	var calls atomic.Int32
	fail := errors.New("no torch")
	c := NewCache(func(_ context.Context, python string, env []string, _ *syscall.Credential) (*Result, error) {
		calls.Add(1)
		if len(env) > 0 {
			return nil, fail
		}
		return &Result{Torch: "2.15.0"}, nil
	}, "")
	python := filepath.Join(t.TempDir(), "python")
	require.NoError(t, os.WriteFile(python, nil, 0o755))
	for range 3 {
		r, err := c.Get(context.Background(), python, nil, nil)
		require.NoError(t, err)
		require.Equal(t, "2.15.0", r.Torch)
	}
	require.EqualValues(t, 1, calls.Load())
	for range 2 {
		_, err := c.Get(context.Background(), python, []string{"PYTHONPATH=/x"}, nil)
		require.ErrorIs(t, err, fail)
	}
	require.EqualValues(t, 2, calls.Load(), "another environment is another probe; a failure is kept")
	_, err := c.Get(context.Background(), filepath.Join(t.TempDir(), "missing"), nil, nil)
	require.Error(t, err)
}

// An answer kept on disk spares a new cache (an agent restarted) the probe
// while torch's module is unchanged; a changed module, or an answer that
// names none, is probed again.
func TestCacheKeepsAnswersOnDisk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "torchprobe")
	module := filepath.Join(t.TempDir(), "__init__.py")
	require.NoError(t, os.WriteFile(module, nil, 0o644))
	python := filepath.Join(t.TempDir(), "python")
	require.NoError(t, os.WriteFile(python, nil, 0o755))
	var calls atomic.Int32
	probe := func(_ context.Context, _ string, env []string, _ *syscall.Credential) (*Result, error) {
		calls.Add(1)
		if len(env) > 0 {
			return &Result{Torch: "2.15.0"}, nil // names no module: not kept
		}
		return &Result{Torch: "2.15.0", Module: module, Options: []Option{{Dest: "nnodes", Strings: []string{"--nnodes"}}}}, nil
	}
	tests := []struct {
		name  string
		env   []string
		touch bool
		calls int32
	}{
		{"first probe", nil, false, 1},
		{"kept on disk", nil, false, 1},
		{"torch changed", nil, true, 2},
		{"kept again", nil, false, 2},
		{"no module named", []string{"PYTHONPATH=/x"}, false, 3},
		{"not kept without a module", []string{"PYTHONPATH=/x"}, false, 4},
	}
	for i, tt := range tests {
		if tt.touch {
			at := time.Now().Add(time.Duration(i) * time.Hour)
			require.NoError(t, os.Chtimes(module, at, at))
		}
		r, err := NewCache(probe, dir).Get(context.Background(), python, tt.env, nil)
		require.NoError(t, err, tt.name)
		require.Equal(t, "2.15.0", r.Torch, tt.name)
		require.Equal(t, tt.calls, calls.Load(), tt.name)
	}
	info, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), info.Mode().Perm())
}
