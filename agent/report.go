package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

const (
	// maxReportBytes bounds a report's body; real ones are under 200 bytes.
	maxReportBytes = 4 << 10
	// reportShutdown bounds how long the endpoint waits for requests in
	// flight once the workers are gone.
	reportShutdown = time.Second
)

// errNotRunning marks a report from workers other than those running here:
// a stale generation must never move a job's progress or catalog.
var errNotRunning = errors.New("not running on this node")

// reportServer is the endpoint on 127.0.0.1 where workers report training
// steps and saved checkpoints (examples/rdzv_report.py is the client). The
// agent runs one for its lifetime; workers find it in RDZV_AGENT_ADDR.
type reportServer struct {
	srv *http.Server
}

func newReportServer(sup *Supervisor, log *zap.Logger) *reportServer {
	return &reportServer{srv: &http.Server{
		Handler:           newReportHandler(sup, log, time.Now),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		ErrorLog:          zap.NewStdLog(log),
	}}
}

// serve answers on ln until shutdown.
func (r *reportServer) serve(ln net.Listener) error {
	if err := r.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving worker reports: %w", err)
	}
	return nil
}

func (r *reportServer) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), reportShutdown)
	defer cancel()
	if err := r.srv.Shutdown(ctx); err != nil {
		_ = r.srv.Close()
	}
}

// reportRequest is the body of POST /v1/step and POST /v1/checkpoint. Step
// is signed and a pointer so that a negative or missing step is named as
// such rather than read as 0.
type reportRequest struct {
	Job        string `json:"job"`
	Generation uint64 `json:"generation"`
	Step       *int64 `json:"step"`
	Path       string `json:"path"`
}

type reportHandler struct {
	sup *Supervisor
	log *zap.Logger
	now func() time.Time
}

func newReportHandler(sup *Supervisor, log *zap.Logger, now func() time.Time) http.Handler {
	h := &reportHandler{sup: sup, log: log, now: now}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/step", h.step)
	mux.HandleFunc("POST /v1/checkpoint", h.checkpoint)
	return mux
}

func (h *reportHandler) step(w http.ResponseWriter, r *http.Request) {
	req, step, ok := h.decode(w, r)
	if !ok {
		return
	}
	if err := h.sup.reportStep(req.Job, req.Generation, step, h.now()); err != nil {
		h.reject(w, http.StatusConflict, err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *reportHandler) checkpoint(w http.ResponseWriter, r *http.Request) {
	req, step, ok := h.decode(w, r)
	if !ok {
		return
	}
	dir, err := h.sup.checkpointDir(req.Job, req.Generation)
	if err != nil {
		h.reject(w, http.StatusConflict, err.Error())
		return
	}
	if err := checkCheckpointPath(dir, req.Path); err != nil {
		h.reject(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := h.sup.reportCheckpoint(req.Job, req.Generation, step, req.Path, h.now()); err != nil {
		h.reject(w, http.StatusConflict, err.Error())
		return
	}
	h.log.Info("checkpoint reported", zap.String("job", req.Job), zap.Uint64("generation", req.Generation),
		zap.Uint64("step", step), zap.String("path", req.Path))
	w.WriteHeader(http.StatusNoContent)
}

// decode reads a report, answering the request itself when it is malformed.
func (h *reportHandler) decode(w http.ResponseWriter, r *http.Request) (reportRequest, uint64, bool) {
	var req reportRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxReportBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			h.reject(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("report body exceeds %d bytes", maxReportBytes))
		} else {
			h.reject(w, http.StatusBadRequest, fmt.Sprintf("reading report: %v", err))
		}
		return req, 0, false
	}
	if err := json.Unmarshal(body, &req); err != nil {
		h.reject(w, http.StatusBadRequest, fmt.Sprintf("report is not valid JSON: %v", err))
		return req, 0, false
	}
	if fe := wire.ValidateName("job", req.Job); fe != nil {
		h.reject(w, http.StatusBadRequest, fe.Error())
		return req, 0, false
	}
	switch {
	case req.Step == nil:
		h.reject(w, http.StatusBadRequest, "step is required")
		return req, 0, false
	case *req.Step < 0:
		h.reject(w, http.StatusBadRequest, fmt.Sprintf("step must be at least 0, got %d", *req.Step))
		return req, 0, false
	}
	return req, uint64(*req.Step), true
}

func (h *reportHandler) reject(w http.ResponseWriter, status int, reason string) {
	// Debug only: a misbehaving script would otherwise flood the agent's log
	// once per training step; the script sees the reason in the response.
	h.log.Debug("report rejected", zap.Int("status", status), zap.String("reason", reason))
	http.Error(w, reason, status)
}

// checkCheckpointPath accepts an absolute, clean path to an existing
// directory, inside dir when the job has one: the path is what the next
// generation is told to resume from.
func checkCheckpointPath(dir, path string) error {
	if path == "" {
		return errors.New("path is required")
	}
	if fe := wire.CheckPath("path", path, dir); fe != nil {
		return fe
	}
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("checkpoint path: %w", err)
	}
	if !info.IsDir() {
		return fmt.Errorf("path %q is not a directory", path)
	}
	return nil
}

// runningLocked returns the running worker when it is job's generation gen.
func (s *Supervisor) runningLocked(job string, gen uint64) (*worker, error) {
	w := s.cur
	switch {
	case w == nil:
		return nil, fmt.Errorf("job %s generation %d is %w: no workers run here", job, gen, errNotRunning)
	case w.job != job || w.generation != gen:
		return nil, fmt.Errorf("job %s generation %d is %w, which runs job %s generation %d", job, gen, errNotRunning, w.job, w.generation)
	}
	return w, nil
}

// reportStep records that job's generation gen reached step at at.
func (s *Supervisor) reportStep(job string, gen, step uint64, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, err := s.runningLocked(job, gen)
	if err != nil {
		return err
	}
	w.advance(step, at)
	return nil
}

// advance keeps the highest step: ranks report independently, and a slower
// rank's older step must not look like the job going backwards.
func (w *worker) advance(step uint64, at time.Time) {
	if !w.hasStep || step > w.step {
		w.step, w.stepAt, w.hasStep = step, at, true
	}
}

// checkpointDir is the checkpoint directory of job's generation gen, when
// that is what runs here.
func (s *Supervisor) checkpointDir(job string, gen uint64) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, err := s.runningLocked(job, gen)
	if err != nil {
		return "", err
	}
	return w.checkpointDir, nil
}

