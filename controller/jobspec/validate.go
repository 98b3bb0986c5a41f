package jobspec

import (
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
)

// FieldError names one problem: the field's path in job.yaml, the offending
// value and what was expected.
type FieldError struct {
	Field  string
	Value  string
	Reason string
}

func (e *FieldError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s: %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("%s: %s (got %s)", e.Field, e.Reason, e.Value)
}

// ValidationError lists every problem found, so an operator fixes a job file
// in one go rather than one error at a time.
type ValidationError struct {
	Errors []*FieldError
}

func (e *ValidationError) Error() string {
	msgs := make([]string, len(e.Errors))
	for i, fe := range e.Errors {
		msgs[i] = fe.Error()
	}
	return "invalid job: " + strings.Join(msgs, "; ")
}

func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

var (
	dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	envName      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	labelKey     = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$`)
	labelValue   = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?)?$`)
)

// reservedEnv are set by the agent for every worker; a job overriding them
// would silently break rank assignment or interface selection.
var reservedEnv = map[string]bool{
	"NCCL_SOCKET_IFNAME":   true,
	"GLOO_SOCKET_IFNAME":   true,
	"CUDA_VISIBLE_DEVICES": true,
	"MASTER_ADDR":          true,
	"MASTER_PORT":          true,
}

// agentLauncherFlags are the torchrun flags the agent sets from the
// assignment; accepting them in extra_args would let a job contradict the
// controller's rendezvous.
var agentLauncherFlags = []string{
	"--nnodes", "--node_rank", "--node-rank", "--nproc_per_node", "--nproc-per-node",
	"--master_addr", "--master-addr", "--master_port", "--master-port",
	"--rdzv_backend", "--rdzv-backend", "--rdzv_endpoint", "--rdzv-endpoint",
	"--rdzv_id", "--rdzv-id", "--standalone",
}

const (
	maxArgs     = 256
	maxArgBytes = 4096
	maxEnv      = 256
	// maxEnvNameBytes bounds a variable's name.
	maxEnvNameBytes  = 256
	maxUserNameBytes = 32
	maxLabels        = 64
	maxPathLen       = 4096
	maxRestarts      = 1000
	maxMarkers       = 16
)

