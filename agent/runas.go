package agent

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"go.uber.org/zap"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// Who workers run as (run_as) is decided here and only here, so every way
// of starting workers applies the same rule: ResolveRunAs is the entry
// point, and a spawner only applies its Credential. A job's submitter names
// the user; the agent's run_as_policy says which users and groups it may
// name, so that holding a job certificate does not make one root-equivalent
// on the nodes.

// errRootRefused marks a run_as that resolves to root on an agent whose
// config does not allow it.
var errRootRefused = errors.New("running workers as root is not allowed by this agent (set allow_root in its config)")

// RunAsPolicy says whom workers may run as, whether the job or the agent's
// run_as names the user. Each entry is a name, a numeric id, or a range of
// ids "lo-hi" (both included). Root (uid 0, and group 0 as primary or
// supplementary group) is allow_root's to permit, not this policy's: a root
// worker has every privilege, so no group rule applies to it.
type RunAsPolicy struct {
	// AllowedUsers: the worker's user must match one entry.
	AllowedUsers []string `json:"allowed_users"`
	// AllowedGroups, when not empty: each of the worker's groups must match
	// one entry. Empty allows any group that is not privileged.
	AllowedGroups []string `json:"allowed_groups"`
	// PrivilegedGroups: none of the worker's groups, primary or
	// supplementary, may match an entry.
	PrivilegedGroups []string `json:"privileged_groups"`
}

// DefaultRunAsPolicy admits regular users (uid 1000 and up, as Debian and
// RHEL number them) and nobody, and refuses the groups that give root, raw
// disks or memory, or the host's secrets and logs: a worker runs whatever
// code its job brings. Groups for GPUs and RDMA (video, render, rdma) are
// not among them: workers need those devices.
func DefaultRunAsPolicy() RunAsPolicy {
	return RunAsPolicy{
		AllowedUsers: []string{"nobody", "1000-4294967294"},
		PrivilegedGroups: []string{
			"adm", "systemd-journal", // every log on the host
			"admin", "sudo", "wheel", // sudo
			"disk", "kmem", "tty", // raw disks, memory, terminals
			"docker", "incus-admin", "libvirt", "lxd", // a root container or VM
			"shadow", "ssl-cert", // password hashes, TLS private keys
			"staff", // writes /usr/local, first on root's PATH on Debian
		},
	}
}

// Validate names each malformed entry with its field.
func (p RunAsPolicy) Validate(field string) error {
	var errs []error
	for _, list := range []struct {
		name    string
		entries []string
	}{{"allowed_users", p.AllowedUsers}, {"allowed_groups", p.AllowedGroups}, {"privileged_groups", p.PrivilegedGroups}} {
		for i, e := range list.entries {
			if _, _, _, err := parseIDRule(e); err != nil {
				errs = append(errs, fmt.Errorf("%s.%s[%d]: %w", field, list.name, i, err))
			}
		}
	}
	return errors.Join(errs...)
}

// parseIDRule reads a policy entry: a name, or ids lo to hi.
func parseIDRule(e string) (name string, lo, hi uint32, err error) {
	loPart, hiPart, isRange := strings.Cut(e, "-")
	if isDigits(loPart) && (!isRange || isDigits(hiPart)) {
		lo, hi = parseID(loPart), parseID(loPart)
		if isRange {
			hi = parseID(hiPart)
		}
		if lo > hi || hi == math.MaxUint32 {
			return "", 0, 0, fmt.Errorf("%q: an id range must be lo-hi with lo <= hi < 4294967295", e)
		}
		return "", lo, hi, nil
	}
	// ValidateRunAs also takes uid:gid, which is no entry.
	if fe := wire.ValidateRunAs("entry", e); fe != nil || strings.Contains(e, ":") {
		return "", 0, 0, fmt.Errorf("%q: must be a user or group name, an id, or a range of ids lo-hi", e)
	}
	return e, 0, 0, nil
}