// reportCheckpoint queues a checkpoint the workers saved. A saved step is
// also progress.
func (s *Supervisor) reportCheckpoint(job string, gen, step uint64, path string, at time.Time) error {
	s.mu.Lock()
	w, err := s.runningLocked(job, gen)
	if err == nil {
		w.advance(step, at)
		w.reported[step] = true
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.queueCheckpoint(&rdzvv1.CheckpointReport{Job: job, Generation: gen, Step: step, Path: path, Source: sourceHelper}, true)
	return nil
}

// Progress is the newest step the running workers reported, nil before
// their first report.
func (s *Supervisor) Progress() *rdzvv1.Progress {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.cur
	if w == nil || !w.hasStep {
		return nil
	}
	return &rdzvv1.Progress{Job: w.job, Generation: w.generation, Step: w.step, At: timestamppb.New(w.stepAt)}
}

// markReported records step as queued for w, and reports whether it was not
// already.
func (s *Supervisor) markReported(w *worker, step uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.reported[step] {
		return false
	}
	w.reported[step] = true
	return true
}

// unmarkReported forgets a queued step that never left, so the scanner
// offers it again.
func (s *Supervisor) unmarkReported(job string, gen, step uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.cur; w != nil && w.job == job && w.generation == gen {
		delete(w.reported, step)
	}
}

// queueCheckpoint queues r without blocking and reports whether it was
// queued. With dropOldest a full queue gives up its oldest report for r:
// the oldest is the least useful to resume from, and when it is on disk
// with its marker the scanner finds it again.
func (s *Supervisor) queueCheckpoint(r *rdzvv1.CheckpointReport, dropOldest bool) bool {
	for {
		select {
		case s.checkpoints <- r:
			return true
		default:
		}
		if !dropOldest {
			return false
		}
		select {
		case old := <-s.checkpoints:
			s.unmarkReported(old.GetJob(), old.GetGeneration(), old.GetStep())
			s.log.Warn("checkpoint report queue full, dropping the oldest", zap.String("job", old.GetJob()),
				zap.Uint64("generation", old.GetGeneration()), zap.Uint64("step", old.GetStep()), zap.String("path", old.GetPath()))
		default:
		}
	}
}

// progressFilter passes a worker's progress on only when it differs from the
// last it passed, so idle or slow workers cost the controller nothing.
type progressFilter struct {
	last *rdzvv1.Progress
}

// changed reports whether p should be sent, and if so remembers it as sent.
func (f *progressFilter) changed(p *rdzvv1.Progress) bool {
	if p == nil {
		return false
	}
	if l := f.last; l != nil && l.GetJob() == p.GetJob() && l.GetGeneration() == p.GetGeneration() && l.GetStep() == p.GetStep() {
		return false
	}
	f.last = p
	return true
}
