package jobspec

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"sigs.k8s.io/yaml"

	"github.com/rdzv/rdzv/wire"
)

// A new user writes the line they ran by hand (`torchrun
// --nproc_per_node=4 train.py`, `deepspeed train.py`, `python train.py`)
// as command, and rdzv puts its own launcher in front of it: the job
// validates and then crash-loops. FromLaunchLine reads such a line as what
// the user meant, for validation's error (which shows the fields to write
// instead) and for `rdzvctl init --from`.

// Translation is a launch line as job.yaml fields.
type Translation struct {
	// Program is what the line ran ("torchrun", "python -m
	// torch.distributed.run", "deepspeed", "accelerate launch", "python").
	Program string
	// Nodes is the node count or range the line gave; zero when none.
	Nodes NodeRange
	// ProcsPerNode is the workers per node the line gave; 0 when none.
	ProcsPerNode int
	Launcher     Launcher
	Command      []string
	// Env are the line's leading NAME=value assignments.
	Env map[string]string
	// Dropped are the line's options rdzv assigns itself, with why.
	Dropped []Dropped
}

// Dropped is an option of the line that has no place in job.yaml.
type Dropped struct {
	Arg, Why string
}

var (
	pythonExe = regexp.MustCompile(`^python[0-9.]*$`)
	// pythonFlags are the interpreter's options that take a value.
	pythonFlags = map[string]bool{"-W": true, "-X": true, "-c": true}
)

// FromLaunchLine reads argv as a launcher's command line. ok is false when
// argv[0] is no launcher or Python interpreter rdzv knows: a training
// script, or a program of the job's own.
func FromLaunchLine(argv []string) (t *Translation, ok bool) {
	if len(argv) == 0 {
		return nil, false
	}
	exe := filepath.Base(argv[0])
	switch {
	case exe == "torchrun":
		return fromLauncher("torchrun", launcherKinds[KindTorchrun], Launcher{Kind: KindTorchrun}, argv[1:]), true
	case exe == "deepspeed":
		return fromLauncher("deepspeed", launcherKinds[KindDeepSpeed], Launcher{Kind: KindDeepSpeed}, argv[1:]), true
	case exe == "accelerate" && len(argv) > 1 && argv[1] == "launch":
		return fromLauncher("accelerate launch", launcherKinds[KindAccelerate], Launcher{Kind: KindAccelerate}, argv[2:]), true
	case exe == "accelerate":
		return &Translation{Program: "accelerate", Launcher: Launcher{Kind: KindAccelerate}}, true
	case !pythonExe.MatchString(exe):
		return nil, false
	}
	// python [interpreter options] (script | -m module) args...
	py := Launcher{Kind: KindPythonModule, Python: argv[0]}
	// A named interpreter's torch is the one meant: torchrun from it.
	t = &Translation{Program: exe, Launcher: Launcher{Kind: KindTorchrun}}
	if strings.Contains(argv[0], "/") {
		t.Launcher = Launcher{Kind: KindPythonModule, Python: argv[0], Module: DefaultModule}
	}
	rest := argv[1:]
	for len(rest) > 0 && strings.HasPrefix(rest[0], "-") && rest[0] != "-m" {
		n := 1
		if pythonFlags[rest[0]] && len(rest) > 1 {
			n = 2
		}
		if rest[0] != "-u" { // the workers run unbuffered anyway
			t.Dropped = append(t.Dropped, Dropped{Arg: strings.Join(rest[:n], " "), Why: "an option of the interpreter, which rdzv's launcher starts"})
		}
		rest = rest[n:]
	}
	if len(rest) >= 2 && rest[0] == "-m" {
		switch rest[1] {
		case "torch.distributed.run", "torch.distributed.launch":
			py.Module = rest[1]
			tr := fromLauncher(exe+" -m "+rest[1], launcherKinds[KindPythonModule], py, rest[2:])
			tr.Dropped = append(t.Dropped, tr.Dropped...)
			return tr, true
		case "deepspeed.launcher.runner":
			return fromLauncher(exe+" -m "+rest[1], launcherKinds[KindDeepSpeed], Launcher{Kind: KindDeepSpeed}, rest[2:]), true
		case "accelerate.commands.launch":
			return fromLauncher(exe+" -m "+rest[1], launcherKinds[KindAccelerate], Launcher{Kind: KindAccelerate}, rest[2:]), true
		}
	}
	t.Command = append([]string(nil), rest...)
	return t, true
}