func derefInt(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// ValidateNodeName checks a node name with the same rule as job names, so
// that names are safe in etcd keys, file paths and log fields.
func ValidateNodeName(field, name string) *FieldError {
	if len(name) > 63 || !dns1123Label.MatchString(name) {
		return &FieldError{Field: field, Value: quote(name), Reason: "must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"}
	}
	return nil
}

// ValidateLabels checks node labels or a job selector.
func ValidateLabels(field string, labels map[string]string) []*FieldError {
	var errs []*FieldError
	if len(labels) > maxLabels {
		errs = append(errs, &FieldError{Field: field, Value: fmt.Sprint(len(labels)), Reason: fmt.Sprintf("at most %d labels are allowed", maxLabels)})
	}
	for _, k := range sortedKeys(labels) {
		v := labels[k]
		if len(k) > 253 || !labelKey.MatchString(k) {
			errs = append(errs, &FieldError{Field: field, Value: quote(k), Reason: "label key must be letters, digits, '.', '_', '-' or '/', starting and ending with a letter or digit, at most 253 characters"})
		}
		if len(v) > 63 || !labelValue.MatchString(v) {
			errs = append(errs, &FieldError{Field: field + "." + k, Value: quote(v), Reason: "label value must be empty or letters, digits, '.', '_', '-' or '/', starting and ending with a letter or digit, at most 63 characters"})
		}
	}
	return errs
}

// Validate checks a defaulted Spec. It returns a *ValidationError listing
// every problem, or nil.
func (s *Spec) Validate() error {
	var errs []*FieldError
	add := func(field, value, reason string) {
		errs = append(errs, &FieldError{Field: field, Value: value, Reason: reason})
	}

	if fe := ValidateNodeName("name", s.Name); fe != nil {
		if s.Name == "" {
			fe.Reason = "is required; " + fe.Reason
		}
		errs = append(errs, fe)
	}

	switch {
	case s.Nodes.Min < 1:
		add("nodes.min", fmt.Sprint(s.Nodes.Min), "must be at least 1")
	case s.Nodes.Max < s.Nodes.Min:
		add("nodes.max", fmt.Sprint(s.Nodes.Max), fmt.Sprintf("must be at least nodes.min (%d)", s.Nodes.Min))
	case s.Nodes.Max > MaxNodes:
		add("nodes.max", fmt.Sprint(s.Nodes.Max), fmt.Sprintf("must be at most %d", MaxNodes))
	}
	if s.GPUsPerNode < 0 || s.GPUsPerNode > MaxGPUsPerNode {
		add("gpus_per_node", fmt.Sprint(s.GPUsPerNode), fmt.Sprintf("must be between 0 and %d", MaxGPUsPerNode))
	}
	if s.ProcsPerNode < 1 || s.ProcsPerNode > MaxProcsPerNode {
		add("procs_per_node", fmt.Sprint(s.ProcsPerNode), fmt.Sprintf("must be between 1 and %d", MaxProcsPerNode))
	}

	switch {
	case len(s.Command) == 0:
		add("command", "", "is required: the training script and its arguments, passed to torchrun")
	case len(s.Command) > maxArgs:
		add("command", fmt.Sprint(len(s.Command)), fmt.Sprintf("at most %d arguments are allowed", maxArgs))
	case strings.TrimSpace(s.Command[0]) == "":
		add("command[0]", quote(s.Command[0]), "must name the training script")
	}
	errs = append(errs, validateArgs("command", s.Command)...)

	errs = append(errs, validatePath("workdir", s.Workdir)...)
	errs = append(errs, validatePath("checkpoint.dir", s.Checkpoint.Dir)...)

	errs = append(errs, s.validateEnv()...)
	if s.RunAs != "" {
		if fe := ValidateRunAs("run_as", s.RunAs); fe != nil {
			errs = append(errs, fe)
		}
	}
	errs = append(errs, ValidateLabels("selector", s.Selector)...)

	if lc := s.Rendezvous.LastCall; lc == nil || lc.Duration < 0 || lc.Duration > time.Hour {
		add("rendezvous.last_call", durString(lc), "must be between 0s and 1h")
	}
	if to := s.Rendezvous.Timeout; to == nil || to.Duration < 0 {
		add("rendezvous.timeout", durString(to), "must be 0s (wait forever) or a positive duration")
	}

	if strings.TrimSpace(s.Launcher.Torchrun) == "" || len(s.Launcher.Torchrun) > maxPathLen {
		add("launcher.torchrun", quote(s.Launcher.Torchrun), "must name the torchrun executable")
	}
	if len(s.Launcher.ExtraArgs) > maxArgs {
		add("launcher.extra_args", fmt.Sprint(len(s.Launcher.ExtraArgs)), fmt.Sprintf("at most %d arguments are allowed", maxArgs))
	}
	errs = append(errs, validateArgs("launcher.extra_args", s.Launcher.ExtraArgs)...)
	for i, a := range s.Launcher.ExtraArgs {
		flag, _, _ := strings.Cut(a, "=")
		for _, reserved := range agentLauncherFlags {
			if flag == reserved {
				add(fmt.Sprintf("launcher.extra_args[%d]", i), quote(a), "is set by the rdzv agent from the rendezvous and cannot be given")
			}
		}
	}

	if r := s.Restart.MaxRestarts; r == nil || *r < 0 || *r > maxRestarts {
		add("restart.max_restarts", fmt.Sprint(derefInt(r)), fmt.Sprintf("must be between 0 and %d", maxRestarts))
	}
	if b := s.Restart.Backoff.Initial; b == nil || b.Duration < 0 {
		add("restart.backoff.initial", durString(b), "must be 0s or a positive duration")
	}
	if b := s.Restart.Backoff.Max; b == nil || s.Restart.Backoff.Initial == nil || b.Duration < s.Restart.Backoff.Initial.Duration {
		add("restart.backoff.max", durString(b), "must be at least restart.backoff.initial")
	}
	if len(s.Checkpoint.Markers) > maxMarkers {
		add("checkpoint.markers", fmt.Sprint(len(s.Checkpoint.Markers)), fmt.Sprintf("at most %d markers are allowed", maxMarkers))
	}
	for i, m := range s.Checkpoint.Markers {
		if m == "" || m == "." || m == ".." || strings.ContainsAny(m, "/\x00") || len(m) > 255 {
			add(fmt.Sprintf("checkpoint.markers[%d]", i), quote(m), "must be a plain file name")
		}
	}
	if p := s.Health.ProgressTimeout; p == nil || p.Duration < 0 {
		add("health.progress_timeout", durString(p), "must be 0s (off) or a positive duration")
	}

	// Checked last and only when all else is fine: every field within its
	// own limits can still add up to more than etcd stores in one request.
	if len(errs) == 0 {
		if n := proto.Size(s.ToProto()); n > MaxSpecBytes {
			add("job", fmt.Sprintf("%d bytes", n), fmt.Sprintf("is larger than the %d bytes allowed in all", MaxSpecBytes))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return &ValidationError{Errors: errs}
}

// validateEnv checks env, secret_env and env_files together: they end up in
// one environment, so a name may be given in only one of them. No error
// quotes a value: it may be a secret.
func (s *Spec) validateEnv() []*FieldError {
	var errs []*FieldError
	if n := len(s.Env) + len(s.SecretEnv) + len(s.EnvFiles); n > maxEnv {
		errs = append(errs, &FieldError{Field: "env", Value: fmt.Sprint(n), Reason: fmt.Sprintf("at most %d variables are allowed across env, secret_env and env_files", maxEnv)})
	}
	valueOK := func(field, v string) *FieldError {
		if len(v) > MaxEnvValueBytes || strings.ContainsRune(v, 0) {
			return &FieldError{Field: field, Reason: fmt.Sprintf("value must be at most %d bytes without NUL characters", MaxEnvValueBytes)}
		}
		return nil
	}
	fileOK := func(field, p string) *FieldError {
		if p == "" {
			return &FieldError{Field: field, Reason: "must name the file on each node holding the value"}
		}
		if fes := validatePath(field, p); len(fes) > 0 {
			return fes[0]
		}
		return nil
	}
	givenIn := map[string]string{}
	for _, set := range []struct {
		field string
		vars  map[string]string
		check func(field, v string) *FieldError
	}{{"env", s.Env, valueOK}, {"secret_env", s.SecretEnv, valueOK}, {"env_files", s.EnvFiles, fileOK}} {
		for _, k := range sortedKeys(set.vars) {
			var fe *FieldError
			switch {
			case len(k) > maxEnvNameBytes || !envName.MatchString(k):
				fe = &FieldError{Field: set.field, Value: quote(k), Reason: fmt.Sprintf("variable names must match [A-Za-z_][A-Za-z0-9_]* and be at most %d characters", maxEnvNameBytes)}
			case reservedEnv[k] || strings.HasPrefix(k, "RDZV_"):
				fe = &FieldError{Field: set.field + "." + k, Reason: "is set by the rdzv agent from the assignment and cannot be overridden"}
			case givenIn[k] != "":
				fe = &FieldError{Field: set.field + "." + k, Reason: "is already given in " + givenIn[k]}
			default:
				givenIn[k] = set.field
				fe = set.check(set.field+"."+k, set.vars[k])
			}
			if fe != nil {
				errs = append(errs, fe)
			}
		}
	}
	return errs
}

var (
	userName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`)
	uidGID   = regexp.MustCompile(`^([0-9]+)(:([0-9]+))?$`)
)

// ValidateRunAs checks a run_as value: a user name, or a numeric uid with an
// optional gid (uid[:gid]). Whether the user exists is for the node to say.
func ValidateRunAs(field, v string) *FieldError {
	if m := uidGID.FindStringSubmatch(v); m != nil {
		for _, id := range []string{m[1], m[3]} {
			// 4294967295 is (uid_t)-1, which the kernel reads as "unchanged".
			if n, err := strconv.ParseUint(id, 10, 32); id != "" && (err != nil || n == math.MaxUint32) {
				return &FieldError{Field: field, Value: quote(v), Reason: "uid and gid must be below 4294967295"}
			}
		}
		return nil
	}
	if len(v) > maxUserNameBytes || !userName.MatchString(v) {
		return &FieldError{Field: field, Value: quote(v), Reason: fmt.Sprintf("must be a user name (letters, digits, '_', '.', '-', at most %d characters) or uid[:gid]", maxUserNameBytes)}
	}
	return nil
}

func validateArgs(field string, args []string) []*FieldError {
	var errs []*FieldError
	for i, a := range args {
		if len(a) > maxArgBytes || strings.ContainsRune(a, 0) {
			errs = append(errs, &FieldError{Field: fmt.Sprintf("%s[%d]", field, i), Reason: fmt.Sprintf("must be at most %d bytes without NUL characters", maxArgBytes)})
		}
	}
	return errs
}

func validatePath(field, p string) []*FieldError {
	if p == "" {
		return nil
	}
	switch {
	case len(p) > maxPathLen || strings.ContainsRune(p, 0):
		return []*FieldError{{Field: field, Reason: fmt.Sprintf("must be at most %d bytes without NUL characters", maxPathLen)}}
	case !filepath.IsAbs(p):
		return []*FieldError{{Field: field, Value: quote(p), Reason: "must be an absolute path (rdzvctl resolves relative paths against the job file's directory)"}}
	case filepath.Clean(p) != p:
		return []*FieldError{{Field: field, Value: quote(p), Reason: "must be a clean path without '..', '.' or repeated '/' elements"}}
	}
	return nil
}

func durString(d *Duration) string {
	if d == nil {
		return "nothing"
	}
	return d.String()
}

func quote(s string) string {
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return fmt.Sprintf("%q", s)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