// matchRule is the first entry matching id or name ("" when the node has
// no name for the id), or "".
func matchRule(entries []string, id uint32, name string) string {
	for _, e := range entries {
		n, lo, hi, err := parseIDRule(e)
		if err == nil && ((n != "" && n == name) || (n == "" && lo <= id && id <= hi)) {
			return e
		}
	}
	return ""
}

// RunAsRefusal is a run_as the agent's policy refuses. It names the rule
// and how an operator would allow it.
type RunAsRefusal struct {
	// Field is run_as, or the agent's run_as when the job names none.
	Field, Spec string
	// Who is the user or group the rule caught, Rule the policy's field.
	Who, Rule string
	// Why says how Who breaks Rule, Allow how to let it through.
	Why, Allow string
}

func (e *RunAsRefusal) Error() string {
	return fmt.Sprintf("%s %q: %s, %s; %s", e.Field, e.Spec, e.Who, e.Why, e.Allow)
}

// describeID is "uid 1 (daemon)", or "uid 4242" without a name.
func describeID(kind string, id uint32, name string) string {
	if name == "" {
		return fmt.Sprintf("%s %d", kind, id)
	}
	return fmt.Sprintf("%s %d (%s)", kind, id, name)
}

// groupName is the node's name for gid, or "".
func groupName(gid uint32) string {
	g, err := user.LookupGroupId(strconv.FormatUint(uint64(gid), 10))
	if err != nil {
		return ""
	}
	return g.Name
}

// check applies the policy to a user other than root: uid, its name (""
// without a user entry), its primary group gid and every group it will
// hold. nameOf names groups (groupName), so tests can give their own.
func (p RunAsPolicy) check(field, spec string, uid uint32, userName string, gid uint32, groups []uint32, allowRoot bool, nameOf func(uint32) string) error {
	refuse := func(who, rule, why, allow string) error {
		return &RunAsRefusal{Field: field, Spec: spec, Who: who, Rule: rule, Why: why, Allow: allow}
	}
	if matchRule(p.AllowedUsers, uid, userName) == "" {
		who := describeID("is uid", uid, userName)
		allow := fmt.Sprintf("to allow it, add %d", uid)
		if userName != "" {
			allow = fmt.Sprintf("to allow it, add %q or %d", userName, uid)
		}
		return refuse(who, "allowed_users", fmt.Sprintf("which matches no entry of this agent's run_as_policy.allowed_users %q", p.AllowedUsers), allow+" there")
	}
	all := append([]uint32{gid}, groups...)
	for i, g := range all {
		if i > 0 && g == gid {
			continue
		}
		kind := "primary group"
		if i > 0 {
			kind = "supplementary group"
		}
		name := nameOf(g)
		who := describeID("has "+kind, g, name)
		if g == 0 {
			if !allowRoot {
				return fmt.Errorf("%s %q %s: %w", field, spec, who, errRootRefused)
			}
			continue
		}
		if e := matchRule(p.PrivilegedGroups, g, name); e != "" {
			return refuse(who, "privileged_groups", fmt.Sprintf("which matches %q in this agent's run_as_policy.privileged_groups", e),
				fmt.Sprintf("to allow it, remove %q from that list, or run the job as a user outside the group", e))
		}
		if len(p.AllowedGroups) > 0 && matchRule(p.AllowedGroups, g, name) == "" {
			add := fmt.Sprint(g)
			if name != "" {
				add = fmt.Sprintf("%q or %d", name, g)
			}
			return refuse(who, "allowed_groups", fmt.Sprintf("which matches no entry of this agent's run_as_policy.allowed_groups %q", p.AllowedGroups), "to allow it, add "+add+" there")
		}
	}
	return nil
}

// RunAs is the user workers run as, resolved on this node.
type RunAs struct {
	// Credential switches the workers to the user; nil when that is the
	// agent's own user, so no switch is needed (nor allowed, unprivileged).
	Credential *syscall.Credential
	// Env is HOME, USER and LOGNAME for the user, which the agent's own
	// would otherwise be; the job's env can still set them.
	Env map[string]string
}

