package jobspec

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/rdzv/rdzv/wire"
	"github.com/rdzv/rdzv/wire/yamlcheck"
)

// Launcher kinds: the program each node's agent runs to start the workers.
const (
	KindTorchrun     = "torchrun"
	KindPythonModule = "python-module"
	KindAccelerate   = "accelerate"
	KindDeepSpeed    = "deepspeed"
	KindCustom       = "custom"
	// KindWarm keeps a standby Python process on each node with the job's
	// preload modules imported; an assignment forks the workers from it,
	// with torchrun's environment, instead of starting torchrun.
	KindWarm = "warm"
	// KindAuto, and a job that names no kind, is resolved when the job is
	// read (Default) to warm or torchrun by AutoKind.
	KindAuto = "auto"
)

// Defaults of the launcher fields, by kind.
const (
	DefaultPython     = "python3"
	DefaultModule     = "torch.distributed.run"
	DefaultAccelerate = "accelerate"
	DefaultDeepSpeed  = "deepspeed"
)

// Assigned is what rdzv decided for one node of one generation: what every
// launcher kind is given in its own spelling, and nothing a job may set.
type Assigned struct {
	Job          string
	Generation   uint64
	NNodes       int
	NodeRank     int
	ProcsPerNode int
	MasterAddr   string
	MasterPort   int
	// Hostfile is the deepspeed hostfile the agent wrote for the
	// assignment (DeepSpeedHostfile); deepspeed only.
	Hostfile string
	// TorchrunOptions are options the node's agent adds after rdzv's own
	// for what its torchrun needs to start workers at all (torch 1.x on
	// Python 3.11: --redirects and --tee); torchrun kinds only.
	TorchrunOptions []string
}

// WorldSize is the number of workers in the assignment.
func (a Assigned) WorldSize() int { return a.NNodes * a.ProcsPerNode }

// launcherKind is how one kind is run and what of its options rdzv owns.
type launcherKind struct {
	// program names the launcher in errors ("torchrun's --nnodes").
	program string
	// options are its parser's options; nil for custom, whose argv is the
	// job's own template.
	options []launcherOption
	// args are rdzv's options for an assignment, before extra_args.
	args func(Assigned) []string
}

// Every kind's reserved options are refused in every argparse spelling by
// validateLauncherArgs, as torchrun's are.
var launcherKinds = map[string]*launcherKind{
	KindTorchrun:     {program: "torchrun", options: torchrunOptions, args: torchrunArgs},
	KindPythonModule: {program: "torchrun", options: torchrunOptions, args: torchrunArgs},
	KindAccelerate:   {program: "accelerate launch", options: accelerateOptions, args: accelerateArgs},
	KindDeepSpeed:    {program: "deepspeed", options: deepspeedOptions, args: deepspeedArgs},
	KindCustom:       {program: "the custom launcher"},
	KindWarm:         {program: "the warm standby"},
}

// DefaultPreload is what a warm standby imports unless the job says
// otherwise: the imports every torchrun worker pays for at its start, and
// torch._dynamo, which torch 2.x imports lazily in DistributedDataParallel's
// constructor (and FSDP's, and torch.compile), seconds of every restarted
// worker's critical path (docs/gpu-check.md measures them). It is optional
// (OptionalModule): torch 1.x has none.
var DefaultPreload = []string{"torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo" + OptionalModule}

// OptionalModule ends a preload entry that a standby imports only if it is
// installed: one it cannot import is left to the workers, which then import
// it themselves (and fail as they would under torchrun).
const OptionalModule = "?"

// maxPreload bounds launcher.preload.
const maxPreload = 64

// KindNames lists the launcher kinds a job may name, for errors and help.
func KindNames() []string {
	names := make([]string, 0, len(launcherKinds)+1)
	for k := range launcherKinds {
		names = append(names, k)
	}
	names = append(names, KindAuto)
	slices.Sort(names)
	return names
}

func torchrunArgs(a Assigned) []string {
	return append([]string{
		"--nnodes", strconv.Itoa(a.NNodes),
		"--node_rank", strconv.Itoa(a.NodeRank),
		"--nproc_per_node", strconv.Itoa(a.ProcsPerNode),
		"--master_addr", a.MasterAddr,
		"--master_port", strconv.Itoa(a.MasterPort),
	}, a.TorchrunOptions...)
}

