package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/wire"
)

// Dynamic users. A job that names no run_as, on an agent whose own run_as
// is empty (the default), runs as a uid of its own on each node, as
// systemd's DynamicUser does: no other process on the node shares it, so no
// local user can read the workers' environment (secret_env, the report
// token), ptrace them, or connect to their warm standby's socket. A shared
// default such as nobody would make every nobody process on the node the
// job's user.
//
// The uid is picked from dynamic_users when the job's first process on the
// node starts (worker or warm standby), and released when the last one has
// exited. The gid is the same number; there are no supplementary groups.
// Each job starts from a home uid given by a hash of its name, so it gets
// the same uid on every node and in every generation where that uid is
// free; otherwise the next free one. A uid is free when no live job of this
// agent holds it, the node has no user or group entry for it, and no
// process runs with it as any of its uids or gids (zombies aside).

// DynamicUsers is the range dynamic uids come from, both ends included.
type DynamicUsers struct {
	// First and Last are the range's ends (uids, which are also the
	// gids): systemd's DynamicUser= range is 61184-65519.
	First uint32 `json:"first"`
	Last  uint32 `json:"last"`
}

// maxDynamicUsers bounds the range's size: a node with every uid taken
// would try each one at every start.
const maxDynamicUsers = 1 << 16

// DefaultDynamicUsers is systemd's range for DynamicUser (61184-65519),
// which distributions leave out of their own allocations; nobody (65534)
// lies above it.
func DefaultDynamicUsers() DynamicUsers { return DynamicUsers{First: 61184, Last: 65519} }

// Validate names the bad end of the range with field.
func (d DynamicUsers) Validate(field string) error {
	switch {
	case d.First == 0:
		return wire.Fieldf(field+".first", "must be above 0 (root), got 0; systemd's range is 61184-65519")
	case d.Last < d.First:
		return wire.Fieldf(field+".last", "must be at least first (%d), got %d", d.First, d.Last)
	case d.Last == ^uint32(0):
		return wire.Fieldf(field+".last", "must be below 4294967295 (the invalid uid), got %d", d.Last)
	case uint64(d.Last)-uint64(d.First)+1 > maxDynamicUsers:
		return wire.Fieldf(field, "at most %d uids, got %d-%d (%d)", maxDynamicUsers, d.First, d.Last, uint64(d.Last)-uint64(d.First)+1)
	}
	return nil
}

func (d DynamicUsers) contains(uid uint32) bool { return d.First <= uid && uid <= d.Last }

// pickUID is job's uid in r: the first one, from the job's home uid (a hash
// of its name) upwards and around the range, that taken does not report;
// false when taken reports them all.
func pickUID(job string, r DynamicUsers, taken func(uint32) bool) (uint32, bool) {
	size := uint64(r.Last) - uint64(r.First) + 1
	h := fnv.New32a()
	_, _ = h.Write([]byte(job))
	home := uint64(h.Sum32()) % size
	for i := range size {
		uid := r.First + uint32((home+i)%size)
		if !taken(uid) {
			return uid, true
		}
	}
	return 0, false
}

// parseStatusIDs adds the uids and gids (real, effective, saved, fs) of a
// /proc/PID/status to ids; a zombie adds none, as it holds no access.
func parseStatusIDs(status []byte, ids map[uint32]bool) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	var found []uint32
	for sc.Scan() {
		key, rest, _ := strings.Cut(sc.Text(), ":")
		switch key {
		case "State":
			if f := strings.Fields(rest); len(f) > 0 && f[0] == "Z" {
				return
			}
		case "Uid", "Gid":
			for _, f := range strings.Fields(rest) {
				if n, err := strconv.ParseUint(f, 10, 32); err == nil {
					found = append(found, uint32(n))
				}
			}
		}
	}
	for _, id := range found {
		ids[id] = true
	}
}

// processIDs is every uid and gid a process on the node runs with. A
// process that ends while it is read is skipped.
func processIDs() (map[uint32]bool, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	ids := map[uint32]bool{}
	for _, e := range entries {
		if _, err := strconv.ParseUint(e.Name(), 10, 32); err != nil {
			continue
		}
		if status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status")); err == nil {
			parseStatusIDs(status, ids)
		}
	}
	return ids, nil
}

// hasIDEntry reports whether the node names id as a user or a group; an
// answer it cannot get (a failing directory service) counts as yes.
func hasIDEntry(id uint32) bool {
	s := strconv.FormatUint(uint64(id), 10)
	var noUser user.UnknownUserIdError
	if _, err := user.LookupId(s); !errors.As(err, &noUser) {
		return true
	}
	var noGroup user.UnknownGroupIdError
	_, err := user.LookupGroupId(s)
	return !errors.As(err, &noGroup)
}

// nodeIDsInUse is the node's view of taken ids: one scan of the processes,
// then a user and group lookup for each id asked about.
func nodeIDsInUse() (func(uint32) bool, error) {
	procs, err := processIDs()
	if err != nil {
		return nil, err
	}
	return func(id uint32) bool { return procs[id] || hasIDEntry(id) }, nil
}

// dynamicUsersFile, under state_dir, keeps the allocations across agent
// restarts: an agent that adopts a job's workers keeps their uid for the
// job's next process.
const dynamicUsersFile = "dynamic_users.json"

// dynamicUsers allocates jobs' dynamic uids on this node. mu guards jobs
// and the file, which is written under it at each allocation and release
// (a job's first start and last exit on the node, never more often).
type dynamicUsers struct {
	r    DynamicUsers
	path string
	log  *zap.Logger
	// inUse reports the ids the node uses outside this allocator
	// (nodeIDsInUse; tests give their own).
	inUse func() (func(uint32) bool, error)

	mu   sync.Mutex
	jobs map[string]*dynamicUser
}

