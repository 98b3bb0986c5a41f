package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
)

func TestPickUID(t *testing.T) {
	r := DynamicUsers{First: 100, Last: 109}
	home, ok := pickUID("train", r, func(uint32) bool { return false })
	require.True(t, ok)
	require.True(t, r.contains(home))
	again, _ := pickUID("train", r, func(uint32) bool { return false })
	require.Equal(t, home, again, "a job's home uid depends on its name only, so every node gives it the same")

	tests := []struct {
		name  string
		taken func(uint32) bool
		want  uint32
		ok    bool
	}{
		{"home free", func(uint32) bool { return false }, home, true},
		{"home taken: the next one", func(u uint32) bool { return u == home }, r.First + (home-r.First+1)%10, true},
		{"all but the one below home taken: around the range", func(u uint32) bool { return u != r.First+(home-r.First+9)%10 }, r.First + (home-r.First+9)%10, true},
		{"all taken", func(uint32) bool { return true }, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := pickUID("train", r, tt.taken)
			require.Equal(t, tt.ok, ok)
			require.Equal(t, tt.want, got)
		})
	}

	one := DynamicUsers{First: 4000, Last: 4000}
	got, ok := pickUID("x", one, func(uint32) bool { return false })
	require.True(t, ok)
	require.EqualValues(t, 4000, got, "a range of one")
}

func TestParseStatusIDs(t *testing.T) {
	tests := []struct {
		name   string
		status string
		want   []uint32
	}{
		{"every uid and gid", "Name:\tpython3\nState:\tS (sleeping)\nUid:\t61190\t61191\t61192\t61193\nGid:\t7\t8\t9\t10\nGroups:\t44\n",
			[]uint32{61190, 61191, 61192, 61193, 7, 8, 9, 10}},
		{"a zombie holds none", "Name:\tx\nState:\tZ (zombie)\nUid:\t61190\t61190\t61190\t61190\nGid:\t61190\t61190\t61190\t61190\n", nil},
		{"garbage", "Uid:\tx y\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids := map[uint32]bool{}
			parseStatusIDs([]byte(tt.status), ids)
			require.Len(t, ids, len(tt.want))
			for _, id := range tt.want {
				require.True(t, ids[id], "%d", id)
			}
		})
	}
}

// The node's own ids: this process, and root's user entry.
func TestNodeIDsInUse(t *testing.T) {
	inUse, err := nodeIDsInUse()
	require.NoError(t, err)
	require.True(t, inUse(uint32(os.Getuid())), "this process runs as it")
	require.True(t, inUse(0), "root has a user entry")
}

// testDynamicUsers allocates from r in stateDir, with taken as the node's
// other ids.
func testDynamicUsers(t *testing.T, r DynamicUsers, stateDir string, taken map[uint32]bool) *dynamicUsers {
	d := newDynamicUsers(r, stateDir, zaptest.NewLogger(t))
	d.inUse = func() (func(uint32) bool, error) { return func(u uint32) bool { return taken[u] }, nil }
	return d
}

func savedUsers(t *testing.T, stateDir string) map[string]uint32 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(stateDir, dynamicUsersFile))
	require.NoError(t, err)
	var saved map[string]struct {
		UID uint32 `json:"uid"`
	}
	require.NoError(t, json.Unmarshal(data, &saved))
	out := map[string]uint32{}
	for job, u := range saved {
		out[job] = u.UID
	}
	return out
}

func TestDynamicUsersAllocation(t *testing.T) {
	r := DynamicUsers{First: 200, Last: 203}
	dir := t.TempDir()
	d := testDynamicUsers(t, r, dir, map[uint32]bool{})

	a, releaseA1, err := d.acquire("a")
	require.NoError(t, err)
	a2, releaseA2, err := d.acquire("a")
	require.NoError(t, err)
	require.Equal(t, a, a2, "a job's processes share its user")
	b, releaseB, err := d.acquire("b")
	require.NoError(t, err)
	require.NotEqual(t, a, b, "another job gets another user")
	require.Equal(t, map[string]uint32{"a": a, "b": b}, savedUsers(t, dir))

	releaseA1()
	releaseA1() // once only
	require.Equal(t, map[string]uint32{"a": a, "b": b}, savedUsers(t, dir), "a is held by its other process")
	releaseA2()
	require.Equal(t, map[string]uint32{"b": b}, savedUsers(t, dir), "released with a's last process")
	releaseB()
	require.Empty(t, savedUsers(t, dir))

	// Every uid taken by the node or other jobs.
	full := testDynamicUsers(t, r, t.TempDir(), map[uint32]bool{200: true, 201: true, 202: true})
	_, release, err := full.acquire("c")
	require.NoError(t, err)
	defer release()
	_, _, err = full.acquire("d")
	require.ErrorContains(t, err, "no free uid in dynamic_users 200-203")
}

