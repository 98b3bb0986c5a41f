package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

const (
	logChunkBytes = 32 << 10
	// maxLogTails bounds concurrent log readers per node.
	maxLogTails  = 16
	logPollEvery = 250 * time.Millisecond
)

// logTails serves `rdzvctl logs` requests from the local job log files.
type logTails struct {
	sup *Supervisor
	out chan<- *rdzvv1.ConnectRequest
	log *zap.Logger

	mu     sync.Mutex
	active map[string]context.CancelFunc
}

func newLogTails(sup *Supervisor, out chan<- *rdzvv1.ConnectRequest, log *zap.Logger) *logTails {
	return &logTails{sup: sup, out: out, log: log, active: map[string]context.CancelFunc{}}
}

func (t *logTails) start(ctx context.Context, req *rdzvv1.LogTail) {
	id := req.GetRequestId()
	t.mu.Lock()
	if len(t.active) >= maxLogTails {
		t.mu.Unlock()
		t.send(ctx, &rdzvv1.LogChunk{RequestId: id, Eof: true, Error: "too many concurrent log streams on this node"})
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	t.active[id] = cancel
	t.mu.Unlock()
	go func() {
		defer t.cancel(id)
		if err := t.stream(ctx, req); err != nil && ctx.Err() == nil {
			t.send(ctx, &rdzvv1.LogChunk{RequestId: id, Eof: true, Error: wire.ClipText(err.Error())})
		}
	}()
}

func (t *logTails) cancel(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cancel, ok := t.active[id]; ok {
		cancel()
		delete(t.active, id)
	}
}

func (t *logTails) cancelAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, cancel := range t.active {
		cancel()
		delete(t.active, id)
	}
}

// stream sends the log from the requested offset; with follow it keeps
// sending what is appended until the job's workers are gone from this node
// and everything they wrote has been sent.
func (t *logTails) stream(ctx context.Context, req *rdzvv1.LogTail) error {
	job := req.GetJob()
	if fe := wire.ValidateName("job", job); fe != nil {
		return fe
	}
	if req.GetTailBytes() > wire.MaxLogTailBytes {
		return fmt.Errorf("tail_bytes: at most %d, got %d", wire.MaxLogTailBytes, req.GetTailBytes())
	}
	path, err := t.sup.LogPath(job)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errors.New("no log for this job on this node")
		}
		return err
	}
	defer f.Close()
	if req.GetTailLines() > wire.MaxLogTailLines {
		return fmt.Errorf("tail_lines: at most %d, got %d", wire.MaxLogTailLines, req.GetTailLines())
	}
	start, err := logStart(f, req)
	if err != nil {
		return fmt.Errorf("reading log: %w", err)
	}
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		return err
	}
	buf := make([]byte, logChunkBytes)
	for {
		// Sampled before reading: once the workers are seen gone, one more
		// pass to the end picks up the closing line written before that.
		running := t.sup.Running(job)
		n, err := f.Read(buf)
		if n > 0 {
			if !t.send(ctx, &rdzvv1.LogChunk{RequestId: req.GetRequestId(), Data: append([]byte(nil), buf[:n]...)}) {
				return nil
			}
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if !req.GetFollow() || !running {
			t.send(ctx, &rdzvv1.LogChunk{RequestId: req.GetRequestId(), Eof: true})
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(logPollEvery):
		}
	}
}

func (t *logTails) send(ctx context.Context, c *rdzvv1.LogChunk) bool {
	select {
	case t.out <- &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_LogChunk{LogChunk: c}}:
		return true
	case <-ctx.Done():
		return false
	}
}

// logStart is the offset a request starts reading at: not before the
// current run of the job (output of an earlier job of the same name is
// skipped), not before the generation running at since, and no further
// back than tail_bytes or tail_lines before the end.
func logStart(f *os.File, req *rdzvv1.LogTail) (int64, error) {
	info, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size, start := info.Size(), int64(0)
	if req.GetRunCreatedAt() != nil || req.GetSince() != nil {
		if start, err = markerStart(f, size, req); err != nil {
			return 0, err
		}
	}
	if tail := int64(req.GetTailBytes()); tail > 0 {
		start = max(start, size-tail)
	}
	if n := req.GetTailLines(); n > 0 {
		at, err := lastLines(f, start, size, int(n))
		if err != nil {
			return 0, err
		}
		start = max(start, at)
	}
	return start, nil
}

// markerPrefix begins the line the supervisor writes when a generation
// starts on this node; it carries the start time.
var markerPrefix = []byte("=== rdzv: job ")

// markerTime is the start time in a generation marker line.
func markerTime(line []byte) (time.Time, bool) {
	if !bytes.HasPrefix(line, markerPrefix) {
		return time.Time{}, false
	}
	_, rest, ok := bytes.Cut(line, []byte(" started "))
	if !ok {
		return time.Time{}, false
	}
	stamp, _, _ := bytes.Cut(rest, []byte(" "))
	t, err := time.Parse(time.RFC3339Nano, string(bytes.TrimSuffix(stamp, []byte(":"))))
	return t, err == nil
}

// markerStart scans the generation markers up to size: the current run
// starts at the first generation started at or after run_created_at (none
// yet: at the end), and since at the last generation started at or before
// it.
func markerStart(f *os.File, size int64, req *rdzvv1.LogTail) (int64, error) {
	runStart, sinceStart := int64(0), int64(0)
	created, since := req.GetRunCreatedAt(), req.GetSince()
	if created != nil {
		runStart = size
	}
	r := bufio.NewReaderSize(io.NewSectionReader(f, 0, size), logChunkBytes)
	for off, foundRun := int64(0), false; ; {
		line, err := r.ReadSlice('\n')
		if t, ok := markerTime(line); ok {
			if created != nil && !foundRun && !t.Before(created.AsTime()) {
				runStart, foundRun = off, true
			}
			if since != nil && !t.After(since.AsTime()) {
				sinceStart = off
			}
		}
		off += int64(len(line))
		// A long line: only its start can be a marker; read on.
		for errors.Is(err, bufio.ErrBufferFull) {
			line, err = r.ReadSlice('\n')
			off += int64(len(line))
		}
		if errors.Is(err, io.EOF) {
			return max(runStart, sinceStart), nil
		}
		if err != nil {
			return 0, err
		}
	}
}

// lastLines is the offset of the n-th line from the end of f (a last line
// without its newline counts), not before from.
func lastLines(f *os.File, from, size int64, n int) (int64, error) {
	buf := make([]byte, logChunkBytes)
	end := size
	// A final newline ends the last line rather than starting another.
	newlines := -1
	if size > from {
		if _, err := f.ReadAt(buf[:1], size-1); err != nil {
			return 0, err
		}
		if buf[0] != '\n' {
			newlines = 0
		}
	}
	for end > from {
		chunk := buf[:min(int64(len(buf)), end-from)]
		at := end - int64(len(chunk))
		if _, err := f.ReadAt(chunk, at); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		for i := len(chunk) - 1; i >= 0; i-- {
			if chunk[i] != '\n' {
				continue
			}
			if newlines++; newlines == n {
				return at + int64(i) + 1, nil
			}
		}
		end = at
	}
	return from, nil
}
