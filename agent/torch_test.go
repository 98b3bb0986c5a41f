package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/agent/torchprobe"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// torch113 and torch215 are what the probe reads from torch 1.13 on
// Python 3.11 and from torch 2.15, cut to the options these tests use.
var (
	torch113 = &torchprobe.Result{Torch: "1.13.0a0", Python: []int{3, 11, 2}, StdBug: true, Options: []torchprobe.Option{
		{Dest: "nnodes", Strings: []string{"--nnodes"}},
		{Dest: "nproc_per_node", Strings: []string{"--nproc_per_node"}},
		{Dest: "node_rank", Strings: []string{"--node_rank"}},
		{Dest: "module", Strings: []string{"-m", "--module"}, Flag: true},
		{Dest: "redirects", Strings: []string{"-r", "--redirects"}},
		{Dest: "tee", Strings: []string{"-t", "--tee"}},
		{Dest: "max_restarts", Strings: []string{"--max_restarts"}},
	}}
	torch215 = &torchprobe.Result{Torch: "2.15.0", Python: []int{3, 11, 2}, Options: []torchprobe.Option{
		{Dest: "nnodes", Strings: []string{"--nnodes"}},
		{Dest: "nproc_per_node", Strings: []string{"--nproc-per-node", "--nproc_per_node"}},
		{Dest: "node_rank", Strings: []string{"--node-rank", "--node_rank"}},
		{Dest: "module", Strings: []string{"-m", "--module"}, Flag: true},
		{Dest: "redirects", Strings: []string{"-r", "--redirects"}},
		{Dest: "tee", Strings: []string{"-t", "--tee"}},
		{Dest: "max_restarts", Strings: []string{"--max-restarts", "--max_restarts"}},
		{Dest: "local_ranks_filter", Strings: []string{"--local-ranks-filter", "--local_ranks_filter"}},
	}, Env: map[string]string{
		"OMP_NUM_THREADS": "1", "RANK": "1", "LOCAL_RANK": "1", "MASTER_PORT": "4242",
		"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
		"TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT", "TORCHELASTIC_ERROR_FILE": "/tmp/x/attempt_0/1/error.json",
	}}
)

func TestTorchrunOptions(t *testing.T) {
	for _, tt := range []struct {
		name    string
		torch   *torchprobe.Result
		extra   []string
		command []string
		want    []string
		field   string // the refused argument's, if any
	}{
		{"2.x needs nothing", torch215, nil, []string{"train.py"}, nil, ""},
		{"1.13 on 3.11 gets redirects and tee", torch113, nil, []string{"train.py"}, []string{"--redirects", "2", "--tee", "2"}, ""},
		{"the job's own tee is kept", torch113, []string{"--tee=1"}, []string{"train.py"}, []string{"--redirects", "2"}, ""},
		{"short forms count", torch113, []string{"-r1", "-t", "2"}, []string{"train.py"}, nil, ""},
		{"a value 1.13 cannot read", torch113, []string{"--redirects", "3"}, []string{"train.py"}, nil, "launcher.extra_args[0]"},
		{"a mapping 1.13 cannot read", torch113, []string{"--tee", "0:1,1:0"}, []string{"train.py"}, nil, "launcher.extra_args[0]"},
		{"2.x reads 3", torch215, []string{"--redirects", "3"}, []string{"train.py"}, nil, ""},
		{"hyphenated reserved", torch215, []string{"--nproc-per-node=4"}, []string{"train.py"}, nil, "launcher.extra_args[0]"},
		{"prefix of reserved", torch215, []string{"--max-restarts", "1", "--node-r", "3"}, []string{"train.py"}, nil, "launcher.extra_args[2]"},
		{"ambiguous prefix with a reserved one", torch215, []string{"--n", "3"}, []string{"train.py"}, nil, "launcher.extra_args[0]"},
		{"in command before the script", torch215, nil, []string{"--nnodes", "2", "train.py"}, nil, "command[0]"},
		{"the script's own options are its", torch215, nil, []string{"train.py", "--nnodes", "2"}, nil, ""},
		{"allowed 2.x option", torch215, []string{"--local-ranks-filter", "0"}, []string{"-m", "pkg.train"}, nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := torchrunOptions(tt.torch, "node-a", tt.extra, tt.command)
			if tt.field == "" {
				require.NoError(t, err)
				require.Equal(t, tt.want, got)
				return
			}
			var pf *preflightError
			require.ErrorAs(t, err, &pf)
			require.Equal(t, wire.FailureLauncherOption, pf.failure)
			var fe *wire.FieldError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, tt.field, fe.Field)
			require.Contains(t, fe.Reason, tt.torch.Torch)
		})
	}
}