// An agent that restarts keeps the uid of the workers it adopts, and
// releases the ones whose workers did not outlive the previous agent.
func TestDynamicUsersAcrossRestart(t *testing.T) {
	r := DynamicUsers{First: 300, Last: 399}
	dir := t.TempDir()
	// The adopted workers' processes run as their uids: the node scan
	// sees them.
	taken := map[uint32]bool{}
	d := testDynamicUsers(t, r, dir, taken)
	kept, _, err := d.acquire("kept")
	require.NoError(t, err)
	_, _, err = d.acquire("gone")
	require.NoError(t, err)
	taken[kept] = true

	d = testDynamicUsers(t, r, dir, taken)
	releaseKept := d.adopt("kept", kept)
	noop := d.adopt("named", 1000)
	noop()
	d.prune()
	require.Equal(t, map[string]uint32{"kept": kept}, savedUsers(t, dir), "gone's workers were not adopted")

	again, releaseAgain, err := d.acquire("kept")
	require.NoError(t, err)
	require.Equal(t, kept, again, "the next generation gets the adopted workers' uid, though their processes use it")
	other, releaseOther, err := d.acquire("other")
	require.NoError(t, err)
	require.NotEqual(t, kept, other)
	releaseOther()
	releaseKept()
	releaseAgain()
	require.Empty(t, savedUsers(t, dir))

	// Lost file: the adopted uid is recorded again.
	lost := t.TempDir()
	d = testDynamicUsers(t, r, lost, taken)
	release := d.adopt("kept", kept)
	require.Equal(t, map[string]uint32{"kept": kept}, savedUsers(t, lost))
	release()

	// An unreadable file is dropped.
	bad := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bad, dynamicUsersFile), []byte("{"), 0o600))
	d = testDynamicUsers(t, r, bad, taken)
	require.Empty(t, d.jobs)
}

func TestDynamicUsersValidate(t *testing.T) {
	require.NoError(t, DefaultDynamicUsers().Validate("dynamic_users"))
	require.NoError(t, DynamicUsers{First: 5, Last: 5}.Validate("dynamic_users"))
	for _, tt := range []struct {
		r       DynamicUsers
		wantErr string
	}{
		{DynamicUsers{First: 0, Last: 10}, "dynamic_users.first: must be above 0 (root), got 0"},
		{DynamicUsers{First: 10, Last: 9}, "dynamic_users.last: must be at least first (10), got 9"},
		{DynamicUsers{First: 10, Last: 4294967295}, "dynamic_users.last: must be below 4294967295"},
		{DynamicUsers{First: 1, Last: 1 << 16}, ""},
		{DynamicUsers{First: 1, Last: 1<<16 + 1}, "dynamic_users: at most 65536 uids, got 1-65537 (65537)"},
	} {
		err := tt.r.Validate("dynamic_users")
		if tt.wantErr == "" {
			require.NoError(t, err)
			continue
		}
		require.ErrorContains(t, err, tt.wantErr)
	}
}

// dynamicRange is where the isolation tests' jobs get their users.
var dynamicRange = DefaultDynamicUsers()

// runAsDynamic has jobs without run_as run as dynamic users, the default.
func runAsDynamic(c *Config) {
	c.RunAs, c.AllowRoot, c.DynamicUsers = "", false, dynamicRange
}

// procIDs is the real uid and gid of pid, from /proc.
func procIDs(t *testing.T, pid int) (uid, gid uint32) {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(status), "\n") {
		key, rest, _ := strings.Cut(line, ":")
		if f := strings.Fields(rest); (key == "Uid" || key == "Gid") && len(f) > 0 {
			n, err := strconv.ParseUint(f[0], 10, 32)
			require.NoError(t, err)
			if key == "Uid" {
				uid = uint32(n)
			} else {
				gid = uint32(n)
			}
		}
	}
	return uid, gid
}

