package agent

import (
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/wire"
)

// A later run of a job name starts its own log; the earlier run's is set
// aside under its submission time, and generations of one run share a
// file.
func TestStartRunLog(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "train.log")
	run1 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	run2 := run1.Add(time.Hour)

	require.NoError(t, startRunLog(log, run1))
	require.NoError(t, os.WriteFile(log, []byte("run 1 generation 1\n"), 0o640))
	require.NoError(t, startRunLog(log, run1), "generation 2 of the same run")
	appendLog(log, "run 1 generation 2\n")
	require.NoError(t, startRunLog(log, run2))
	_, err := os.Stat(log)
	require.ErrorIs(t, err, os.ErrNotExist, "the new run starts a new file")
	old, err := os.ReadFile(filepath.Join(dir, "train.20261123T100000.000000000Z.log"))
	require.NoError(t, err)
	require.Equal(t, "run 1 generation 1\nrun 1 generation 2\n", string(old))
	run, err := os.ReadFile(filepath.Join(dir, "train.run"))
	require.NoError(t, err)
	require.Equal(t, runStamp(run2), string(run))
}

func TestPruneLogs(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	// name, size, age
	type file struct {
		name string
		size int
		age  time.Duration
	}
	tests := []struct {
		name     string
		files    []file
		live     string
		maxBytes int64
		maxAge   time.Duration
		removed  []string
	}{
		{"within limits", []file{{"a.log", 10, time.Hour}, {"a.run", 1, time.Hour}, {"b.log", 10, 2 * time.Hour}}, "", 100, 24 * time.Hour, nil},
		{"too old, with its run file", []file{{"a.log", 10, 48 * time.Hour}, {"a.run", 1, 49 * time.Hour}, {"b.log", 10, time.Hour}}, "", 100, 24 * time.Hour,
			[]string{"a.log", "a.run"}},
		{"over the cap: oldest first", []file{{"a.log", 40, 3 * time.Hour}, {"b.log", 40, 2 * time.Hour}, {"c.log", 40, time.Hour}}, "", 100, 24 * time.Hour,
			[]string{"a.log"}},
		{"earlier runs go before current ones", []file{{"a.20261101T000000.000000000Z.log", 40, 5 * time.Hour}, {"a.log", 40, 6 * time.Hour}, {"b.log", 40, time.Hour}}, "", 100, 24 * time.Hour,
			[]string{"a.log"}},
		{"the running job's current log stays, over any limit", []file{{"a.log", 500, 48 * time.Hour}, {"a.run", 1, 48 * time.Hour}, {"a.20261101T000000.000000000Z.log", 10, 47 * time.Hour}, {"b.log", 10, time.Hour}}, "a", 100, 24 * time.Hour,
			[]string{"a.20261101T000000.000000000Z.log", "b.log"}},
		{"other files are not job logs", []file{{"notes.txt", 500, 48 * time.Hour}}, "", 100, 24 * time.Hour, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tt.files {
				p := filepath.Join(dir, f.name)
				require.NoError(t, os.WriteFile(p, make([]byte, f.size), 0o640))
				require.NoError(t, os.Chtimes(p, now.Add(-f.age), now.Add(-f.age)))
			}
			removed, err := pruneLogs(dir, func(job string) bool { return job == tt.live }, tt.maxBytes, tt.maxAge, now)
			require.NoError(t, err)
			var names []string
			for _, p := range removed {
				names = append(names, filepath.Base(p))
			}
			sort.Strings(names)
			require.Equal(t, tt.removed, names)
			for _, n := range names {
				require.NoFileExists(t, filepath.Join(dir, n))
			}
		})
	}
}

func TestJobLogsConfigValidate(t *testing.T) {
	require.NoError(t, DefaultJobLogs().Validate("job_logs"))
	bad := JobLogsConfig{MaxBytes: 10, MaxAge: wire.Duration{Duration: time.Minute}}
	err := bad.Validate("job_logs")
	require.ErrorContains(t, err, "job_logs.max_bytes: must be at least 1 MiB (1048576 bytes), got 10")
	require.ErrorContains(t, err, "job_logs.max_age: must be at least 1h, got 1m0s")
	require.ErrorContains(t, err, "job_logs.prune_interval: must be at least 1s, got 0s")
}

// A job name submitted again never appends to its earlier run's log on the
// node: `rdzvctl logs` shows the new run only.
func TestSupervisorReusedJobNameStartsANewLog(t *testing.T) {
	h := newSupervisor(t)
	first := h.assignment("train", 1, "ok")
	first.JobCreatedAt = timestamppb.New(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
	h.sup.Assign(first)
	h.expect("train", 1, wRunning)
	h.expect("train", 1, wSucceeded)
	second := h.assignment("train", 2, "ok")
	second.JobCreatedAt = timestamppb.New(time.Date(2026, 11, 23, 11, 0, 0, 0, time.UTC))
	h.sup.Assign(second)
	h.expect("train", 2, wRunning)
	h.expect("train", 2, wSucceeded)

	p, err := h.sup.LogPath("train")
	require.NoError(t, err)
	current, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Contains(t, string(current), "job train generation 2 ")
	require.NotContains(t, string(current), "job train generation 1 ")
	earlier, err := os.ReadFile(filepath.Join(filepath.Dir(p), "train.20261123T100000.000000000Z.log"))
	require.NoError(t, err)
	require.Contains(t, string(earlier), "job train generation 1 ")
}
