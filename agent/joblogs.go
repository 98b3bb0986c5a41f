package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/wire"
)

// Job logs on a node: logs/<job>.log is the output of the job's current
// run, every generation of it, which `rdzvctl logs` reads. A later run of
// the same job name (the job finished, or was deleted, and was submitted
// again) starts a new file: the old one is renamed logs/<job>.<run>.log
// first, <run> being when that run was submitted, kept in logs/<job>.run.
// Workers write to the file directly (their shim hands the launcher the
// descriptor), so their output survives agent restarts without a process
// copying it; files are therefore capped by pruning whole files that no
// worker writes any more, never by rotating a live one.

// JobLogsConfig bounds the job logs a node keeps.
type JobLogsConfig struct {
	// MaxBytes caps all job logs on the node together: the oldest files of
	// jobs not running here are removed first. The running job's current
	// log is never removed, so a single run can exceed it.
	MaxBytes int64 `json:"max_bytes"`
	// MaxAge removes the log of a job not running here once it has not been
	// written to for this long; as the controller's
	// retention.finished_job_max_age does with the job itself.
	MaxAge wire.Duration `json:"max_age"`
	// PruneInterval is how often logs are pruned, besides when a job's
	// workers end on the node.
	PruneInterval wire.Duration `json:"prune_interval"`
}

// DefaultJobLogs keeps 10 GiB of job logs for 30 days.
func DefaultJobLogs() JobLogsConfig {
	return JobLogsConfig{MaxBytes: 10 << 30, MaxAge: wire.Duration{Duration: 30 * 24 * time.Hour},
		PruneInterval: wire.Duration{Duration: time.Hour}}
}

// Validate names each problem with its field.
func (c JobLogsConfig) Validate(field string) error {
	var errs []error
	if c.MaxBytes < 1<<20 {
		errs = append(errs, wire.Fieldf(field+".max_bytes", "must be at least 1 MiB (%d bytes), got %d", 1<<20, c.MaxBytes))
	}
	if c.MaxAge.Duration < time.Hour {
		errs = append(errs, wire.Fieldf(field+".max_age", "must be at least 1h, got %s", c.MaxAge))
	}
	if c.PruneInterval.Duration < time.Second {
		errs = append(errs, wire.Fieldf(field+".prune_interval", "must be at least 1s, got %s", c.PruneInterval))
	}
	return errors.Join(errs...)
}

// runStamp names a run by when it was submitted.
func runStamp(created time.Time) string { return created.UTC().Format("20060102T150405.000000000Z") }

// startRunLog makes logPath the log of the run submitted at created: when
// it holds an earlier run of the same job name, that is renamed aside
// first. (A controller that does not send when the job was submitted gets
// the old behaviour: every run appends to one file.)
func startRunLog(logPath string, created time.Time) error {
	runFile := strings.TrimSuffix(logPath, ".log") + ".run"
	run := runStamp(created)
	old, err := os.ReadFile(runFile)
	switch {
	case err == nil && string(old) == run:
		return nil
	case err == nil && len(old) > 0:
		aside := strings.TrimSuffix(logPath, ".log") + "." + filepath.Base(string(old)) + ".log"
		if err := os.Rename(logPath, aside); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("setting the previous run's log aside: %w", err)
		}
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("reading the job log's run: %w", err)
	}
	return os.WriteFile(runFile, []byte(run), 0o640)
}

// logFile is one file under logs/.
type logFile struct {
	path string
	job  string
	// current is the job's current run's log or .run file, not an earlier
	// run's log.
	current bool
	size    int64
	mtime   time.Time
}

// pruneLogs removes from dir the job logs (and their .run files) that are
// older than maxAge, then the oldest until all together fit in maxBytes,
// sparing the files of the jobs live says still run here. It returns what
// it removed.
func pruneLogs(dir string, live func(job string) bool, maxBytes int64, maxAge time.Duration, now time.Time) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var files []logFile
	var total int64
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || (!strings.HasSuffix(name, ".log") && !strings.HasSuffix(name, ".run")) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		job, rest, _ := strings.Cut(name, ".") // job names have no dots
		files = append(files, logFile{path: filepath.Join(dir, name), job: job, current: rest == "log" || rest == "run", size: info.Size(), mtime: info.ModTime()})
		total += info.Size()
	}
	slices.SortFunc(files, func(a, b logFile) int { return a.mtime.Compare(b.mtime) })
	var removed []string
	gone := map[string]bool{}
	for _, f := range files {
		if gone[f.path] {
			continue
		}
		if (f.current && live(f.job)) || (now.Sub(f.mtime) < maxAge && total <= maxBytes) {
			continue
		}
		// A run's .run file goes with its current log, not before.
		if strings.HasSuffix(f.path, ".run") {
			if _, err := os.Stat(strings.TrimSuffix(f.path, ".run") + ".log"); err == nil {
				continue
			}
		}
		if err := os.Remove(f.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return removed, err
		}
		total -= f.size
		removed = append(removed, f.path)
		if run := strings.TrimSuffix(f.path, ".log") + ".run"; f.current && strings.HasSuffix(f.path, ".log") {
			if err := os.Remove(run); err == nil {
				removed, gone[run] = append(removed, run), true
			}
		}
	}
	return removed, nil
}

// pruneJobLogs prunes the node's job logs by the agent's job_logs limits.
// A Supervisor built without them (zero, as Validate never lets a config
// be) prunes nothing.
func (s *Supervisor) pruneJobLogs() {
	if s.jobLogs.MaxBytes <= 0 {
		return
	}
	removed, err := pruneLogs(filepath.Join(s.stateDir, "logs"), s.Running, s.jobLogs.MaxBytes, s.jobLogs.MaxAge.Duration, s.clock.Now())
	if err != nil {
		s.log.Warn("pruning job logs failed", zap.Error(err))
	}
	if len(removed) > 0 {
		s.log.Info("pruned job logs", zap.Strings("files", removed))
	}
}
