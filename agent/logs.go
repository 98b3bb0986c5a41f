package agent

import (
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
	if tail := int64(req.GetTailBytes()); tail > 0 {
		if info, err := f.Stat(); err == nil && info.Size() > tail {
			if _, err := f.Seek(info.Size()-tail, io.SeekStart); err != nil {
				return err
			}
		}
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