type dynamicUser struct {
	UID uint32 `json:"uid"`
	// holds counts the job's processes started (or adopted) and not yet
	// exited; 0 for an allocation loaded from the file and not adopted.
	holds int
}

// newDynamicUsers loads the allocations a previous agent left in stateDir.
// An unreadable file is logged and dropped: Adopt records the adopted
// workers' uids again.
func newDynamicUsers(r DynamicUsers, stateDir string, log *zap.Logger) *dynamicUsers {
	d := &dynamicUsers{r: r, path: filepath.Join(stateDir, dynamicUsersFile), log: log, inUse: nodeIDsInUse, jobs: map[string]*dynamicUser{}}
	data, err := os.ReadFile(d.path)
	if errors.Is(err, os.ErrNotExist) {
		return d
	}
	var saved map[string]*dynamicUser
	if err == nil {
		err = json.Unmarshal(data, &saved)
	}
	if err != nil {
		log.Warn("ignoring unreadable dynamic user allocations", zap.String("path", d.path), zap.Error(err))
		return d
	}
	for job, u := range saved {
		if u != nil && r.contains(u.UID) {
			d.jobs[job] = &dynamicUser{UID: u.UID}
		}
	}
	return d
}

// acquire returns job's uid, allocating one if the job holds none, and the
// function that gives this hold back (once the process it was taken for
// has exited).
func (d *dynamicUsers) acquire(job string) (uint32, func(), error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if u, ok := d.jobs[job]; ok {
		u.holds++
		return u.UID, d.releaser(job), nil
	}
	nodeTaken, err := d.inUse()
	if err != nil {
		return 0, nil, fmt.Errorf("allocating a dynamic user: %w", err)
	}
	held := map[uint32]bool{}
	for _, u := range d.jobs {
		held[u.UID] = true
	}
	uid, ok := pickUID(job, d.r, func(id uint32) bool { return held[id] || nodeTaken(id) })
	if !ok {
		return 0, nil, fmt.Errorf("no free uid in dynamic_users %d-%d: each has a user or group entry, a process, or another job", d.r.First, d.r.Last)
	}
	d.jobs[job] = &dynamicUser{UID: uid, holds: 1}
	if err := d.saveLocked(); err != nil {
		delete(d.jobs, job)
		return 0, nil, err
	}
	d.log.Info("allocated a dynamic user", zap.String("job", job), zap.Uint32("uid", uid))
	return uid, d.releaser(job), nil
}

// adopt records that an adopted process of job runs as uid and returns the
// function that gives its hold back; a uid outside the range (the job named
// its user) holds nothing.
func (d *dynamicUsers) adopt(job string, uid uint32) func() {
	if !d.r.contains(uid) {
		return func() {}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	u, ok := d.jobs[job]
	if !ok || u.UID != uid {
		u = &dynamicUser{UID: uid}
		d.jobs[job] = u
		if err := d.saveLocked(); err != nil {
			d.log.Error("recording an adopted dynamic user failed", zap.String("job", job), zap.Error(err))
		}
	}
	u.holds++
	return d.releaser(job)
}

// prune releases the allocations nothing holds: after adoption, those of
// jobs whose workers did not outlive the previous agent.
func (d *dynamicUsers) prune() {
	d.mu.Lock()
	defer d.mu.Unlock()
	changed := false
	for job, u := range d.jobs {
		if u.holds == 0 {
			delete(d.jobs, job)
			changed = true
		}
	}
	if changed {
		if err := d.saveLocked(); err != nil {
			d.log.Error("releasing dynamic users failed", zap.Error(err))
		}
	}
}

// releaser gives one hold of job's back, once however often it is called;
// the last one releases the uid.
func (d *dynamicUsers) releaser(job string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			d.mu.Lock()
			defer d.mu.Unlock()
			u, ok := d.jobs[job]
			if !ok {
				return
			}
			if u.holds--; u.holds > 0 {
				return
			}
			delete(d.jobs, job)
			if err := d.saveLocked(); err != nil {
				d.log.Error("releasing a dynamic user failed", zap.String("job", job), zap.Error(err))
				return
			}
			d.log.Info("released a dynamic user", zap.String("job", job), zap.Uint32("uid", u.UID))
		})
	}
}

// saveLocked writes the allocations, replacing the file at once. Callers
// hold mu.
func (d *dynamicUsers) saveLocked() error {
	data, err := json.Marshal(d.jobs)
	if err != nil {
		return fmt.Errorf("encoding dynamic users: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(d.path), 0o755); err != nil {
		return fmt.Errorf("saving dynamic users: %w", err)
	}
	tmp := d.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("saving dynamic users: %w", err)
	}
	if err := os.Rename(tmp, d.path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("saving dynamic users: %w", err)
	}
	return nil
}

// dynamicRunAs is the RunAs of a dynamic uid: gid the same, no
// supplementary groups, HOME the job's scratch directory. It must pass the
// policy like any user, and needs a root agent.
func dynamicRunAs(uid uint32, home string, policy RunAsPolicy) (*RunAs, error) {
	const field = "run_as (none: a dynamic user from the agent's dynamic_users)"
	spec := strconv.FormatUint(uint64(uid), 10)
	if err := policy.check(field, spec, uid, "", uid, nil, false, groupName); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, wire.Fieldf(field, "this agent runs as uid %d and cannot start workers as uid %d; run it as root, or set its run_as", os.Geteuid(), uid)
	}
	return &RunAs{
		Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}},
		Env:        map[string]string{"HOME": home},
	}, nil
}
