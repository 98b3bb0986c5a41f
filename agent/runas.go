package agent

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"github.com/rdzv/rdzv/wire"
)

// Who workers run as (run_as) is decided here and only here, so every way
// of starting workers applies the same rule: ResolveRunAs is the entry
// point, and a spawner only applies its Credential.

// errRootRefused marks a run_as that resolves to root on an agent whose
// config does not allow it.
var errRootRefused = errors.New("running workers as root is not allowed by this agent (set allow_root in its config)")

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
// uid:gid is exactly those ids, with no supplementary groups. Root (uid or
// gid 0) is refused unless allowRoot.
func ResolveRunAs(jobRunAs, agentRunAs string, allowRoot bool) (*RunAs, error) {
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
	if (uid == 0 || gid == 0) && !allowRoot {
		return nil, fmt.Errorf("%s %q is uid %d gid %d: %w", field, spec, uid, gid, errRootRefused)
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