// asNobody runs python code as nobody, a local user of the node, and
// returns what it printed.
func asNobody(t *testing.T, code string, args ...string) string {
	t.Helper()
	cmd := exec.Command(python, append([]string{"-c", code}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "PYTHONDONTWRITEBYTECODE=1"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

// A job without run_as runs as a uid of its own, which nobody, a local
// user, is not: it cannot read the workers' environment. The uid is
// released when the workers are gone.
func TestDynamicUserIsolatesWorkers(t *testing.T) {
	needRoot(t)
	needPython(t)
	h := newSupervisor(t, runAsDynamic)
	// The dynamic user runs the launcher and writes its record in the
	// workdir.
	openToAll(t, h.workdir)
	require.NoError(t, os.Chmod(h.workdir, 0o777))
	openToAll(t, filepath.Dir(h.torchrun))

	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(h.stateDir, "logs", "train.log"))
			t.Logf("job log:\n%s", b)
		}
	})
	h.sup.Assign(h.assignment("train", 1, "hang"))
	h.expect("train", 1, wRunning)
	pid := h.record("train", 1).PID
	uid, gid := procIDs(t, pid)
	require.True(t, dynamicRange.contains(uid), "uid %d is a dynamic user's", uid)
	require.Equal(t, uid, gid, "its group is its own")
	require.Equal(t, map[string]uint32{"train": uid}, savedUsers(t, h.stateDir))
	scratch := filepath.Join(h.stateDir, "jobs", "train")
	info, err := os.Stat(scratch)
	require.NoError(t, err)
	require.EqualValues(t, uid, info.Sys().(*syscall.Stat_t).Uid, "its HOME, the scratch directory, is its own")

	out := asNobody(t, `
import sys
try:
    open("/proc/%s/environ" % sys.argv[1], "rb").read()
    print("environ: read")
except OSError as e:
    print("environ:", e.strerror)
`, strconv.Itoa(pid))
	require.Equal(t, "environ: Permission denied\n", out)

	h.sup.Assign(h.assignment("train", 2, "hang"))
	h.expect("train", 1, wStopped)
	h.expect("train", 2, wRunning)
	next, _ := procIDs(t, h.record("train", 2).PID)
	require.Equal(t, uid, next, "the next generation gets the same user")

	h.sup.Stop("train", 2, "done")
	h.expect("train", 2, wStopped)
	require.Empty(t, savedUsers(t, h.stateDir), "released with the workers")
}

// A warm standby runs as the job's dynamic user, in a socket directory
// nobody else may enter; and were the directory open, the standby would
// still take no message from another user.
func TestDynamicUserStandbySocket(t *testing.T) {
	needRoot(t)
	h := newWarmHarness(t, runAsDynamic)
	h.spare()
	a := h.spareAssign(1, 0)
	h.sup.PrepareStandby(prepareFor(a))
	h.sync()
	sb := h.readyStandby()
	uid, _ := procIDs(t, sb.proc.Pid())
	require.True(t, dynamicRange.contains(uid), "uid %d is a dynamic user's", uid)
	openToAll(t, filepath.Dir(sb.dir))

	const connect = `
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect:", e.strerror)
    sys.exit()
try:
    s.sendall(b'{"argv": ["x.py"], "workers": [], "store": {"addr": "127.0.0.1", "port": 1}}\n')
except OSError:
    pass  # the standby may have answered and closed already
print(s.makefile().readline().strip())
`
	sock := filepath.Join(sb.dir, sb.sock)
	require.Equal(t, "connect: Permission denied\n", asNobody(t, connect, sock), "the directory is the job user's")

	require.NoError(t, os.Chmod(sb.dir, 0o755))
	require.NoError(t, os.Chmod(sock, 0o777))
	require.Equal(t, "error: uid 65534 may not hand this standby its assignment\n", asNobody(t, connect, sock))

	h.sup.Assign(a)
	h.expect("warm", 1, wRunning)
	h.expect("warm", 1, wSucceeded)
	for _, m := range h.readMarkers() {
		require.True(t, strings.HasPrefix(m[strings.Index(m, " ")+1:], fmt.Sprint(uid)+" "), "the workers ran as the standby's user: %s", m)
	}
}

// The next agent adopts the workers with their dynamic user: the job's
// next generation runs as the same uid, and the uid is released once the
// adopted workers and that generation are gone.
func TestDynamicUserKeptAcrossAgentRestart(t *testing.T) {
	needRoot(t)
	h := newSupervisor(t, runAsDynamic, withRestartGrace(time.Minute))
	openToAll(t, h.workdir)
	require.NoError(t, os.Chmod(h.workdir, 0o777))
	openToAll(t, filepath.Dir(h.torchrun))
	h.sup.Assign(h.assignment("train", 1, "hang"))
	h.expect("train", 1, wRunning)
	uid, _ := procIDs(t, h.record("train", 1).PID)
	handOver(t, h, true)
	require.Equal(t, map[string]uint32{"train": uid}, savedUsers(t, h.stateDir), "kept for the next agent")

	next := h.successor()
	require.True(t, next.sup.Running("train"))
	require.Equal(t, map[string]uint32{"train": uid}, savedUsers(t, h.stateDir))
	next.sup.Assign(next.assignment("train", 2, "hang"))
	next.expect("train", 1, wStopped)
	next.expect("train", 2, wRunning)
	again, _ := procIDs(t, next.record("train", 2).PID)
	require.Equal(t, uid, again, "the adopted workers' uid, though their processes may still hold it")
	next.sup.Stop("train", 2, "done")
	next.expect("train", 2, wStopped)
	require.Empty(t, savedUsers(t, h.stateDir))
}
