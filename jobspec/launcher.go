package jobspec

import (
	"fmt"
	"strings"

	"github.com/rdzv/rdzv/wire"
)

// The agent runs `torchrun <rdzv's options> <launcher.extra_args>
// <command>`, and gives the workers <env> on top of rdzv's own variables.
// Nothing a job submits may change what rdzv assigned: the node count,
// ranks, rendezvous, interfaces and devices. This file is the one rule for
// that, written against how torchrun itself reads its options: Python's
// argparse (abbreviated long options, --opt=value, short options with
// attached values), each option also from the environment as
// PET_<OPTION>, and the variables torchrun sets for its workers.

// launcherOption is one of torchrun's options, named by its dest: the long
// name with '_', which torch 1.13 accepts as is and torch 2.x also spelled
// with '-'.
type launcherOption struct {
	name string
	// short is the single-dash letter, if any.
	short byte
	// flag options take no value.
	flag bool
	// since2 options are not in torch 1.13.
	since2 bool
	// setBy says what rdzv sets instead; empty when a job may give it.
	setBy string
}

// rdzvRendezvous is why torchrun's own rendezvous options are rdzv's.
const rdzvRendezvous = "rdzv runs the rendezvous itself (torchrun's static backend, with the controller's assignment)"

// torchrunOptions are every option of torchrun's parser
// (torch.distributed.run.get_args_parser), from torch 1.13.1 (Debian's
// python3-torch, /usr/lib/python3/dist-packages/torch/distributed/run.py)
// and torch 2.x up to 2.15 (since2), the ones each accepts in both '-' and
// '_' spellings. agent/torchprobe's tests check it against every torch they
// can run, and each node's agent checks a job's options against its own
// torchrun's parser at launch. The reserved ones
// are refused in every spelling whether or not the list is complete; the
// list only tells which other options take a value, and lets a job give an
// option whose exact name is a prefix of a reserved one.
var torchrunOptions = []launcherOption{
	{name: "help", short: 'h', flag: true},
	{name: "nnodes", setBy: "the number of nodes the controller admitted, within nodes.min and nodes.max"},
	{name: "nproc_per_node", setBy: "procs_per_node"},
	{name: "rdzv_backend", setBy: rdzvRendezvous},
	{name: "rdzv_endpoint", setBy: rdzvRendezvous},
	{name: "rdzv_id", setBy: rdzvRendezvous},
	{name: "rdzv_conf", setBy: rdzvRendezvous},
	{name: "standalone", flag: true, setBy: rdzvRendezvous},
	{name: "max_restarts"},
	{name: "monitor_interval"},
	{name: "start_method"},
	{name: "event_log_handler", since2: true},
	{name: "role"},
	{name: "module", short: 'm', flag: true},
	{name: "no_python", flag: true},
	{name: "run_path", flag: true},
	{name: "log_dir"},
	{name: "redirects", short: 'r'},
	{name: "tee", short: 't'},
	{name: "log_line_prefix_template", since2: true},
	{name: "local_ranks_filter", since2: true},
	{name: "duplicate_stdout_filters", since2: true},
	{name: "duplicate_stderr_filters", since2: true},
	{name: "node_rank", setBy: "this node's rank in the assignment"},
	{name: "master_addr", setBy: "the address of the assignment's rank-0 node"},
	{name: "master_port", setBy: "the port the controller chose on the rank-0 node"},
	{name: "local_addr", since2: true},
	{name: "logs_specs", since2: true},
	{name: "numa_binding", since2: true},
	{name: "signals_to_handle", since2: true},
	{name: "shutdown_timeout", since2: true},
	{name: "virtual_local_rank", flag: true, since2: true},
	{name: "print_completion", since2: true},
}

// TorchrunOption is what rdzv knows of one of torchrun's options.
type TorchrunOption struct {
	// Flag options take no value.
	Flag bool
	// Since2 options are not in torch 1.13.
	Since2 bool
	// SetBy says what rdzv sets instead; empty when a job may give it.
	SetBy string
}