// accelerate launch counts processes over all machines, and runs them with
// torch's static rendezvous at the main process.
func accelerateArgs(a Assigned) []string {
	return []string{
		"--num_machines", strconv.Itoa(a.NNodes),
		"--machine_rank", strconv.Itoa(a.NodeRank),
		"--num_processes", strconv.Itoa(a.WorldSize()),
		"--main_process_ip", a.MasterAddr,
		"--main_process_port", strconv.Itoa(a.MasterPort),
		"--rdzv_backend", "static",
	}
}

// deepspeed's runner takes the world from a hostfile; with --no_ssh it
// starts only this node's workers (node_rank) instead of ssh-ing to all.
func deepspeedArgs(a Assigned) []string {
	return []string{
		"--no_ssh",
		"--hostfile", a.Hostfile,
		"--num_nodes", strconv.Itoa(a.NNodes),
		"--node_rank", strconv.Itoa(a.NodeRank),
		"--num_gpus", strconv.Itoa(a.ProcsPerNode),
		"--master_addr", a.MasterAddr,
		"--master_port", strconv.Itoa(a.MasterPort),
	}
}

// DeepSpeedHostfile is a hostfile that describes the assignment to
// deepspeed's runner: one line per node with procs_per_node slots. With
// --no_ssh the names are only keys (ranks follow the line order), so the
// job needs no hostfile of its own and no node needs to resolve another.
func DeepSpeedHostfile(a Assigned) []byte {
	var b strings.Builder
	for i := range a.NNodes {
		fmt.Fprintf(&b, "rdzv-node-%d slots=%d\n", i, a.ProcsPerNode)
	}
	return []byte(b.String())
}

// accelerateOptions are accelerate launch's options that rdzv sets, and the
// flags among those a job commonly gives (so that the check knows they take
// no value). Every other option is taken to take a value, which checks
// more arguments, not fewer.
var accelerateOptions = []launcherOption{
	{name: "help", short: 'h', flag: true},
	{name: "num_machines", setBy: "the number of nodes the controller admitted"},
	{name: "machine_rank", setBy: "this node's rank in the assignment"},
	{name: "num_processes", setBy: "procs_per_node times the number of nodes"},
	{name: "main_process_ip", setBy: "the address of the assignment's rank-0 node"},
	{name: "main_process_port", setBy: "the port the controller chose on the rank-0 node"},
	{name: "rdzv_backend", setBy: rdzvRendezvous},
	{name: "rdzv_conf", setBy: rdzvRendezvous},
	{name: "same_network", flag: true},
	{name: "gpu_ids", setBy: "the GPUs the agent gave the job on the node (CUDA_VISIBLE_DEVICES)"},
	{name: "cpu", flag: true},
	{name: "multi_gpu", flag: true},
	{name: "module", short: 'm', flag: true},
	{name: "no_python", flag: true},
	{name: "quiet", short: 'q', flag: true},
	{name: "debug", flag: true},
	{name: "use_deepspeed", flag: true},
	{name: "use_fsdp", flag: true},
	{name: "config_file"},
	{name: "mixed_precision"},
	{name: "tee", short: 't'},
	{name: "max_restarts"},
	{name: "monitor_interval"},
}

// deepspeedOptions are deepspeed's runner options that rdzv sets, and its
// flags. Short options are matched in lower case, so -H (hostfile) and -h
// (help) are both refused.
var deepspeedOptions = []launcherOption{
	{name: "hostfile", short: 'h', setBy: "rdzv writes the assignment's hostfile"},
	{name: "include", short: 'i', setBy: "the controller chooses the nodes"},
	{name: "exclude", short: 'e', setBy: "the controller chooses the nodes"},
	{name: "num_nodes", setBy: "the number of nodes the controller admitted"},
	{name: "node_rank", setBy: "this node's rank in the assignment"},
	{name: "num_gpus", setBy: "procs_per_node"},
	{name: "num_accelerators", setBy: "procs_per_node"},
	{name: "master_addr", setBy: "the address of the assignment's rank-0 node"},
	{name: "master_port", setBy: "the port the controller chose on the rank-0 node"},
	{name: "launcher", setBy: "the agent on each node is the launcher"},
	{name: "launcher_args", setBy: "the agent on each node is the launcher"},
	{name: "no_ssh", flag: true, setBy: "the agent on each node is the launcher"},
	{name: "no_ssh_check", flag: true, setBy: "the agent on each node is the launcher"},
	{name: "force_multi", flag: true, setBy: "the agent on each node is the launcher"},
	{name: "min_elastic_nodes", setBy: rdzvRendezvous},
	{name: "max_elastic_nodes", setBy: rdzvRendezvous},
	{name: "elastic_training", flag: true, setBy: rdzvRendezvous},
	{name: "module", flag: true},
	{name: "no_python", flag: true},
	{name: "no_local_rank", flag: true},
	{name: "enable_each_rank_log"},
	{name: "bind_cores_to_rank", flag: true},
	{name: "autotuning"},
}

