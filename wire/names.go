package wire

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
)

var (
	dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	labelKey     = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$`)
	labelValue   = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?)?$`)
)

const (
	maxUserNameBytes = 32
	// MaxLabels bounds node labels and a job's selector.
	MaxLabels = 64
)

// FieldError names one problem: the field's path in job.yaml or a daemon's
// config file, the offending value and what was expected.
type FieldError struct {
	Field  string
	Value  string
	Reason string
	// Line and Column locate the field in the file it came from (from 1);
	// 0 when the value did not come from a file (the API, an agent, a
	// flag).
	Line, Column int
}

// Fieldf is a FieldError for field whose reason, formatted, says what is
// wrong and what is expected.
func Fieldf(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

func (e *FieldError) Error() string {
	at := ""
	if e.Line > 0 {
		at = fmt.Sprintf("line %d, column %d: ", e.Line, e.Column)
	}
	if e.Value == "" {
		return fmt.Sprintf("%s%s: %s", at, e.Field, e.Reason)
	}
	return fmt.Sprintf("%s%s: %s (got %s)", at, e.Field, e.Reason, e.Value)
}

// ValidateName checks a job or node name (a DNS-1123 label), so that names
// are safe in etcd keys, file paths and log fields.
func ValidateName(field, name string) *FieldError {
	if len(name) > 63 || !dns1123Label.MatchString(name) {
		return &FieldError{Field: field, Value: Quote(name), Reason: "must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"}
	}
	return nil
}

// ValidateLabels checks node labels or a job selector.
func ValidateLabels(field string, labels map[string]string) []*FieldError {
	var errs []*FieldError
	if len(labels) > MaxLabels {
		errs = append(errs, &FieldError{Field: field, Value: fmt.Sprint(len(labels)), Reason: fmt.Sprintf("at most %d labels are allowed", MaxLabels)})
	}
	for _, k := range SortedKeys(labels) {
		v := labels[k]
		if len(k) > 253 || !labelKey.MatchString(k) {
			errs = append(errs, &FieldError{Field: field, Value: Quote(k), Reason: "label key must be letters, digits, '.', '_', '-' or '/', starting and ending with a letter or digit, at most 253 characters"})
		}
		if len(v) > 63 || !labelValue.MatchString(v) {
			errs = append(errs, &FieldError{Field: field + "." + k, Value: Quote(v), Reason: "label value must be empty or letters, digits, '.', '_', '-' or '/', starting and ending with a letter or digit, at most 63 characters"})
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
				return &FieldError{Field: field, Value: Quote(v), Reason: "uid and gid must be below 4294967295"}
			}
		}
		return nil
	}
	if len(v) > maxUserNameBytes || !userName.MatchString(v) {
		return &FieldError{Field: field, Value: Quote(v), Reason: fmt.Sprintf("must be a user name (letters, digits, '_', '.', '-', at most %d characters) or uid[:gid]", maxUserNameBytes)}
	}
	return nil
}

// Quote shows a value in an error, cut to 80 bytes so a huge value cannot
// flood a log line.
func Quote(s string) string {
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return fmt.Sprintf("%q", s)
}

// SortedKeys returns m's keys in order, so errors come out the same every time.
func SortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