// LookupTorchrunOption is rdzv's entry for the torchrun option whose dest
// is dest, for the agent, which checks a node's own torchrun against it,
// and for the tests that keep the table complete against real torch.
func LookupTorchrunOption(dest string) (TorchrunOption, bool) {
	for _, o := range torchrunOptions {
		if o.name == dest {
			return TorchrunOption{Flag: o.flag, Since2: o.since2, SetBy: o.setBy}, true
		}
	}
	return TorchrunOption{}, false
}

// workerEnv are the variables rdzv sets for each worker, directly or
// through torchrun, with what they hold. Besides these, RDZV_* are rdzv's,
// TORCHELASTIC_* torchrun's and PET_* torchrun's options.
var workerEnv = map[string]string{
	"NCCL_SOCKET_IFNAME":   "the node's NCCL interface (the agent's nccl_interface)",
	"GLOO_SOCKET_IFNAME":   "the node's NCCL interface (the agent's nccl_interface)",
	"CUDA_VISIBLE_DEVICES": "the GPUs the agent gave the job on the node (gpus_per_node)",
	"MASTER_ADDR":          "the address of the assignment's rank-0 node",
	"MASTER_PORT":          "the port the controller chose on the rank-0 node",
	"WORLD_SIZE":           "the number of workers in the assignment",
	"RANK":                 "each worker's rank in the assignment",
	"LOCAL_RANK":           "each worker's rank on its node",
	"LOCAL_WORLD_SIZE":     "procs_per_node",
	"GROUP_RANK":           "this node's rank in the assignment",
	"GROUP_WORLD_SIZE":     "the number of nodes in the assignment",
	"ROLE_RANK":            "each worker's rank in the assignment",
	"ROLE_WORLD_SIZE":      "the number of workers in the assignment",
	"ROLE_NAME":            "launcher.extra_args --role, or \"default\"",
	// Not torchrun's, but what launchers and frameworks (Lightning) take
	// for the node's rank, which would contradict RDZV_NODE_RANK.
	"NODE_RANK": "this node's rank in the assignment (RDZV_NODE_RANK)",
}

// reservedEnvReason says why a job may not set the variable name, or ""
// when it may.
func reservedEnvReason(name string) string {
	if what, ok := workerEnv[name]; ok {
		return "is set for each worker by rdzv and torchrun: " + what
	}
	switch {
	case strings.HasPrefix(name, "RDZV_"):
		return "is set by the rdzv agent from the assignment"
	case strings.HasPrefix(name, "TORCHELASTIC_"):
		return "is torchrun's own, set by torchrun for each worker"
	case strings.HasPrefix(name, "PET_"):
		dest := strings.ToLower(strings.TrimPrefix(name, "PET_"))
		for _, o := range torchrunOptions {
			if o.name == dest && o.setBy != "" {
				return fmt.Sprintf("is read by torchrun as its --%s, which rdzv sets: %s", o.name, o.setBy)
			}
		}
		if dest == "" {
			return "is in torchrun's namespace: torchrun reads PET_<OPTION> as its options"
		}
		return fmt.Sprintf("is read by torchrun as its --%s option; give that in launcher.extra_args instead", dest)
	}
	return ""
}

// validateLauncherArgs checks launcher.extra_args and command as torchrun
// reads them after rdzv's own options: as options up to the first
// positional argument, the training script, which may be in either list
// (command: [-m, pkg.train]). No argument there may spell a reserved
// option, nor may any in extra_args, which are all meant for torchrun.
func validateLauncherArgs(k *launcherKind, extra, command []string) []*wire.FieldError {
	args := append(extra[:len(extra):len(extra)], command...)
	// end is where torchrun's options end: the training script, or "--".
	// Where it cannot tell whether an option takes a value, it assumes one,
	// which checks more arguments, not fewer.
	end := len(args)
	for i := 0; i < len(args); i++ {
		if _, _, ok := optionName(args[i]); !ok {
			end = i
			break
		}
		if takesNextArg(k, args[i]) {
			i++ // the value: were it an option, torchrun would refuse it
		}
	}
	var errs []*wire.FieldError
	for i, a := range args[:max(end, len(extra))] {
		reason := reservedArgReason(k, a)
		if reason == "" {
			continue
		}
		field := fmt.Sprintf("launcher.extra_args[%d]", i)
		if i >= len(extra) {
			field = fmt.Sprintf("command[%d]", i-len(extra))
			reason += fmt.Sprintf(" (%[1]s reads command up to the training script as its own options; put %[1]s's in launcher.extra_args)", k.program)
		}
		errs = append(errs, &wire.FieldError{Field: field, Value: wire.Quote(a), Reason: reason})
	}
	return errs
}

