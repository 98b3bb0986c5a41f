package agent

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

const (
	// maxReportBytes bounds a report's body; real ones are under 200 bytes.
	maxReportBytes = 4 << 10
	// maxReportHeaderBytes bounds a report's request line and headers,
	// read before its token is checked (net/http allows 4 KiB more).
	maxReportHeaderBytes = 4 << 10
	// reportShutdown bounds how long the endpoint waits for requests in
	// flight once the workers are gone.
	reportShutdown = time.Second
)

var (
	// errNotRunning marks a report for a job or generation other than the
	// one the report token was given to: a stale generation must never move
	// a job's progress or catalog.
	errNotRunning = errors.New("not running on this node")
	// errTokenRefused marks a report without the token of the workers
	// running here. It says nothing of what runs: whoever sent it may be
	// any local user.
	errTokenRefused = errors.New("report token not accepted: only the workers running on this node can report, " +
		"with the token the agent gave them in " + reportTokenEnv)
	// errNoCheckpointDir marks a checkpoint report of a job without a
	// checkpoint.dir, which would leave nothing to check the path against.
	errNoCheckpointDir = errors.New("this job has no checkpoint.dir, and checkpoint reports need one: " +
		"set checkpoint.dir in the job file to the directory the checkpoints are saved under")
)

const (
	// reportTokenEnv is the worker's environment variable holding its
	// generation's report token, sent back as "Authorization: Bearer
	// <token>". /proc/PID/environ is readable only by the workers' own user
	// and root, so no other local user can learn it.
	reportTokenEnv = "RDZV_REPORT_TOKEN"
	// reportTokenBytes is the token's length, hex-encoded in the
	// environment and the header.
	reportTokenBytes = 32
)

// reportServer is the endpoint on 127.0.0.1 where workers report training
// steps and saved checkpoints (the rdzv Python package, python/, is the client). The
// agent runs one for its lifetime; workers find it in RDZV_AGENT_ADDR.
// Any local user can connect, so every report must carry the running
// workers' token. TCP rather than a Unix socket with peer credentials:
// the workers' user is not the job's alone (other jobs, other processes of
// that user), a token tells one generation from the next where a uid
// cannot, and plain HTTP over TCP is what any training script can speak.
type reportServer struct {
	srv *http.Server
}

