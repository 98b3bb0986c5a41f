package jobspec

import (
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/wire"
)

// ValidationError lists every problem found, so an operator fixes a job file
// in one go rather than one error at a time.
type ValidationError struct {
	Errors []*wire.FieldError
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
	envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

const (
	maxArgs     = 256
	maxArgBytes = 4096
	maxEnv      = 256
	// maxEnvNameBytes bounds a variable's name.
	maxEnvNameBytes = 256
	maxPathLen      = 4096
	maxRestarts     = 1000
	maxMarkers      = 16
)

func derefInt(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// Validate checks a defaulted Spec. It returns a *ValidationError listing
// every problem, or nil.
func (s *Spec) Validate() error {
	var errs []*wire.FieldError
	add := func(field, value, reason string) {
		errs = append(errs, &wire.FieldError{Field: field, Value: value, Reason: reason})
	}

	if fe := wire.ValidateName("name", s.Name); fe != nil {
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
	case s.Nodes.Max > wire.MaxNodes:
		add("nodes.max", fmt.Sprint(s.Nodes.Max), fmt.Sprintf("must be at most %d", wire.MaxNodes))
	}
	if s.Nodes.Spares < 0 || s.Nodes.Spares > wire.MaxNodes {
		add("nodes.spares", fmt.Sprint(s.Nodes.Spares), fmt.Sprintf("must be between 0 and %d", wire.MaxNodes))
	}
	if g := s.Nodes.Grow; g != GrowCheckpoint && g != GrowNever {
		add("nodes.grow", fmt.Sprintf("%q", g), fmt.Sprintf("must be %q or %q", GrowCheckpoint, GrowNever))
	}
	if s.GPUsPerNode < 0 || s.GPUsPerNode > wire.MaxGPUsPerNode {
		add("gpus_per_node", fmt.Sprint(s.GPUsPerNode), fmt.Sprintf("must be between 0 and %d", wire.MaxGPUsPerNode))
	}
	if s.ProcsPerNode < 1 || s.ProcsPerNode > wire.MaxProcsPerNode {
		add("procs_per_node", fmt.Sprint(s.ProcsPerNode), fmt.Sprintf("must be between 1 and %d", wire.MaxProcsPerNode))
	}

	switch {
	case len(s.Command) == 0:
		add("command", "", "is required: the training script and its arguments, passed to torchrun")
	case len(s.Command) > maxArgs:
		add("command", fmt.Sprint(len(s.Command)), fmt.Sprintf("at most %d arguments are allowed", maxArgs))
	case strings.TrimSpace(s.Command[0]) == "":
		add("command[0]", wire.Quote(s.Command[0]), "must name the training script")
	default:
		if fe := s.validateCommandLauncher(); fe != nil {
			errs = append(errs, fe)
		}
	}
	errs = append(errs, validateArgs("command", s.Command)...)

	errs = append(errs, validatePath("workdir", s.Workdir)...)
	errs = append(errs, validatePath("checkpoint.dir", s.Checkpoint.Dir)...)

	errs = append(errs, s.validateEnv()...)
	if s.RunAs != "" {
		if fe := wire.ValidateRunAs("run_as", s.RunAs); fe != nil {
			errs = append(errs, fe)
		}
	}
	errs = append(errs, wire.ValidateLabels("selector", s.Selector)...)

	if lc := s.Rendezvous.LastCall; lc == nil || lc.Duration < 0 || lc.Duration > time.Hour {
		add("rendezvous.last_call", durString(lc), "must be between 0s and 1h")
	}
	if to := s.Rendezvous.Timeout; to == nil || to.Duration < 0 {
		add("rendezvous.timeout", durString(to), "must be 0s (wait forever) or a positive duration")
	}

	errs = append(errs, s.validateLauncher()...)

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
			add(fmt.Sprintf("checkpoint.markers[%d]", i), wire.Quote(m), "must be a plain file name")
		}
	}
	if m := s.Checkpoint.Memory; m != nil {
		if m.Replicas < 1 || m.Replicas > MaxMemoryReplicas {
			add("checkpoint.memory.replicas", fmt.Sprint(m.Replicas), fmt.Sprintf("must be between 1 and %d", MaxMemoryReplicas))
		}
		if m.MaxBytes < 1<<20 {
			add("checkpoint.memory.max_bytes", fmt.Sprint(m.MaxBytes), "must be at least 1048576 (1 MiB)")
		}
		switch {
		case m.PersistEvery < 0 || m.PersistEvery > MaxPersistEvery:
			add("checkpoint.memory.persist_every", fmt.Sprint(m.PersistEvery), fmt.Sprintf("must be between 0 (never) and %d", MaxPersistEvery))
		case m.PersistEvery > 0 && s.Checkpoint.Dir == "":
			add("checkpoint.memory.persist_every", fmt.Sprint(m.PersistEvery), "needs checkpoint.dir, where the steps are persisted")
		}
	}
	if p := s.Health.ProgressTimeout; p != nil && p.Duration < 0 {
		add("health.progress_timeout", durString(p), "must be unset (derived from the step time), 0s (off) or a positive duration")
	}
	if p := s.Health.CheckpointTimeout; p == nil || p.Duration < 0 {
		add("health.checkpoint_timeout", durString(p), "must be 0s (off) or a positive duration")
	}
	if p := s.Health.StartupTimeout; p == nil || p.Duration < 0 {
		add("health.startup_timeout", durString(p), "must be 0s (off) or a positive duration")
	}
	if pf := s.Health.Preflight; pf != nil {
		if pf.MinBandwidthMbps < 0 || math.IsNaN(pf.MinBandwidthMbps) || math.IsInf(pf.MinBandwidthMbps, 0) {
			add("health.preflight.min_bandwidth_mbps", fmt.Sprint(pf.MinBandwidthMbps), "must be 0 (only failures exclude) or a bandwidth in Mbit/s")
		}
		if pf.Bytes < MinPreflightBytes || pf.Bytes > MaxPreflightBytes {
			add("health.preflight.bytes", fmt.Sprint(pf.Bytes), fmt.Sprintf("must be between %d and %d", MinPreflightBytes, MaxPreflightBytes))
		}
		if t := pf.Timeout; t == nil || t.Duration <= 0 || t.Duration > MaxPreflightTimeout {
			add("health.preflight.timeout", durString(t), fmt.Sprintf("must be positive and at most %s", MaxPreflightTimeout))
		}
	}

	// Checked last and only when all else is fine: every field within its
	// own limits can still add up to more than etcd stores in one request.
	if len(errs) == 0 {
		if n := proto.Size(s.ToProto()); n > wire.MaxSpecBytes {
			add("job", fmt.Sprintf("%d bytes", n), fmt.Sprintf("is larger than the %d bytes allowed in all", wire.MaxSpecBytes))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	for _, fe := range errs {
		s.pos.Locate(fe)
	}
	return &ValidationError{Errors: errs}
}

// validateEnv checks env, secret_env and env_files together: they end up in
// one environment, so a name may be given in only one of them. No error
// quotes a value: it may be a secret.
func (s *Spec) validateEnv() []*wire.FieldError {
	var errs []*wire.FieldError
	if n := len(s.Env) + len(s.SecretEnv) + len(s.EnvFiles); n > maxEnv {
		errs = append(errs, &wire.FieldError{Field: "env", Value: fmt.Sprint(n), Reason: fmt.Sprintf("at most %d variables are allowed across env, secret_env and env_files", maxEnv)})
	}
	valueOK := func(field, v string) *wire.FieldError {
		if len(v) > wire.MaxEnvValueBytes || strings.ContainsRune(v, 0) {
			return &wire.FieldError{Field: field, Reason: fmt.Sprintf("value must be at most %d bytes without NUL characters", wire.MaxEnvValueBytes)}
		}
		return nil
	}
	fileOK := func(field, p string) *wire.FieldError {
		if p == "" {
			return &wire.FieldError{Field: field, Reason: "must name the file on each node holding the value"}
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
		check func(field, v string) *wire.FieldError
	}{{"env", s.Env, valueOK}, {"secret_env", s.SecretEnv, valueOK}, {"env_files", s.EnvFiles, fileOK}} {
		for _, k := range wire.SortedKeys(set.vars) {
			var fe *wire.FieldError
			switch {
			case len(k) > maxEnvNameBytes || !envName.MatchString(k):
				fe = &wire.FieldError{Field: set.field, Value: wire.Quote(k), Reason: fmt.Sprintf("variable names must match [A-Za-z_][A-Za-z0-9_]* and be at most %d characters", maxEnvNameBytes)}
			case reservedEnvReason(k) != "":
				fe = &wire.FieldError{Field: set.field + "." + k, Reason: reservedEnvReason(k)}
			case givenIn[k] != "":
				fe = &wire.FieldError{Field: set.field + "." + k, Reason: "is already given in " + givenIn[k]}
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

func validateArgs(field string, args []string) []*wire.FieldError {
	var errs []*wire.FieldError
	for i, a := range args {
		if len(a) > maxArgBytes || strings.ContainsRune(a, 0) {
			errs = append(errs, &wire.FieldError{Field: fmt.Sprintf("%s[%d]", field, i), Reason: fmt.Sprintf("must be at most %d bytes without NUL characters", maxArgBytes)})
		}
	}
	return errs
}

func validatePath(field, p string) []*wire.FieldError {
	if p == "" {
		return nil
	}
	if len(p) > maxPathLen || strings.ContainsRune(p, 0) {
		return []*wire.FieldError{{Field: field, Reason: fmt.Sprintf("must be at most %d bytes without NUL characters", maxPathLen)}}
	}
	fe := wire.CheckPath(field, p, "")
	if fe == nil {
		return nil
	}
	if !filepath.IsAbs(p) {
		fe.Reason += " (rdzvctl resolves relative paths against the job file's directory)"
	}
	return []*wire.FieldError{fe}
}

func durString(d *wire.Duration) string {
	if d == nil {
		return "nothing"
	}
	return d.String()
}
