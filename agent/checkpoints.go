package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// scanEvery is how often node rank 0 looks for new complete checkpoints
// while its workers run.
const scanEvery = 2 * time.Second

// Checkpoint sources, as in Checkpoint.source.
const (
	sourceHelper = "helper"
	sourceScan   = "scan"
)

// FoundCheckpoint is a complete checkpoint found on disk.
type FoundCheckpoint struct {
	Step uint64
	Path string
}

// ScanCheckpoints lists the complete checkpoints directly under dir: each
// subdirectory whose name ends in a decimal number (the step: step-40,
// checkpoint-1200, global_step300, 40) and that holds at least one of the
// marker files. Names starting with '.' are skipped, as savers build a step
// under such a temporary name before renaming it into place. The scan runs
// as the job's user (cred, nil for the agent's own) and beneath dir (see
// beneath.go): a symlink leading out of dir, or a directory that user
// cannot read, is skipped, so it is never named in the job's events. The
// result is sorted by step.
func ScanCheckpoints(dir string, markers []string, cred *syscall.Credential) ([]FoundCheckpoint, error) {
	var found []FoundCheckpoint
	err := asUser(cred, func() error {
		fd, err := unix.Open(dir, dirFlags, 0)
		if err != nil {
			return &fs.PathError{Op: "open", Path: dir, Err: err}
		}
		d := os.NewFile(uintptr(fd), dir)
		defer d.Close()
		entries, err := d.ReadDir(-1)
		if err != nil {
			return err
		}
		// Name order, so that equal steps keep it below.
		sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
		for _, e := range entries {
			name := e.Name()
			if strings.HasPrefix(name, ".") {
				continue
			}
			step, ok := trailingNumber(name)
			if !ok {
				continue
			}
			// Not a directory, leading out of dir, or unreadable: none is a
			// checkpoint of this job's.
			sub, err := openBeneath(fd, name)
			if err != nil {
				continue
			}
			complete := hasMarker(sub, markers)
			unix.Close(sub)
			if complete {
				found = append(found, FoundCheckpoint{Step: step, Path: filepath.Join(dir, name)})
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing checkpoint directory: %w", err)
	}
	sort.SliceStable(found, func(i, j int) bool { return found[i].Step < found[j].Step })
	return found, nil
}

// trailingNumber parses the decimal digits that end name.
func trailingNumber(name string) (uint64, bool) {
	i := len(name)
	for i > 0 && name[i-1] >= '0' && name[i-1] <= '9' {
		i--
	}
	if i == len(name) {
		return 0, false
	}
	n, err := strconv.ParseUint(name[i:], 10, 64)
	return n, err == nil
}

// hasMarker reports whether the directory dirfd holds one of the markers as
// a regular file; a symlink does not count, wherever it leads.
func hasMarker(dirfd int, markers []string) bool {
	for _, m := range markers {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, m, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
			return true
		}
	}
	return false
}

// scanLoop reports w's complete checkpoints until w.scanStop is closed, then
// scans once more: a checkpoint finished just before the workers died is the
// one the next generation should resume from.
func (s *Supervisor) scanLoop(w *worker, dir string, markers []string) {
	defer close(w.scanDone)
	log := s.log.With(zap.String("job", w.job), zap.Uint64("generation", w.generation), zap.String("checkpoint_dir", dir))
	ticker := s.clock.NewTicker(s.scanEvery)
	defer ticker.Stop()
	var lastErr string
	for {
		found, err := ScanCheckpoints(dir, markers, w.cred)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// The workers may not have created it yet.
			log.Debug("checkpoint directory missing")
		case err != nil:
			if err.Error() != lastErr {
				log.Warn("scanning checkpoints failed", zap.Error(err))
			}
			lastErr = err.Error()
		default:
			lastErr = ""
			s.reportFound(w, found, log)
		}
		select {
		case <-w.scanStop:
			if found, err := ScanCheckpoints(dir, markers, w.cred); err == nil {
				s.reportFound(w, found, log)
			}
			return
		case <-ticker.Chan():
		}
	}
}

// reportFound queues the checkpoints not yet reported in w's generation and
// newer than the one it resumed from.
func (s *Supervisor) reportFound(w *worker, found []FoundCheckpoint, log *zap.Logger) {
	for _, c := range found {
		if w.resumed && c.Step <= w.resumeStep || !w.markReported(c.Step) {
			continue
		}
		r := &rdzvv1.CheckpointReport{Job: w.job, Generation: w.generation, Step: c.Step, Path: c.Path, Source: sourceScan}
		// Unlike a helper report, a found checkpoint is not worth another
		// report's place: it stays on disk and is offered again next scan.
		if !s.queueCheckpoint(r, false) {
			s.unmarkReported(w.job, w.generation, c.Step)
			log.Debug("checkpoint report queue full, retrying next scan", zap.Uint64("step", c.Step))
			return
		}
		log.Info("checkpoint found", zap.Uint64("step", c.Step), zap.String("path", c.Path))
	}
}