func newReportServer(sup *Supervisor, requests *prometheus.CounterVec, log *zap.Logger) *reportServer {
	return &reportServer{srv: &http.Server{
		Handler:           countStatus(newReportHandler(sup, log, sup.clock.Now), requests),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		MaxHeaderBytes:    maxReportHeaderBytes,
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

// nonFinite are the spellings a metric that is not a finite number takes
// (JSON has no NaN): a loss gone NaN is what an operator most needs to see.
var nonFinite = map[string]float64{"NaN": math.NaN(), "Infinity": math.Inf(1), "-Infinity": math.Inf(-1)}

// reportRequest is the body of POST /v1/step and POST /v1/checkpoint. Step
// is signed and a pointer so that a negative or missing step is named as
// such rather than read as 0. Phase and Metrics are for /v1/step only.
type reportRequest struct {
	Job        string `json:"job"`
	Generation uint64 `json:"generation"`
	Step       *int64 `json:"step"`
	Path       string `json:"path"`
	// Phase is "" (training steps), "saving" (a checkpoint of step is being
	// saved) or "done" (step was the last).
	Phase   string                     `json:"phase"`
	Metrics map[string]json.RawMessage `json:"metrics"`
	// Rank, Size and Sha256 are for /v1/memory only: the rank's shard of
	// step in the generation's in-memory checkpoint directory.
	Rank   *int64 `json:"rank"`
	Size   *int64 `json:"size"`
	Sha256 string `json:"sha256"`
}

// stepPhases are the phases a step report may announce.
var stepPhases = map[string]rdzvv1.TrainingPhase{
	"":       rdzvv1.TrainingPhase_TRAINING_PHASE_STEPS,
	"saving": rdzvv1.TrainingPhase_TRAINING_PHASE_SAVING,
	"done":   rdzvv1.TrainingPhase_TRAINING_PHASE_DONE,
}

// parseStepExtras reads a step report's phase and metrics.
func parseStepExtras(req reportRequest) (rdzvv1.TrainingPhase, map[string]float64, error) {
	phase, ok := stepPhases[req.Phase]
	if !ok {
		return 0, nil, fmt.Errorf("phase: must be \"saving\", \"done\" or left out, got %s", wire.Quote(req.Phase))
	}
	if err := wire.CheckMetrics("metrics", req.Metrics); err != nil {
		return 0, nil, err
	}
	var metrics map[string]float64
	for _, name := range slices.Sorted(maps.Keys(req.Metrics)) {
		v, err := parseMetric(req.Metrics[name])
		if err != nil {
			return 0, nil, fmt.Errorf("metrics[%s]: %w", wire.Quote(name), err)
		}
		if metrics == nil {
			metrics = make(map[string]float64, len(req.Metrics))
		}
		metrics[name] = v
	}
	return phase, metrics, nil
}

func parseMetric(raw json.RawMessage) (float64, error) {
	var v float64
	if err := json.Unmarshal(raw, &v); err == nil {
		return v, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if v, ok := nonFinite[s]; ok {
			return v, nil
		}
	}
	const show = 32
	got := string(raw)
	if len(got) > show {
		got = got[:show] + "..."
	}
	return 0, fmt.Errorf(`must be a number, "NaN", "Infinity" or "-Infinity", got %s`, got)
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
	mux.HandleFunc("POST /v1/memory", h.memory)
	return mux
}

func (h *reportHandler) step(w http.ResponseWriter, r *http.Request) {
	token, ok := h.authenticate(w, r)
	if !ok {
		return
	}
	req, step, ok := h.decode(w, r)
	if !ok {
		return
	}
	phase, metrics, err := parseStepExtras(req)
	if err != nil {
		h.reject(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := h.sup.reportStep(token, req.Job, req.Generation, step, phase, metrics, h.now()); err != nil {
		h.refuse(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *reportHandler) checkpoint(w http.ResponseWriter, r *http.Request) {
	token, ok := h.authenticate(w, r)
	if !ok {
		return
	}
	req, step, ok := h.decode(w, r)
	if !ok {
		return
	}
	if req.Phase != "" || req.Metrics != nil {
		h.reject(w, http.StatusBadRequest, "phase and metrics belong in a step report (POST /v1/step), not a checkpoint report")
		return
	}
	dir, cred, err := h.sup.checkpointTarget(token, req.Job, req.Generation)
	if err == nil {
		err = checkCheckpointPath(dir, req.Path, cred)
	}
	if err == nil {
		err = h.sup.reportCheckpoint(token, req.Job, req.Generation, step, req.Path, h.now())
	}
	if err != nil {
		h.refuse(w, err)
		return
	}
	h.log.Info("checkpoint reported", zap.String("job", req.Job), zap.Uint64("generation", req.Generation),
		zap.Uint64("step", step), zap.String("path", req.Path))
	w.WriteHeader(http.StatusNoContent)
}

// memory enters an in-memory checkpoint shard the workers wrote
// (memckpt.go).
func (h *reportHandler) memory(w http.ResponseWriter, r *http.Request) {
	token, ok := h.authenticate(w, r)
	if !ok {
		return
	}
	req, step, ok := h.decode(w, r)
	if !ok {
		return
	}
	rank, size, sum, err := parseMemoryReport(req)
	if err == nil {
		err = h.sup.reportMemory(token, req.Job, req.Generation, step, rank, size, sum)
	}
	if err != nil {
		h.refuse(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// parseMemoryReport reads an in-memory shard report's rank, size and
// checksum.
func parseMemoryReport(req reportRequest) (uint32, int64, [sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	switch {
	case req.Phase != "" || req.Metrics != nil || req.Path != "":
		return 0, 0, sum, errors.New("phase, metrics and path do not belong in an in-memory checkpoint report")
	case req.Rank == nil || *req.Rank < 0 || *req.Rank > math.MaxUint32:
		return 0, 0, sum, fmt.Errorf("rank: must be an integer from 0 to %d", uint32(math.MaxUint32))
	case req.Size == nil || *req.Size < 0:
		return 0, 0, sum, errors.New("size: must be the shard's size in bytes")
	}
	b, err := hex.DecodeString(req.Sha256)
	if err != nil || len(b) != sha256.Size {
		return 0, 0, sum, fmt.Errorf("sha256: must be %d hex digits", 2*sha256.Size)
	}
	copy(sum[:], b)
	return uint32(*req.Rank), *req.Size, sum, nil
}

// reportMemory enters rank's shard of step of job's generation gen, whose
// workers hold token.
func (s *Supervisor) reportMemory(token []byte, job string, gen, step uint64, rank uint32, size int64, sum [sha256.Size]byte) error {
	if _, err := s.running(token, job, gen); err != nil {
		return err
	}
	if err := s.mem.reported(job, gen, step, rank, size, sum); err != nil {
		return err
	}
	// A saved step is progress, and what carries the holdings.
	if w, err := s.running(token, job, gen); err == nil {
		w.mu.Lock()
		w.advance(step, s.clock.Now())
		w.mu.Unlock()
	}
	return nil
}

// authenticate reads the report token and checks it is the running
// workers', answering the request itself when not. It comes before the body
// is even read: a request from anyone else gets nowhere.
//
// A refusal closes the connection: otherwise net/http reads up to 256 KiB
// of the unread body after the answer, to keep the connection for a next
// request.
func (h *reportHandler) authenticate(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	token, err := parseReportToken(r.Header.Values("Authorization"))
	if err != nil {
		w.Header().Set("Connection", "close")
		w.Header().Set("WWW-Authenticate", `Bearer realm="rdzv worker reports"`)
		h.reject(w, http.StatusUnauthorized, err.Error())
		return nil, false
	}
	if !h.sup.tokenAccepted(token) {
		w.Header().Set("Connection", "close")
		h.reject(w, http.StatusForbidden, errTokenRefused.Error())
		return nil, false
	}
	return token, true
}

// parseReportToken reads the token from the Authorization header's values:
// exactly one, "Bearer " and the token in hex.
func parseReportToken(values []string) ([]byte, error) {
	switch len(values) {
	case 0:
		return nil, fmt.Errorf("report token missing: send the worker's %s as \"Authorization: Bearer <token>\" (the rdzv Python package does)", reportTokenEnv)
	case 1:
	default:
		return nil, fmt.Errorf("report token malformed: %d Authorization headers, expected one", len(values))
	}
	scheme, hexToken, _ := strings.Cut(values[0], " ")
	token, err := hex.DecodeString(hexToken)
	if !strings.EqualFold(scheme, "Bearer") || err != nil || len(token) != reportTokenBytes {
		return nil, fmt.Errorf("report token malformed: expected \"Authorization: Bearer\" and %d hex digits", 2*reportTokenBytes)
	}
	return token, nil
}

// refuse answers a report the supervisor or the checkpoint check refused.
func (h *reportHandler) refuse(w http.ResponseWriter, err error) {
	status := http.StatusBadRequest
	switch {
	case errors.Is(err, errTokenRefused):
		// The workers were replaced between authentication and the report.
		status = http.StatusForbidden
	case errors.Is(err, errNotRunning):
		status = http.StatusConflict
	}
	h.reject(w, status, err.Error())
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

// checkCheckpointPath accepts an absolute, clean path inside dir, the
// job's checkpoint.dir, to a directory the job's user (cred, nil for the
// agent's own) can read, reached without leaving dir (see beneath.go): the
// path is what the next generation is told to resume from.
func checkCheckpointPath(dir, path string, cred *syscall.Credential) error {
	switch {
	case dir == "":
		return errNoCheckpointDir
	case path == "":
		return errors.New("path is required")
	}
	if fe := wire.CheckPath("path", path, dir); fe != nil {
		return fe
	}
	// Cannot fail: CheckPath found path strictly inside dir.
	rel, _ := filepath.Rel(dir, path)
	return asUser(cred, func() error {
		// checkpoint.dir itself is the job's choice, so its own symlinks are
		// followed, as the job's user.
		base, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return &fs.PathError{Op: "checkpoint.dir", Path: dir, Err: err}
		}
		defer unix.Close(base)
		fd, err := openBeneath(base, rel)
		if err != nil {
			return beneathError(path, err)
		}
		return unix.Close(fd)
	})
}

// tokenAccepted reports whether token is the running workers' report token.
func (s *Supervisor) tokenAccepted(token []byte) bool { return tokenOf(s.view.Load().cur, token) }

// tokenOf reports whether token is w's report token (w nil: none runs).
func tokenOf(w *worker, token []byte) bool {
	// Constant time: how much of a guess matched must not show in how long
	// the answer takes. A worker adopted without a token (started by an
	// agent before tokens) accepts none.
	return w != nil && len(w.token) == reportTokenBytes && subtle.ConstantTimeCompare(token, w.token) == 1
}

// running returns the running worker when token is its report token and
// it is job's generation gen. Neither error names what runs here.
func (s *Supervisor) running(token []byte, job string, gen uint64) (*worker, error) {
	w := s.view.Load().cur
	if !tokenOf(w, token) {
		return nil, errTokenRefused
	}
	if w.job != job || w.generation != gen {
		return nil, fmt.Errorf("job %s generation %d is %w: the report token is another generation's", job, gen, errNotRunning)
	}
	return w, nil
}

// reportStep records that job's generation gen, whose workers hold token,
// reached step at at, in phase, with metrics (nil: none).
func (s *Supervisor) reportStep(token []byte, job string, gen, step uint64, phase rdzvv1.TrainingPhase, metrics map[string]float64, at time.Time) error {
	w, err := s.running(token, job, gen)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.advance(step, at)
	w.enter(phase, step)
	if metrics != nil && (w.metrics == nil || step >= w.metricsStep) {
		w.metrics, w.metricsStep = metrics, step
	}
	return nil
}

// advance keeps the highest step: ranks report independently, and a slower
// rank's older step must not look like the job going backwards. A step
// past the checkpoint being saved ends the save: training went on (after a
// rank's quicker save, or a save that failed and was never completed).
// Callers hold w.mu, as for enter and saved.
func (w *worker) advance(step uint64, at time.Time) {
	if !w.hasStep || step > w.step {
		w.step, w.stepAt, w.hasStep = step, at, true
	}
	switch w.phase {
	case rdzvv1.TrainingPhase_TRAINING_PHASE_UNSPECIFIED:
		w.phase = rdzvv1.TrainingPhase_TRAINING_PHASE_STEPS
	case rdzvv1.TrainingPhase_TRAINING_PHASE_SAVING:
		if step > w.savingStep {
			w.phase = rdzvv1.TrainingPhase_TRAINING_PHASE_STEPS
		}
	}
}

// enter records a phase a report announced at step. Done is final for the
// generation: ranks report it independently, and one rank's last steps or
// saves after another's must not look like training resuming. The ranks
// of a node share one phase, so a save lasts until its checkpoint is
// complete (saved) or a later step is reported, whichever rank says so.
func (w *worker) enter(phase rdzvv1.TrainingPhase, step uint64) {
	switch {
	case w.phase == rdzvv1.TrainingPhase_TRAINING_PHASE_DONE:
	case phase == rdzvv1.TrainingPhase_TRAINING_PHASE_DONE:
		w.phase = phase
	case phase == rdzvv1.TrainingPhase_TRAINING_PHASE_SAVING:
		if w.phase != phase || step > w.savingStep {
			w.savingStep = step
		}
		w.phase = phase
	}
}

// saved ends a save of step or an earlier one: its checkpoint is complete.
func (w *worker) saved(step uint64) {
	if w.phase == rdzvv1.TrainingPhase_TRAINING_PHASE_SAVING && step >= w.savingStep {
		w.phase = rdzvv1.TrainingPhase_TRAINING_PHASE_STEPS
	}
}

// checkpointTarget is the checkpoint directory of job's generation gen and
// the user its workers run as, when that is what runs here under token.
func (s *Supervisor) checkpointTarget(token []byte, job string, gen uint64) (string, *syscall.Credential, error) {
	w, err := s.running(token, job, gen)
	if err != nil {
		return "", nil, err
	}
	return w.checkpointDir, w.cred, nil
}

// reportCheckpoint queues a checkpoint the workers saved. A saved step is
// also progress.
func (s *Supervisor) reportCheckpoint(token []byte, job string, gen, step uint64, path string, at time.Time) error {
	w, err := s.running(token, job, gen)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.advance(step, at)
	w.saved(step)
	w.reported[step] = true
	w.mu.Unlock()
	s.queueCheckpoint(&rdzvv1.CheckpointReport{Job: job, Generation: gen, Step: step, Path: path, Source: sourceHelper}, true)
	return nil
}

// Progress is the newest step the running workers reported, their phase
// and latest metrics, nil before their first report.
func (s *Supervisor) Progress() *rdzvv1.Progress {
	w := s.view.Load().cur
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.hasStep {
		return nil
	}
	// What the node holds of the job's in-memory checkpoints rides along:
	// a save reports its step too (rdzv.checkpoint.save).
	held, _ := s.mem.held(w.job)
	// The map is replaced, never changed in place, so it can be shared.
	p := &rdzvv1.Progress{Job: w.job, Generation: w.generation, Step: w.step, At: timestamppb.New(w.stepAt),
		Phase: w.phase, Metrics: w.metrics, Memory: held}
	// The step's age lets the controller date it (progress waits for the
	// heartbeat): measured on this clock, which dated the step.
	if age := s.clock.Since(w.stepAt); age > 0 {
		p.Age = durationpb.New(age)
	}
	return p
}

// markReported records step as queued for w, and reports whether it was not
// already.
func (w *worker) markReported(step uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.reported[step] {
		return false
	}
	w.reported[step] = true
	return true
}

// unmarkReported forgets a queued step that never left, so the scanner
// offers it again.
func (s *Supervisor) unmarkReported(job string, gen, step uint64) {
	if w := s.view.Load().cur; w != nil && w.job == job && w.generation == gen {
		w.mu.Lock()
		delete(w.reported, step)
		w.mu.Unlock()
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
// last it passed (step, phase or metrics, not the time), so idle or slow
// workers cost the controller nothing.
type progressFilter struct {
	last *rdzvv1.Progress
}

// changed reports whether p should be sent, and if so remembers it as sent.
func (f *progressFilter) changed(p *rdzvv1.Progress) bool {
	if p == nil {
		return false
	}
	if l := f.last; l != nil && l.GetJob() == p.GetJob() && l.GetGeneration() == p.GetGeneration() && l.GetStep() == p.GetStep() &&
		l.GetPhase() == p.GetPhase() && maps.EqualFunc(l.GetMetrics(), p.GetMetrics(), sameMetric) &&
		slices.EqualFunc(l.GetMemory(), p.GetMemory(), func(a, b *rdzvv1.MemoryHeld) bool { return proto.Equal(a, b) }) {
		return false
	}
	f.last = p
	return true
}

// sameMetric is == with NaN equal to itself: a NaN loss is no news at every
// heartbeat.
func sameMetric(a, b float64) bool {
	return a == b || (math.IsNaN(a) && math.IsNaN(b))
}