// fromLauncher reads a launcher's options up to the training script as
// k's parser would: options rdzv sets become job.yaml fields or are
// dropped, the rest go to launcher.extra_args.
func fromLauncher(program string, k *launcherKind, l Launcher, args []string) *Translation {
	t := &Translation{Program: program, Launcher: l}
	total := 0 // accelerate's --num_processes, over all nodes
	module := false
	i := 0
	for ; i < len(args); i++ {
		start, a := i, args[i]
		if a == "--" {
			i++
			break
		}
		name, dashes, isOpt := optionName(a)
		if !isOpt {
			break
		}
		o, known := k.lookup(name)
		if dashes == 1 {
			o, known = k.shortOption(name[0])
		}
		value := ""
		if _, v, ok := strings.Cut(a, "="); ok {
			value = v
		} else if takesNextArg(k, a) && i+1 < len(args) {
			i++
			value = args[i]
		}
		spelled := strings.Join(args[start:i+1], " ")
		if known && o.name == "module" && k.program == "torchrun" {
			module = true // with the script: command: [-m, pkg.train]
			continue
		}
		if !known || o.setBy == "" {
			t.Launcher.ExtraArgs = append(t.Launcher.ExtraArgs, args[start:i+1]...)
			continue
		}
		switch o.name {
		case "nnodes", "num_nodes", "num_machines":
			if lo, hi, ok := nodeRange(value); ok {
				t.Nodes = NodeRange{Min: lo, Max: hi}
				continue
			}
		case "nproc_per_node", "num_gpus", "num_accelerators":
			if n, err := strconv.Atoi(value); err == nil && n > 0 {
				t.ProcsPerNode = n
				continue
			}
		case "num_processes":
			if n, err := strconv.Atoi(value); err == nil && n > 0 {
				total = n
				continue
			}
		}
		t.Dropped = append(t.Dropped, Dropped{Arg: spelled, Why: o.setBy})
	}
	if total > 0 {
		nodes := max(t.Nodes.Min, 1)
		if total%nodes == 0 {
			t.ProcsPerNode = total / nodes
		} else {
			t.Dropped = append(t.Dropped, Dropped{Arg: "--num_processes " + strconv.Itoa(total), Why: "not a multiple of the node count; rdzv runs procs_per_node on each node"})
		}
	}
	if module {
		t.Command = append(t.Command, "-m")
	}
	t.Command = append(t.Command, args[i:]...)
	return t
}

// lookup is k's option named name, or the one name is an unambiguous
// prefix of.
func (k *launcherKind) lookup(name string) (launcherOption, bool) {
	var match *launcherOption
	for i, o := range k.options {
		if o.name == name {
			return o, true
		}
		if strings.HasPrefix(o.name, name) {
			if match != nil {
				return launcherOption{}, false
			}
			match = &k.options[i]
		}
	}
	if match == nil {
		return launcherOption{}, false
	}
	return *match, true
}

// nodeRange reads torchrun's --nnodes: "N" or "MIN:MAX".
func nodeRange(v string) (lo, hi int, ok bool) {
	a, b, isRange := strings.Cut(v, ":")
	lo, err := strconv.Atoi(a)
	if err != nil || lo < 1 {
		return 0, 0, false
	}
	hi = lo
	if isRange {
		if hi, err = strconv.Atoi(b); err != nil || hi < lo {
			return 0, 0, false
		}
	}
	return lo, hi, true
}

// Fields is the translation as job.yaml's fields in YAML flow style, on
// one line: what validation's error shows.
func (t *Translation) Fields() string {
	var parts []string
	switch {
	case t.Nodes.Min > 0 && t.Nodes.Max > t.Nodes.Min:
		parts = append(parts, fmt.Sprintf("nodes: {min: %d, max: %d}", t.Nodes.Min, t.Nodes.Max))
	case t.Nodes.Min > 0:
		parts = append(parts, fmt.Sprintf("nodes: %d", t.Nodes.Min))
	}
	if t.ProcsPerNode > 0 {
		parts = append(parts, fmt.Sprintf("procs_per_node: %d", t.ProcsPerNode))
	}
	if l := t.launcherFields(); len(l) > 0 {
		parts = append(parts, "launcher: {"+strings.Join(l, ", ")+"}")
	}
	if len(t.Command) > 0 {
		parts = append(parts, "command: "+flowList(t.Command))
	}
	return strings.Join(parts, ", ")
}

// launcherFields are launcher's fields other than the default's.
func (t *Translation) launcherFields() []string {
	l := t.Launcher
	var out []string
	if l.Kind != KindTorchrun {
		out = append(out, "kind: "+l.Kind)
	}
	if l.Python != "" && l.Python != DefaultPython {
		out = append(out, "python: "+flowScalar(l.Python))
	}
	if l.Module != "" && l.Module != DefaultModule {
		out = append(out, "module: "+l.Module)
	}
	if len(l.ExtraArgs) > 0 {
		out = append(out, "extra_args: "+flowList(l.ExtraArgs))
	}
	return out
}