// optionName is what argparse would match an argument against: the name
// after the leading dashes and before any '=', with '-' read as '_' (torch
// 2.x accepts both) and in lower case (no torchrun option differs by case
// alone). ok is false when the argument is no option: it does not start
// with '-', or is "-" or "--" (argparse's end of options). A negative
// number counts as an option here, though argparse takes it for a
// positional argument: that only checks more.
func optionName(arg string) (name string, dashes int, ok bool) {
	if len(arg) < 2 || arg[0] != '-' || arg == "--" {
		return "", 0, false
	}
	rest := strings.TrimLeft(arg, "-")
	name, _, _ = strings.Cut(rest, "=")
	if name == "" {
		return "", 0, false
	}
	return strings.ToLower(strings.ReplaceAll(name, "-", "_")), len(arg) - len(rest), true
}

// reservedArgReason says why a job may not give arg to torchrun, or "".
// argparse takes an unambiguous prefix of a long option for the option, so
// any prefix of a reserved name is refused: an ambiguous one only makes
// torchrun fail. A single dash reaches no long option in argparse, but is
// held to the same rule for safety, except for torchrun's short options
// themselves (-m, -r3), none of which is reserved.
func reservedArgReason(k *launcherKind, arg string) string {
	name, dashes, ok := optionName(arg)
	if !ok {
		return ""
	}
	var hits []launcherOption
	for _, o := range k.options {
		// A reserved short option also with its value attached (-Hfile).
		if o.name == name || (dashes == 1 && o.short != 0 && o.short == name[0] && (len(name) == 1 || o.setBy != "")) {
			if o.setBy == "" {
				return ""
			}
			hits = []launcherOption{o}
			break
		}
		if o.setBy != "" && strings.HasPrefix(o.name, name) {
			hits = append(hits, o)
		}
	}
	switch len(hits) {
	case 0:
		return ""
	case 1:
		return fmt.Sprintf("spells %s's --%s, which rdzv sets: %s", k.program, hits[0].name, hits[0].setBy)
	}
	names := make([]string, len(hits))
	for i, o := range hits {
		names[i] = "--" + o.name
	}
	return fmt.Sprintf("could be read by %s as %s, which rdzv sets", k.program, strings.Join(names, " or "))
}

// takesNextArg says whether torchrun may take the argument after arg as
// arg's value: arg is an option without '=' that is not known to be a flag.
// Single-dash arguments are read as argparse reads them: a short option,
// then its attached value or more short flags.
func takesNextArg(k *launcherKind, arg string) bool {
	name, dashes, ok := optionName(arg)
	if !ok || strings.Contains(arg, "=") {
		return false
	}
	if dashes == 1 {
		for i := 0; i < len(name); i++ {
			o, known := k.shortOption(name[i])
			if !known {
				return true
			}
			if !o.flag {
				return i == len(name)-1
			}
		}
		return false
	}
	for _, o := range k.options {
		if o.name == name {
			return !o.flag
		}
	}
	var match *launcherOption
	for i, o := range k.options {
		if strings.HasPrefix(o.name, name) {
			if match != nil {
				return true // ambiguous: the launcher refuses it anyway
			}
			match = &k.options[i]
		}
	}
	// An option torchrun does not know may be a newer torch's, taking a
	// value.
	return match == nil || !match.flag
}

func (k *launcherKind) shortOption(c byte) (launcherOption, bool) {
	for _, o := range k.options {
		if o.short != 0 && o.short == c {
			return o, true
		}
	}
	return launcherOption{}, false
}