// placeholders are what a custom launcher's argv may name, with what each
// is replaced by.
var placeholders = map[string]func(Assigned) string{
	"nnodes":         func(a Assigned) string { return strconv.Itoa(a.NNodes) },
	"node_rank":      func(a Assigned) string { return strconv.Itoa(a.NodeRank) },
	"nproc_per_node": func(a Assigned) string { return strconv.Itoa(a.ProcsPerNode) },
	"world_size":     func(a Assigned) string { return strconv.Itoa(a.WorldSize()) },
	"master_addr":    func(a Assigned) string { return a.MasterAddr },
	"master_port":    func(a Assigned) string { return strconv.Itoa(a.MasterPort) },
	"job":            func(a Assigned) string { return a.Job },
	"generation":     func(a Assigned) string { return strconv.FormatUint(a.Generation, 10) },
	// One id per generation, as torchrun's --rdzv_id would be.
	"rdzv_id": func(a Assigned) string { return fmt.Sprintf("%s-%d", a.Job, a.Generation) },
}

// placeholder matches {name}; other braces (JSON in an argument) are left
// as they are.
var placeholder = regexp.MustCompile(`\{([a-z_]+)\}`)

func placeholderNames() []string {
	names := make([]string, 0, len(placeholders))
	for n := range placeholders {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Launch is the program (looked up on the workers' PATH) and the arguments
// that start this node's workers: rdzv's assignment in the kind's own
// spelling, then launcher.extra_args, then command. For custom, the argv
// template with its placeholders filled in stands for both the program and
// rdzv's options.
func (s *Spec) Launch(a Assigned) (program string, args []string) {
	l := s.Launcher
	switch l.Kind {
	case KindCustom:
		argv := make([]string, len(l.Argv))
		for i, arg := range l.Argv {
			argv[i] = placeholder.ReplaceAllStringFunc(arg, func(m string) string {
				return placeholders[m[1:len(m)-1]](a)
			})
		}
		program, args = argv[0], argv[1:]
	case KindPythonModule:
		program, args = l.Python, append([]string{"-m", l.Module}, torchrunArgs(a)...)
	case KindAccelerate:
		program, args = l.Executable, append([]string{"launch"}, accelerateArgs(a)...)
	case KindDeepSpeed:
		program, args = l.Executable, deepspeedArgs(a)
	case KindWarm:
		// What each worker amounts to, for the record: the assignment
		// reaches it in its environment (see the agent's warm.go).
		return l.Python, append([]string{"-u"}, s.Command...)
	default:
		program, args = l.Torchrun, torchrunArgs(a)
	}
	args = append(args, l.ExtraArgs...)
	return program, append(args, s.Command...)
}

// Why AutoKind chose a kind: the first rule that applies, in this order.
const (
	autoExtraArgs = "launcher.extra_args are options of torchrun's, which launcher.kind warm does not run"
	autoPreflight = "health.preflight wraps torchrun in a shell, which launcher.kind warm does not run"
	autoCommand   = "command is not a Python script (*.py) or -m <module>, which launcher.kind warm runs"
	autoTorchrun  = "launcher.torchrun is set"
	autoWarm      = "command is a Python script or -m <module> and nothing launcher.kind warm refuses is set"
)

// AutoKind is the kind a job that names none (or auto) runs with, and why:
// warm, whose standbys spare a restart torchrun's start and each worker's
// import torch, wherever the job is one warm runs exactly as torchrun
// would; torchrun otherwise. It reads only fields Default fills in for
// neither answer (launcher.torchrun only after what decides for warm), so
// the answer for a spec once resolved is the same: Validate relies on it
// to check a launcher.kind_reason carried in the proto.
func AutoKind(s *Spec) (kind, reason string) {
	l := s.Launcher
	switch c := s.Command; {
	case len(l.ExtraArgs) > 0:
		return KindTorchrun, autoExtraArgs
	case s.Health.Preflight != nil:
		return KindTorchrun, autoPreflight
	case len(c) == 0, !pythonCommand(c):
		return KindTorchrun, autoCommand
	case l.Torchrun != "":
		return KindTorchrun, autoTorchrun
	}
	return KindWarm, autoWarm
}

// pythonCommand reports whether command is what both torchrun and a warm
// standby run as Python: a script named *.py, or -m and a module name.
func pythonCommand(c []string) bool {
	if c[0] == "-m" {
		return len(c) > 1 && pythonModule.MatchString(c[1]) && len(c[1]) <= maxModuleLen
	}
	return !strings.HasPrefix(c[0], "-") && strings.HasSuffix(c[0], ".py") && len(c[0]) > len(".py")
}

// defaultLauncher fills in the kind (resolving auto) and the fields it
// uses. A kind given explicitly keeps any KindReason it came with, which
// validateLauncher checks.
func (s *Spec) defaultLauncher() {
	l := &s.Launcher
	if l.Kind == "" || l.Kind == KindAuto {
		l.Kind, l.KindReason = AutoKind(s)
	}
	switch l.Kind {
	case KindTorchrun:
		if l.Torchrun == "" {
			l.Torchrun = DefaultTorchrun
		}
	case KindPythonModule:
		if l.Python == "" {
			l.Python = DefaultPython
		}
		if l.Module == "" {
			l.Module = DefaultModule
		}
	case KindWarm:
		if l.Python == "" {
			l.Python = DefaultPython
		}
		if l.Preload == nil {
			l.Preload = slices.Clone(DefaultPreload)
		}
	case KindAccelerate:
		if l.Executable == "" {
			l.Executable = DefaultAccelerate
		}
	case KindDeepSpeed:
		if l.Executable == "" {
			l.Executable = DefaultDeepSpeed
		}
	}
}

// validateLauncher checks launcher: a known kind, the fields it uses and no
// other, and extra_args and command against what rdzv sets for it.
func (s *Spec) validateLauncher() []*wire.FieldError {
	l := s.Launcher
	var errs []*wire.FieldError
	add := func(field, value, reason string) {
		errs = append(errs, &wire.FieldError{Field: field, Value: value, Reason: reason})
	}
	if l.KindReason != "" {
		if k, r := AutoKind(s); k != l.Kind || r != l.KindReason {
			add("launcher.kind_reason", wire.Quote(l.KindReason), "is rdzv's account of how it resolved launcher.kind auto, and does not match this job")
		}
	}
	k, ok := launcherKinds[l.Kind]
	if !ok {
		reason := "must be one of " + strings.Join(KindNames(), ", ")
		if s := yamlcheck.Suggest(l.Kind, KindNames()); s != "" {
			reason += "; did you mean " + s + "?"
		}
		add("launcher.kind", wire.Quote(l.Kind), reason)
		return errs
	}
	// Each field belongs to the kinds that use it; given to another it
	// would be silently ignored.
	for _, u := range []struct {
		field string
		set   bool
		kinds []string
		value string
	}{
		{"launcher.torchrun", l.Torchrun != "", []string{KindTorchrun}, l.Torchrun},
		{"launcher.python", l.Python != "", []string{KindPythonModule, KindWarm}, l.Python},
		{"launcher.module", l.Module != "", []string{KindPythonModule}, l.Module},
		{"launcher.executable", l.Executable != "", []string{KindAccelerate, KindDeepSpeed}, l.Executable},
		{"launcher.argv", len(l.Argv) > 0, []string{KindCustom}, ""},
		{"launcher.preload", len(l.Preload) > 0, []string{KindWarm}, ""},
	} {
		switch in := slices.Contains(u.kinds, l.Kind); {
		case u.set && !in:
			add(u.field, "", fmt.Sprintf("applies only to launcher.kind %s, not %s", strings.Join(u.kinds, " or "), l.Kind))
		case in && u.field != "launcher.argv" && u.field != "launcher.preload" && (strings.TrimSpace(u.value) == "" || len(u.value) > maxPathLen):
			add(u.field, wire.Quote(u.value), "must name the "+strings.TrimPrefix(u.field, "launcher.")+" to run")
		}
	}
	if l.Kind == KindPythonModule && l.Module != "" && (!pythonModule.MatchString(l.Module) || len(l.Module) > maxModuleLen) {
		add("launcher.module", wire.Quote(l.Module), fmt.Sprintf("must be a dotted Python module name like torch.distributed.run, at most %d characters", maxModuleLen))
	}
	if len(l.ExtraArgs) > maxArgs {
		add("launcher.extra_args", fmt.Sprint(len(l.ExtraArgs)), fmt.Sprintf("at most %d arguments are allowed", maxArgs))
	}
	errs = append(errs, validateArgs("launcher.extra_args", l.ExtraArgs)...)
	switch l.Kind {
	case KindCustom:
		return append(errs, validateArgv(l.Argv)...)
	case KindWarm:
		return append(errs, s.validateWarm()...)
	}
	return append(errs, validateLauncherArgs(k, l.ExtraArgs, s.Command)...)
}

// validateWarm checks what a warm standby is given: modules to import, and
// a command that is what torchrun would take as its training script and
// arguments. There is no launcher to give options to, and no shell to wrap
// the standby in for the round smoke test.
func (s *Spec) validateWarm() []*wire.FieldError {
	l := s.Launcher
	var errs []*wire.FieldError
	if len(l.ExtraArgs) > 0 {
		errs = append(errs, &wire.FieldError{Field: "launcher.extra_args", Value: wire.Quote(l.ExtraArgs[0]),
			Reason: "does not apply to launcher.kind warm: there is no launcher to take options; the workers get torchrun's environment"})
	}
	if len(l.Preload) > maxPreload {
		errs = append(errs, &wire.FieldError{Field: "launcher.preload", Value: fmt.Sprint(len(l.Preload)), Reason: fmt.Sprintf("at most %d modules are allowed", maxPreload)})
	}
	for i, m := range l.Preload {
		name := strings.TrimSuffix(m, OptionalModule)
		if !pythonModule.MatchString(name) || len(name) > maxModuleLen {
			errs = append(errs, &wire.FieldError{Field: fmt.Sprintf("launcher.preload[%d]", i), Value: wire.Quote(m),
				Reason: fmt.Sprintf("must be a dotted Python module name like torch.distributed, optionally ending in %q (import it only if installed), at most %d characters", OptionalModule, maxModuleLen)})
		}
	}
	if s.Health.Preflight != nil {
		errs = append(errs, &wire.FieldError{Field: "health.preflight", Value: "set",
			Reason: "is not supported with launcher.kind warm; use launcher.kind torchrun for the round smoke test"})
	}
	switch c := s.Command; {
	case len(c) == 0:
	case c[0] == "-m":
		if len(c) < 2 || !pythonModule.MatchString(c[1]) || len(c[1]) > maxModuleLen {
			v := ""
			if len(c) > 1 {
				v = c[1]
			}
			errs = append(errs, &wire.FieldError{Field: "command[1]", Value: wire.Quote(v), Reason: "must be the module that -m runs, a dotted Python module name"})
		}
	case strings.HasPrefix(c[0], "-"):
		errs = append(errs, &wire.FieldError{Field: "command[0]", Value: wire.Quote(c[0]),
			Reason: "must be the training script or -m <module>: launcher.kind warm takes no launcher options, rdzv assigns what torchrun's would set"})
	}
	return errs
}

// maxModuleLen bounds launcher.module, which job summaries keep.
const maxModuleLen = 255

var pythonModule = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)

// validateArgv checks a custom launcher's template: a program to run, and
// only placeholders rdzv fills in.
func validateArgv(argv []string) []*wire.FieldError {
	var errs []*wire.FieldError
	switch {
	case len(argv) == 0:
		return []*wire.FieldError{{Field: "launcher.argv", Reason: "is required for launcher.kind custom: the launcher and its arguments, with placeholders " + braced(placeholderNames())}}
	case len(argv) > maxArgs:
		errs = append(errs, &wire.FieldError{Field: "launcher.argv", Value: fmt.Sprint(len(argv)), Reason: fmt.Sprintf("at most %d arguments are allowed", maxArgs)})
	case strings.TrimSpace(argv[0]) == "" || placeholder.MatchString(argv[0]):
		errs = append(errs, &wire.FieldError{Field: "launcher.argv[0]", Value: wire.Quote(argv[0]), Reason: "must name the launcher executable"})
	}
	errs = append(errs, validateArgs("launcher.argv", argv)...)
	for i, arg := range argv {
		for _, m := range placeholder.FindAllStringSubmatch(arg, -1) {
			if _, ok := placeholders[m[1]]; ok {
				continue
			}
			reason := "unknown placeholder {" + m[1] + "}; known: " + braced(placeholderNames())
			if s := yamlcheck.Suggest(m[1], placeholderNames()); s != "" {
				reason = "unknown placeholder {" + m[1] + "}; did you mean {" + s + "}?"
			}
			errs = append(errs, &wire.FieldError{Field: fmt.Sprintf("launcher.argv[%d]", i), Value: wire.Quote(arg), Reason: reason})
		}
	}
	return errs
}

func braced(names []string) string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = "{" + n + "}"
	}
	return strings.Join(out, " ")
}
