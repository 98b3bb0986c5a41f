package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

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