// ResolveRunAs resolves the job's run_as, or agentRunAs when the job gives
// none: a user name, or uid[:gid]. A name brings the user's primary and
// supplementary groups; uid alone brings the primary group of a known uid;
// uid:gid is exactly those ids, with no supplementary groups. Root (uid 0,
// or group 0 among the groups) is refused unless allowRoot; any other user
// must pass policy with every group it will hold.
func ResolveRunAs(jobRunAs, agentRunAs string, allowRoot bool, policy RunAsPolicy) (*RunAs, error) {
	spec, field := jobRunAs, "run_as"
	if spec == "" {
		spec, field = agentRunAs, "the agent's run_as"
	}
	if fe := wire.ValidateRunAs(field, spec); fe != nil {
		return nil, fe
	}
	var (
		uid, gid uint32
		groups   []uint32
		u        *user.User
		err      error
	)
	if idPart, gidPart, hasGID := strings.Cut(spec, ":"); isDigits(idPart) {
		uid = parseID(idPart)
		u, err = user.LookupId(idPart)
		switch {
		case hasGID:
			gid, groups = parseID(gidPart), []uint32{parseID(gidPart)}
		case err != nil:
			return nil, fmt.Errorf("%s %q: uid %s has no user entry on this node, so give its group too (uid:gid): %w", field, spec, idPart, err)
		}
	} else if u, err = user.Lookup(spec); err != nil {
		return nil, fmt.Errorf("%s %q: %w", field, spec, err)
	}
	if u != nil && groups == nil {
		uid, gid = parseID(u.Uid), parseID(u.Gid)
		ids, err := u.GroupIds()
		if err != nil {
			return nil, fmt.Errorf("%s %q: listing the user's groups: %w", field, spec, err)
		}
		for _, g := range ids {
			if isDigits(g) {
				groups = append(groups, parseID(g))
			}
		}
	}
	switch {
	case uid == 0 && !allowRoot:
		return nil, fmt.Errorf("%s %q is uid %d gid %d: %w", field, spec, uid, gid, errRootRefused)
	case uid != 0:
		userName := ""
		if u != nil {
			userName = u.Username
		}
		if err := policy.check(field, spec, uid, userName, gid, groups, allowRoot, groupName); err != nil {
			return nil, err
		}
	}
	r := &RunAs{Env: map[string]string{}}
	if u != nil {
		r.Env["HOME"], r.Env["USER"], r.Env["LOGNAME"] = u.HomeDir, u.Username, u.Username
	}
	if int(uid) == os.Geteuid() && int(gid) == os.Getegid() {
		return r, nil
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%s %q: this agent runs as uid %d and cannot start workers as uid %d gid %d; run it as root, or set run_as to its own user", field, spec, os.Geteuid(), uid, gid)
	}
	r.Credential = &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}
	return r, nil
}

func isDigits(s string) bool {
	_, err := strconv.ParseUint(s, 10, 32)
	return err == nil
}

// parseID reads an id ValidateRunAs or the user database vouched for.
func parseID(s string) uint32 {
	n, _ := strconv.ParseUint(s, 10, 32)
	return uint32(n)
}

// resolveRunAs is whom a job's processes run as on this node: the job's
// run_as, else the agent's, else (both empty) the job's dynamic user, whose
// HOME is scratch. The returned function gives back the hold on a dynamic
// user once what runs as it has exited; it does nothing for a named user.
func (s *Supervisor) resolveRunAs(spec *rdzvv1.JobSpec, scratch string) (*RunAs, func(), error) {
	if spec.GetRunAs() != "" || s.dynUsers == nil {
		r, err := ResolveRunAs(spec.GetRunAs(), s.runAs, s.allowRoot, s.policy)
		if err == nil && r.Env["USER"] == "nobody" {
			s.log.Warn("workers run as nobody, a user other processes on the node share: they can read the workers' environment",
				zap.String("job", spec.GetName()))
		}
		return r, func() {}, err
	}
	uid, release, err := s.dynUsers.acquire(spec.GetName())
	if err != nil {
		return nil, nil, err
	}
	r, err := dynamicRunAs(uid, scratch, s.policy)
	if err != nil {
		release()
		return nil, nil, err
	}
	return r, release, nil
}
