package agent

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/agent/torchprobe"
	"github.com/rdzv/rdzv/jobspec"
	"github.com/rdzv/rdzv/wire"
)

// The node's torch decides what its torchrun accepts and gives its workers,
// and it changed across versions (option spellings, variables, a Python
// 3.11 incompatibility in 1.x): the agent asks that torch itself
// (torchprobe) rather than trusting a table, for the torchrun kinds (their
// options and the --redirects/--tee a 1.x torch on Python 3.11 needs) and
// for warm standbys (the workers' environment).

// torchProbeDir, under the agent's state_dir, keeps the probes' answers
// across agent restarts (torchprobe.Cache), so that a node joining a
// recovery does not import torch to ask it again.
const torchProbeDir = "torchprobe"

// probeTorch is the answer of python's torch for a job whose prepared
// launch is p, or nil when it has none (no torch, a stand-in launcher):
// the launch then goes ahead as the job gave it.
func (s *Supervisor) probeTorch(python string, p *launchPrep) *torchprobe.Result {
	r, err := s.torch.Get(context.Background(), python, probeEnv(s.baseEnv(p.jobEnv)), p.runAs.Credential)
	if err != nil {
		s.log.Warn("probing the node's torch failed; launching as the job gave it", zap.String("python", python), zap.Error(err))
		return nil
	}
	return r
}

// probeEnv is what of the workers' environment chooses and runs their
// torch: the probe is shared by every job of the same user and interpreter,
// so nothing else of a job's goes into it.
func probeEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "PATH", k == "HOME", k == "LANG", k == "LC_ALL", k == "TMPDIR", k == "VIRTUAL_ENV", k == "LD_LIBRARY_PATH",
			strings.HasPrefix(k, "PYTHON"), strings.HasPrefix(k, "CONDA_"):
			out = append(out, kv)
		}
	}
	return out
}

// torchrunPython is the interpreter that runs the torchrun kinds' launcher,
// or "" when it is not torch's own torchrun in a Python that can be asked:
// python-module's launcher.python with torch.distributed.run, or the
// interpreter on the first line of a torchrun console script.
func torchrunPython(l jobspec.Launcher, launcher, path string) string {
	switch l.Kind {
	case jobspec.KindPythonModule:
		if l.Module == jobspec.DefaultModule {
			return launcher
		}
	case jobspec.KindTorchrun:
		return shebangPython(launcher, path)
	}
	return ""
}

// maxShebang bounds what is read of a launcher's first line.
const maxShebang = 512

var pythonName = regexp.MustCompile(`^python[0-9.]*$`)

// shebangPython is the Python interpreter a script's "#!" line names
// (directly, or through env on the workers' PATH), or "".
func shebangPython(script, path string) string {
	f, err := os.Open(script)
	if err != nil {
		return ""
	}
	defer f.Close()
	line, _ := bufio.NewReaderSize(f, maxShebang).Peek(maxShebang)
	first, _, _ := strings.Cut(string(line), "\n")
	rest, ok := strings.CutPrefix(first, "#!")
	if !ok {
		return ""
	}
	fields := strings.Fields(rest)
	if len(fields) > 1 && filepath.Base(fields[0]) == "env" {
		fields = fields[1:]
		if !pythonName.MatchString(fields[0]) {
			return ""
		}
		p, err := lookPath(fields[0], path)
		if err != nil {
			return ""
		}
		return p
	}
	if len(fields) == 0 || !filepath.IsAbs(fields[0]) || !pythonName.MatchString(filepath.Base(fields[0])) {
		return ""
	}
	return fields[0]
}

// std are torchrun's --redirects and --tee; stdBroken is a value torch
// 1.x's Std.from_str reads as None on Python >= 3.11 (0 and 3, alone or
// for a local rank).
var (
	std       = map[string]bool{"redirects": true, "tee": true}
	stdBroken = regexp.MustCompile(`(^|:)[03](,|$)`)
)

// torchrunOptions checks the job's launcher.extra_args, and command up to
// the training script, against the node's own torchrun (r): an option rdzv
// sets is refused in every spelling that parser accepts (prefixes, '-' or
// '_', =value). It returns the options rdzv adds for that torchrun: on a
// torch whose Std is broken (r.StdBug), --redirects 2 and --tee 2 unless
// the job gives its own, which must then be values that torch can read.
func torchrunOptions(r *torchprobe.Result, node string, extra, command []string) ([]string, error) {
	args := append(extra[:len(extra):len(extra)], command...)
	given := map[string]bool{}
	for i := 0; i < len(args); i++ {
		opts := r.Resolve(args[i])
		if len(opts) == 0 {
			if i >= len(extra) {
				break // the training script: the rest is its own
			}
			continue
		}
		field := fmt.Sprintf("launcher.extra_args[%d]", i)
		if i >= len(extra) {
			field = fmt.Sprintf("command[%d]", i-len(extra))
		}
		for _, o := range opts {
			if info, ok := jobspec.LookupTorchrunOption(o.Dest); ok && info.SetBy != "" {
				return nil, &preflightError{failure: wire.FailureLauncherOption, err: &wire.FieldError{Field: field, Value: wire.Quote(args[i]),
					Reason: fmt.Sprintf("is read by torch %s's torchrun on node %s as --%s, which rdzv sets: %s", r.Torch, node, o.Dest, info.SetBy)}}
			}
		}
		if len(opts) > 1 {
			continue // ambiguous: torchrun refuses it itself
		}
		o := opts[0]
		value := ""
		if _, v, ok := strings.Cut(args[i], "="); ok {
			value = v
		} else if !strings.HasPrefix(args[i], "--") && len(args[i]) > 2 {
			value = args[i][2:]
		} else if !o.Flag && i+1 < len(args) {
			i++
			value = args[i]
		}
		if std[o.Dest] {
			given[o.Dest] = true
			if r.StdBug && stdBroken.MatchString(value) {
				return nil, &preflightError{failure: wire.FailureLauncherOption, err: &wire.FieldError{Field: field, Value: wire.Quote(value),
					Reason: fmt.Sprintf("torch %s's torchrun on Python %s (node %s) cannot start workers with --%s 0 or 3 for any rank (its Std.from_str reads them as None); use 1 or 2", r.Torch, r.PythonVersion(), node, o.Dest)}}
			}
		}
	}
	if !r.StdBug {
		return nil, nil
	}
	var add []string
	for _, o := range []string{"redirects", "tee"} {
		if !given[o] {
			add = append(add, "--"+o, "2")
		}
	}
	return add, nil
}