// flowList is a YAML flow sequence; each item a JSON string where it would
// not read back as the same string.
func flowList(items []string) string {
	out := make([]string, len(items))
	for i, s := range items {
		out[i] = flowScalar(s)
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// plainScalar is what flowScalar may leave unquoted: no YAML indicator,
// nothing a flow list splits at.
var plainScalar = regexp.MustCompile(`^(-{0,2}[A-Za-z_/]|\.{1,2}/)[A-Za-z0-9_./=-]*$`)

// flowScalar is s as an item of a YAML flow list that job.yaml's parser
// reads back as the string s: plain when it does, else quoted.
func flowScalar(s string) string {
	if plainScalar.MatchString(s) && readsBack(s) {
		return s
	}
	b, _ := json.Marshal(s) // a string always encodes
	return string(b)
}

// readsBack reports whether s, unquoted in a flow list, is read by
// job.yaml's own parser as the string s. YAML 1.1 takes words such as y,
// off and null for other types, and numbers with their underscores
// dropped: -_000 is 0.
func readsBack(s string) bool {
	var v []any
	if err := yaml.Unmarshal([]byte("["+s+"]"), &v); err != nil || len(v) != 1 {
		return false
	}
	got, ok := v[0].(string)
	return ok && got == s
}

// YAML is a commented job.yaml for the translation, named name. line is
// the line it came from, quoted in its first comment.
func (t *Translation) YAML(name, line string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by `rdzvctl init --from` from:\n#   %s\n", oneLine(line))
	b.WriteString("# rdzv runs the launcher on every node itself, with what it assigns (nodes,\n# ranks, rendezvous, devices): command is only the training script.\n")
	fmt.Fprintf(&b, "name: %s\n", name)
	switch {
	case t.Nodes.Min > 0 && t.Nodes.Max > t.Nodes.Min:
		fmt.Fprintf(&b, "# Elastic: starts with min nodes, grows to max as nodes are free.\nnodes: {min: %d, max: %d}\n", t.Nodes.Min, t.Nodes.Max)
	case t.Nodes.Min > 0:
		fmt.Fprintf(&b, "nodes: %d\n", t.Nodes.Min)
	default:
		b.WriteString("# The line gave no node count: one node, or {min: N, max: M} for elastic.\nnodes: 1\n")
	}
	procs := t.ProcsPerNode
	if procs == 0 {
		procs = 1
		b.WriteString("# The line gave no per-node worker count.\n")
	}
	fmt.Fprintf(&b, "# Workers per node; each gets its LOCAL_RANK.\nprocs_per_node: %d\n", procs)
	fmt.Fprintf(&b, "# GPUs each node gives the job (CUDA_VISIBLE_DEVICES); 0 for a CPU-only job.\ngpus_per_node: %d\n", procs)
	if l := t.launcherFields(); len(l) > 0 {
		b.WriteString("launcher:\n")
		for _, f := range l {
			fmt.Fprintf(&b, "  %s\n", f)
		}
	}
	if len(t.Env) > 0 {
		b.WriteString("env:\n")
		for _, k := range wire.SortedKeys(t.Env) {
			fmt.Fprintf(&b, "  %s: %s\n", k, flowScalar(t.Env[k]))
		}
	}
	if len(t.Command) == 0 {
		b.WriteString("# The line named no training script: put it here.\ncommand: [train.py]\n")
	} else {
		fmt.Fprintf(&b, "command: %s\n", flowList(t.Command))
	}
	if len(t.Dropped) > 0 {
		b.WriteString("# Left out of the line, as rdzv assigns them:\n")
		for _, d := range t.Dropped {
			fmt.Fprintf(&b, "#   %s: %s\n", oneLine(d.Arg), oneLine(d.Why))
		}
	}
	return b.String()
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// NameFor is a job name for a translated line: its training script's or
// module's name as a DNS-1123 label, or "train".
func (t *Translation) NameFor() string {
	base := "train"
	for i, a := range t.Command {
		if a == "-m" && i+1 < len(t.Command) {
			base = t.Command[i+1]
			base = base[strings.LastIndex(base, ".")+1:]
			break
		}
		if !strings.HasPrefix(a, "-") {
			base = strings.TrimSuffix(filepath.Base(a), filepath.Ext(a))
			break
		}
	}
	name := strings.Trim(nonLabel.ReplaceAllString(strings.ToLower(base), "-"), "-")
	if len(name) > 63 {
		name = strings.Trim(name[:63], "-")
	}
	if wire.ValidateName("name", name) != nil {
		return "train"
	}
	return name
}

var nonLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// validateCommandLauncher refuses a command that starts with a launcher or
// a Python interpreter: rdzv's launcher is already in front of it. The
// error shows the fields that do what the line meant.
func (s *Spec) validateCommandLauncher() *wire.FieldError {
	if s.Launcher.Kind == KindCustom || len(s.Command) == 0 {
		return nil
	}
	t, ok := FromLaunchLine(s.Command)
	if !ok {
		return nil
	}
	what := "a launcher"
	if t.Program == filepath.Base(s.Command[0]) && pythonExe.MatchString(t.Program) {
		what = "a Python interpreter"
	}
	reason := fmt.Sprintf("starts with %s (%s), but rdzv already runs %s in front of command, which is only the training script and its arguments", what, t.Program, launcherKinds[s.Launcher.Kind].program)
	if f := t.Fields(); f != "" {
		reason += "; write instead: " + f
	}
	reason += fmt.Sprintf(" (rdzvctl init --from '%s' writes a whole job.yaml)", strings.Join(s.Command, " "))
	return &wire.FieldError{Field: "command", Value: wire.Quote(s.Command[0]), Reason: reason}
}

// ErrNotALaunchLine is a line FromShellLine cannot read as a launcher's.
var ErrNotALaunchLine = errors.New("not a launch line")

// maxLineBytes bounds a launch line.
const maxLineBytes = 64 << 10

// FromShellLine reads a launch line as a shell would split it (SplitLine),
// with any leading NAME=value assignments as the job's env (those rdzv
// sets itself are dropped).
func FromShellLine(line string) (*Translation, error) {
	argv, err := SplitLine(line)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	var dropped []Dropped
	for len(argv) > 0 {
		k, v, ok := strings.Cut(argv[0], "=")
		if !ok || !envName.MatchString(k) {
			break
		}
		if why := reservedEnvReason(k); why != "" {
			dropped = append(dropped, Dropped{Arg: argv[0], Why: k + " " + why})
		} else {
			env[k] = v
		}
		argv = argv[1:]
	}
	t, ok := FromLaunchLine(argv)
	if !ok {
		first := ""
		if len(argv) > 0 {
			first = argv[0]
		}
		return nil, fmt.Errorf("%w: it starts with %q, not torchrun, python -m torch.distributed.run, deepspeed, accelerate launch or python", ErrNotALaunchLine, first)
	}
	if len(env) > 0 {
		t.Env = env
	}
	t.Dropped = append(dropped, t.Dropped...)
	return t, nil
}

// SplitLine splits a command line as a POSIX shell does, without
// expanding anything: words separated by blanks, '...' literal, "..."
// with \" \\ \$ \` escaped, a backslash outside quotes escaping the next
// character, and a backslash-newline joining lines (a pasted multi-line
// command).
func SplitLine(line string) ([]string, error) {
	if len(line) > maxLineBytes {
		return nil, fmt.Errorf("%w: the line is %d bytes, more than %d", ErrNotALaunchLine, len(line), maxLineBytes)
	}
	if !utf8.ValidString(line) || strings.IndexFunc(line, func(r rune) bool { return unicode.IsControl(r) && !strings.ContainsRune("\t\n\r", r) }) >= 0 {
		return nil, fmt.Errorf("%w: the line must be UTF-8 text without control characters", ErrNotALaunchLine)
	}
	var (
		words []string
		cur   strings.Builder
		word  bool // cur is a word, maybe an empty one ('')
	)
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\':
			if i+1 < len(line) {
				i++
				if line[i] != '\n' {
					cur.WriteByte(line[i])
					word = true
				}
			}
		case c == '\'':
			end := strings.IndexByte(line[i+1:], '\'')
			if end < 0 {
				return nil, fmt.Errorf("%w: an unterminated ' quote", ErrNotALaunchLine)
			}
			cur.WriteString(line[i+1 : i+1+end])
			i += end + 1
			word = true
		case c == '"':
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) && strings.IndexByte("\"\\$`\n", line[i+1]) >= 0 {
					i++
					if line[i] == '\n' {
						continue
					}
				}
				cur.WriteByte(line[i])
			}
			if i >= len(line) {
				return nil, fmt.Errorf("%w: an unterminated \" quote", ErrNotALaunchLine)
			}
			word = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if word {
				words = append(words, cur.String())
				cur.Reset()
				word = false
			}
		default:
			cur.WriteByte(c)
			word = true
		}
	}
	if word {
		words = append(words, cur.String())
	}
	return words, nil
}