func TestShebangPython(t *testing.T) {
	dir := t.TempDir()
	python := filepath.Join(dir, "python3.11")
	require.NoError(t, os.WriteFile(python, nil, 0o755))
	for _, tt := range []struct{ first, want string }{
		{"#!/usr/bin/python3.11", "/usr/bin/python3.11"},
		{"#!/opt/venv/bin/python -u", "/opt/venv/bin/python"},
		{"#!/usr/bin/env python3.11", python},
		{"#!/usr/bin/env bash", ""},
		{"#!/bin/sh", ""},
		{"ELF", ""},
	} {
		script := filepath.Join(t.TempDir(), "torchrun")
		require.NoError(t, os.WriteFile(script, []byte(tt.first+"\nimport sys\n"), 0o755))
		require.Equal(t, tt.want, shebangPython(script, dir), tt.first)
	}
	require.Empty(t, shebangPython(filepath.Join(dir, "missing"), dir))
}

func TestProbeEnv(t *testing.T) {
	require.Equal(t, []string{"HOME=/h", "PATH=/bin", "PYTHONPATH=/p", "VIRTUAL_ENV=/v"},
		probeEnv([]string{"HOME=/h", "JOB_SECRET=x", "PATH=/bin", "PYTHONPATH=/p", "RDZV_JOB=j", "VIRTUAL_ENV=/v"}))
}

// The default launcher, torchrun, with no launcher block, on this
// machine's Debian torch 1.13 on Python 3.11: without the --redirects and
// --tee the agent adds from what that torch says, its torchrun dies
// starting the workers (AttributeError: 'NoneType' object has no
// attribute 'get').
func TestDefaultLauncherDebianTorch(t *testing.T) {
	if testing.Short() {
		t.Skip("runs torchrun")
	}
	const torchrun = "/usr/bin/torchrun"
	if _, err := os.Stat(torchrun); err != nil {
		t.Skip("needs Debian's python3-torch")
	}
	h := newSupervisor(t)
	require.NoError(t, os.WriteFile(filepath.Join(h.workdir, "train.py"), []byte(`import os
open("rank-" + os.environ["RANK"], "w").write(os.environ.get("TORCHELASTIC_USE_AGENT_STORE", ""))
`), 0o644))
	a := h.assignment("deb", 1)
	a.Spec.LauncherTorchrun, a.Spec.NodesMin, a.Spec.NodesMax = torchrun, 1, 1
	a.Nnodes, a.NodeRank, a.MasterAddr, a.MasterPort = 1, 0, "127.0.0.1", freePort(t)
	h.sup.Assign(a)
	// The first start asks the node's torch (seconds); nothing here is timed.
	deadline := time.After(5 * time.Minute)
	for {
		var st *rdzvv1.WorkerStatus
		select {
		case st = <-h.sup.Updates():
		case <-deadline:
			require.FailNow(t, "the job did not end")
		}
		if st.GetState() == rdzvv1.WorkerState_WORKER_STATE_RUNNING {
			continue
		}
		if st.GetState() != rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED {
			b, _ := os.ReadFile(filepath.Join(h.stateDir, "logs", "deb.log"))
			require.FailNow(t, "the job failed", "%v\n%s", st, b)
		}
		break
	}
	for _, r := range []string{"0", "1"} {
		b, err := os.ReadFile(filepath.Join(h.workdir, "rank-"+r))
		require.NoError(t, err)
		require.Equal(t, "True", string(b))
	}
	b, err := os.ReadFile(filepath.Join(h.stateDir, "logs", "deb.log"))
	require.NoError(t, err)
	require.Contains(t, string(b), "--redirects 2 --tee 2")
}
