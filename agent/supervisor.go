package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/agent/torchprobe"
	"github.com/rdzv/rdzv/health"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

const (
	// HistorySize bounds the finished-worker statuses kept for re-reporting
	// after a reconnect (exported for test/sim, whose simulated agents
	// re-report as many).
	HistorySize = 16
	// checkpointQueueSize bounds the checkpoint reports waiting for the
	// controller while the agent is disconnected.
	checkpointQueueSize = 64
)

// Supervisor runs at most one job's workers on this node. Commands are
// applied in the order the controller sent them, on one goroutine, so a stop
// of generation N is always applied before the start of N+1.
//
// Ownership: the worker state (cur, ending, lastGen, history, standby,
// standbySeq, and each worker's stopReason) is owned by the run goroutine,
// the one in Run (and, before Run starts, Adopt's caller): only it reads or
// writes them, so none needs a lock. A worker's watch goroutine writes
// nothing of the Supervisor's: it closes the worker's exited channel, and
// the run goroutine handles the exit (ended). Other goroutines (the
// session's heartbeat and registration, the report endpoint, the
// checkpoint scanner) read the immutable snapshot the run goroutine
// publishes (view) after every change; what they write, a worker's
// progress, is guarded by that worker's own lock.
type Supervisor struct {
	// mem holds the node's in-memory checkpoints (memckpt.go).
	mem *memStore
	// exits counts workers' ends by cause (metrics); nil counts nothing.
	exits      *prometheus.CounterVec
	stateDir   string
	secretsDir string
	runAs      string
	allowRoot  bool
	policy     RunAsPolicy
	// dynUsers gives jobs without run_as their users; nil when the
	// agent's run_as names one.
	dynUsers *dynamicUsers
	// workerPath is PATH in the workers' environment.
	workerPath string
	// standbyFloor is the config's standby_min_available_bytes; meminfo
	// reads /proc/meminfo (a test's own in tests).
	standbyFloor uint64
	meminfo      func() ([]byte, error)
	stopGrace    time.Duration
	// restartGrace is how long workers are left running for the next agent
	// when this one stops; 0 stops them with the agent.
	restartGrace time.Duration
	node         string
	iface        string
	reportAddr   string
	scanEvery    time.Duration
	log          *zap.Logger
	spawner      Spawner
	// standbyNice is the nice value standbys start at (ProcessSpec.Nice):
	// standbyNice when this agent may raise it at the hand-off, else 0.
	standbyNice int

	cmds        chan func()
	updates     chan *rdzvv1.WorkerStatus
	checkpoints chan *rdzvv1.CheckpointReport

	// orphanTimeout (nanoseconds) is how long a new worker outlives an agent
	// that vanished without a word; the session keeps it below the
	// controller's heartbeat timeout.
	orphanTimeout atomic.Int64
	// announce tells the controller the workers are left running for hold;
	// false if it could not.
	announce func(hold time.Duration) bool
	// gate runs the node health checks right before workers start; an
	// error keeps them from starting.
	gate func(ctx context.Context) error

	// jobLogs bounds the job logs kept on the node (joblogs.go).
	jobLogs JobLogsConfig

	// clock is every wait and timestamp of the supervisor's: standbys'
	// lingering and expiry, log pruning, checkpoint scans, report times.
	// Tests replace it before the command that is to read it.
	clock clockwork.Clock

	// Owned by the run goroutine (see the type's comment).
	//
	// standbySeq numbers warm standbys. It starts at the clock, not at 0,
	// so that no standby takes the name, and so the shim directory, of one
	// a previous agent left running for an adopted generation.
	standbySeq uint64
	cur        *worker
	// ending is the worker whose exit is being handled: no longer cur,
	// its status not yet in history. Statuses reports it running.
	ending  *worker
	lastGen map[string]uint64
	history []*rdzvv1.WorkerStatus
	// standby is the warm standby (warm.go) for the next generation.
	standby *standby

	// view is what the run goroutine last published for the others.
	view atomic.Pointer[supView]

	// torch is what the node's torch says of its torchrun (torch.go).
	torch *torchprobe.Cache
}

// supView is a snapshot of the run goroutine's state for other goroutines;
// never changed once published.
type supView struct {
	cur, ending *worker
	history     []*rdzvv1.WorkerStatus
	standby     *standby
	// spare is set when standby is kept as an idle spare's (its until is
	// set).
	spare bool
}

// worker is one generation's workers on this node. Its fields from job to
// resumeStep are set before it is published and never change; the rest
// say who owns them.
type worker struct {
	job           string
	generation    uint64
	checkpointDir string
	// token is what the workers authenticate their reports with; cred is
	// the user they run as (nil: the agent's), whose view of the
	// filesystem their checkpoint paths are checked with.
	token   []byte
	cred    *syscall.Credential
	proc    Process
	logPath string
	// preflight is set when the round smoke test runs before the launcher.
	preflight bool
	// releaseUser gives back the workers' hold on their dynamic user once
	// they have exited (a no-op for a named user).
	releaseUser func()
	// scanStop and scanDone are set when this node scans checkpointDir.
	scanStop chan struct{}
	scanDone chan struct{}
	// resumed is set when the generation resumes from a durable checkpoint
	// of step resumeStep: the controller records none as old, so the scan
	// does not report those (a directory may keep every checkpoint).
	resumed    bool
	resumeStep uint64

	// exited is closed by the watch goroutine once the workers have exited
	// and been swept; exit, which it writes, is read only after that.
	exited chan struct{}
	exit   workerExit

	// stopReason is owned by the run goroutine.
	stopReason string
	// handedOver is set by the run goroutine before the workers are left
	// to the next agent, and read by the watch goroutine once they are.
	handedOver atomic.Bool

	// mu guards the progress the workers reported, from step on: the
	// report endpoint writes it, the heartbeat and the scanner read it.
	mu sync.Mutex
	// step is the highest step the workers reported, at stepAt.
	step    uint64
	stepAt  time.Time
	hasStep bool
	// phase is what the workers said they are doing (see report.go);
	// savingStep is the checkpoint's step while phase is saving.
	phase      rdzvv1.TrainingPhase
	savingStep uint64
	// metrics are the latest a report carried, with step metricsStep.
	metrics     map[string]float64
	metricsStep uint64
	// reported holds the checkpoint steps queued in this generation.
	reported map[uint64]bool
}

// NewSupervisor builds a supervisor for node, whose workers use iface for
// NCCL and Gloo and report to the endpoint at reportAddr.
func NewSupervisor(cfg Config, node, iface, reportAddr string, spawner Spawner, log *zap.Logger) *Supervisor {
	s := &Supervisor{
		stateDir: cfg.StateDir, secretsDir: cfg.SecretsDir, runAs: cfg.RunAs, allowRoot: cfg.AllowRoot, policy: cfg.RunAsPolicy, workerPath: cfg.WorkerPath, stopGrace: cfg.StopGrace.Duration,
		restartGrace: cfg.RestartGrace.Duration, node: node, iface: iface,
		reportAddr: reportAddr, scanEvery: scanEvery, log: log, spawner: spawner, jobLogs: cfg.JobLogs,
		cmds:         make(chan func(), 64),
		updates:      make(chan *rdzvv1.WorkerStatus, 64),
		checkpoints:  make(chan *rdzvv1.CheckpointReport, checkpointQueueSize),
		lastGen:      map[string]uint64{},
		clock:        clockwork.NewRealClock(),
		torch:        torchprobe.NewCache(torchprobe.Run, filepath.Join(cfg.StateDir, torchProbeDir)),
		standbyFloor: cfg.StandbyMinAvailableBytes,
		meminfo:      func() ([]byte, error) { return os.ReadFile("/proc/meminfo") },
	}
	s.standbySeq = uint64(s.clock.Now().UnixNano())
	if canRaisePriority() {
		s.standbyNice = standbyNice
	}
	s.mem = newMemStore(cfg.MemoryCheckpointDir, node, log.Named("memckpt"))
	if cfg.RunAs == "" {
		s.dynUsers = newDynamicUsers(cfg.DynamicUsers, cfg.StateDir, log.Named("dynamic_users"))
	}
	s.SetOrphanTimeout(health.Unregistered.OrphanTimeout())
	s.publish()
	return s
}

// publish makes the run goroutine's state as it is now the one other
// goroutines see; it is called after every change to it.
func (s *Supervisor) publish() {
	s.view.Store(&supView{cur: s.cur, ending: s.ending, history: slices.Clone(s.history), standby: s.standby,
		spare: s.standby != nil && !s.standby.until.IsZero()})
}

// SetOrphanTimeout sets how long workers started from now on outlive an
// agent that vanished without a word.
func (s *Supervisor) SetOrphanTimeout(d time.Duration) { s.orphanTimeout.Store(int64(d)) }

// SetHealthGate makes every start wait for gate (the node health checks),
// and fail with its error instead of starting; call it before Run.
func (s *Supervisor) SetHealthGate(gate func(ctx context.Context) error) { s.gate = gate }

// Updates delivers every worker status change. The supervisor never blocks
// on it: when the reader is away, Statuses still has the latest state.
func (s *Supervisor) Updates() <-chan *rdzvv1.WorkerStatus { return s.updates }

// Checkpoints delivers complete checkpoints reported by the workers or found
// on disk, for the controller's catalog.
func (s *Supervisor) Checkpoints() <-chan *rdzvv1.CheckpointReport { return s.checkpoints }

// Run applies commands and handles the workers' exits until ctx ends,
// then stops any running worker. Its goroutine is the run goroutine, the
// owner of the worker state.
func (s *Supervisor) Run(ctx context.Context) error {
	s.pruneJobLogs()
	var prune <-chan time.Time
	if every := s.jobLogs.PruneInterval.Duration; every > 0 {
		t := s.clock.NewTicker(every)
		defer t.Stop()
		prune = t.Chan()
	}
	for {
		var exited <-chan struct{}
		if s.cur != nil {
			exited = s.cur.exited
		}
		select {
		case cmd := <-s.cmds:
			cmd()
		case <-exited:
			s.ended(s.cur)
		case <-prune:
			s.pruneJobLogs()
		case <-ctx.Done():
			s.shutdown()
			return nil
		}
	}
}

// shutdown leaves the running worker to its shim for restartGrace, so that
// restarting or upgrading the agent does not disturb training; without a
// grace, or a worker that cannot be left, it stops the worker.
func (s *Supervisor) shutdown() {
	// A standby has nothing to hand over: the next agent starts its own.
	s.dropStandby("")
	w := s.cur
	if w != nil {
		select {
		case <-w.exited:
			// Ended before the agent did: the exit is this agent's to
			// report, and nothing is left to hand over.
			s.ended(w)
			return
		default:
		}
	}
	if w == nil || s.restartGrace <= 0 || !s.spawner.HandsOver() {
		s.stopCurrent("agent shutting down")
		return
	}
	// The controller is told first: it then waits at least as long as the
	// shim does. Untold, it goes by heartbeats, and so must the shim.
	hold := s.restartGrace
	if s.announce == nil || !s.announce(hold) {
		s.log.Warn("could not tell the controller; workers run on only for the orphan timeout")
		hold = 0
	}
	w.handedOver.Store(true)
	if err := w.proc.Detach(hold); err != nil {
		// Its shim goes by the orphan timeout then, which is safe either way.
		s.log.Error("handing workers over failed", zap.String("job", w.job), zap.Error(err))
		return
	}
	// Detach ends Wait, and so the watch goroutine. Workers that exited
	// before they were marked handed over were watched as this agent's:
	// their exit is reported here.
	<-w.exited
	if !w.exit.handedOver {
		s.ended(w)
		return
	}
	s.log.Info("workers left running for the next agent", zap.String("job", w.job), zap.Uint64("generation", w.generation),
		zap.Duration("restart_grace", s.restartGrace))
}

// OnHandover sets how the controller is told that workers are left running.
func (s *Supervisor) OnHandover(announce func(hold time.Duration) bool) { s.announce = announce }

// Adopt takes over the workers a previous agent on this node left running,
// before the first registration reports them. It is called before Run,
// on what becomes the run goroutine's state. Only one job runs on a node;
// should several be found, the newest generation is kept. For a warm job
// still running, the next standby is started, as after any start: the
// previous agent killed its own when it stopped. What the previous agent
// left in shared memory goes too, but the kept job's (memStore.sweep).
func (s *Supervisor) Adopt(found []Adopted) {
	// warm is the kept generation's assignment if it runs on under a warm
	// standby.
	var (
		warm *rdzvv1.Assignment
		// adopted is the last generation supervised, the one kept, if its
		// workers may still run (a dead shim's are gone: nothing keeps
		// their shards).
		adopted     *rdzvv1.Assignment
		adoptedCred *syscall.Credential
	)
	for _, f := range found {
		a := &rdzvv1.Assignment{}
		if err := proto.Unmarshal(f.Meta, a); err != nil || a.GetSpec().GetName() == "" {
			s.log.Error("killing a worker whose assignment is unreadable", zap.Int("pid", f.Proc.Pid()), zap.Error(err))
			_ = f.Proc.Kill(0)
			continue
		}
		job, gen := a.GetSpec().GetName(), a.GetGeneration()
		if cur := s.cur; cur != nil && cur.generation >= gen {
			s.log.Warn("killing an adopted worker of an older generation", zap.String("job", job), zap.Uint64("generation", gen))
			_ = f.Proc.Kill(0)
			continue
		}
		if s.cur != nil {
			s.kill(fmt.Sprintf("replaced by adopted generation %d of job %s", gen, job), 0)
		}
		s.lastGen[job] = max(s.lastGen[job], gen)
		logPath, err := s.LogPath(job)
		if err != nil {
			s.log.Error("killing an adopted worker of a job with an unusable name", zap.String("job", job), zap.Error(err))
			_ = f.Proc.Kill(0)
			continue
		}
		if len(f.ReportToken) != reportTokenBytes {
			s.log.Warn("adopted workers have no report token, their reports are refused until the next generation",
				zap.String("job", job), zap.Uint64("generation", gen))
		}
		w := newWorker(a, f.Proc, logPath, f.ReportToken, f.Credential)
		if s.dynUsers != nil && f.Credential != nil {
			w.releaseUser = s.dynUsers.adopt(job, f.Credential.Uid)
		}
		s.log.Info("adopted running workers", zap.String("job", job), zap.Uint64("generation", gen), zap.Int("pid", f.Proc.Pid()))
		// Not announced as started: the registration reports it running,
		// and it may well have ended while no agent was here.
		s.supervise(w, a, false)
		adopted, adoptedCred = nil, nil
		if f.Live {
			adopted, adoptedCred = a, f.Credential
		}
		warm = nil
		if f.Live && jobspec.FromProto(a.GetSpec()).Launcher.Kind == jobspec.KindWarm {
			warm = a
		}
	}
	if s.dynUsers != nil {
		s.dynUsers.prune()
	}
	// The kept generation is the only one left (one job runs on a node).
	keep := ""
	if adopted != nil {
		keep = adopted.GetSpec().GetName()
		s.mem.adopt(adopted, adoptedCred)
	}
	s.mem.sweep(keep)
	if warm != nil {
		s.keepStandby(s.spawnStandby(warm))
	}
}

// Assign queues an assignment.
func (s *Supervisor) Assign(a *rdzvv1.Assignment) {
	s.cmds <- func() { s.assign(a) }
}

// Stop queues stopping a job's workers of one generation, within the
// configured stop_grace.
func (s *Supervisor) Stop(job string, generation uint64, reason string) {
	s.Ordered(&rdzvv1.StopWorkers{Job: job, Generation: generation, Reason: reason})
}

// Ordered carries out the controller's stop order: Stop, with at most the
// order's grace between SIGTERM and SIGKILL, if it gives one (never more
// than the configured stop_grace). For a job that runs no further
// generation (job_ended), what is kept for the next one, its warm
// standby, goes too, at once rather than after standbyLinger.
func (s *Supervisor) Ordered(stop *rdzvv1.StopWorkers) {
	grace := s.stopGrace
	if g := stop.GetGrace(); g != nil {
		grace = min(g.AsDuration(), s.stopGrace)
	}
	job, generation, reason, ended := stop.GetJob(), stop.GetGeneration(), stop.GetReason(), stop.GetJobEnded()
	s.cmds <- func() {
		s.stop(job, generation, reason, grace)
		if ended {
			s.dropIdleStandby(job, generation)
			s.mem.drop(job)
		}
	}
}

// Busy reports whether any workers run here.
func (s *Supervisor) Busy() bool { return s.view.Load().cur != nil }

// Fence queues killing whatever runs, whichever job it belongs to, at once
// (no SIGTERM grace: a fenced worker must not get to write a checkpoint on
// its way out); done is called once that is over.
func (s *Supervisor) Fence(reason string, done func()) {
	s.cmds <- func() {
		defer done()
		s.kill(reason, 0)
		s.dropStandby("")
	}
}

// Statuses is what this node runs and recently ran, for registration.
func (s *Supervisor) Statuses() []*rdzvv1.WorkerStatus {
	v := s.view.Load()
	out := slices.Clone(v.history)
	// A worker whose exit is being handled still counts as running: left
	// out of a registration, its node would be taken for one whose
	// agent lost its workers ("agent reconnected without its workers"),
	// failing a generation that may have succeeded. The exit follows on
	// the stream once recorded.
	for _, w := range []*worker{v.ending, v.cur} {
		if w != nil {
			out = append(out, &rdzvv1.WorkerStatus{Job: w.job, Generation: w.generation, State: rdzvv1.WorkerState_WORKER_STATE_RUNNING})
		}
	}
	return out
}

// Running reports whether job's workers are running here.
func (s *Supervisor) Running(job string) bool {
	w := s.view.Load().cur
	return w != nil && w.job == job
}

func (s *Supervisor) assign(a *rdzvv1.Assignment) {
	job, gen := a.GetSpec().GetName(), a.GetGeneration()
	log := s.log.With(zap.String("job", job), zap.Uint64("generation", gen), zap.Uint32("node_rank", a.GetNodeRank()))
	if last := s.lastGen[job]; gen <= last {
		log.Warn("rejecting stale assignment", zap.Uint64("latest_generation", last))
		return
	}
	if s.cur != nil {
		s.stopCurrent(fmt.Sprintf("replaced by generation %d of job %s", gen, job))
	}
	s.lastGen[job] = gen
	if s.standby != nil && s.standby.job != job {
		s.dropStandby("")
	}

	spec := jobspec.FromProto(a.GetSpec())
	if err := spec.Validate(); err != nil {
		s.finished(job, gen, rdzvv1.WorkerState_WORKER_STATE_FAILED, Exit{Code: -1}, fmt.Sprintf("refusing assignment: %v", err), nil)
		return
	}
	if s.gate != nil {
		// The checks bound themselves (health_checks.timeout each).
		if err := s.gate(context.Background()); err != nil {
			log.Warn("not starting workers on an unhealthy node", zap.Error(err))
			s.finished(job, gen, rdzvv1.WorkerState_WORKER_STATE_FAILED, Exit{Code: -1}, err.Error(), nil)
			return
		}
	}
	w, err := s.start(a)
	if err != nil {
		var pf *preflightError
		failure := ""
		if errors.As(err, &pf) {
			failure = pf.failure
		}
		log.Error("starting workers failed", zap.Error(err), zap.String("failure", failure))
		s.record(&rdzvv1.WorkerStatus{Job: job, Generation: gen, State: rdzvv1.WorkerState_WORKER_STATE_FAILED, ExitCode: -1, Message: wire.ClipText(err.Error()), Failure: failure})
		return
	}
	log.Info("workers started", zap.Int("pid", w.proc.Pid()), zap.String("master_addr", a.GetMasterAddr()), zap.Uint32("master_port", a.GetMasterPort()))
	s.supervise(w, a, true)
	if spec.Launcher.Kind == jobspec.KindWarm {
		s.keepStandby(s.spawnStandby(a))
	}
}

// keepStandby makes sb the standby for the generation after the running
// one. The run goroutine handles that generation's exit only after this,
// so the exit drops or lingers sb as it would any standby.
func (s *Supervisor) keepStandby(sb *standby) {
	s.standby = sb
	s.publish()
}

// supervise makes w the running worker and watches it until it exits.
func (s *Supervisor) supervise(w *worker, a *rdzvv1.Assignment, announce bool) {
	spec := a.GetSpec()
	// One node scans: the directory is shared, and every node reporting the
	// same checkpoints would multiply the controller's work by the node count.
	scan := spec.GetCheckpointDir() != "" && a.GetNodeRank() == 0
	if scan {
		w.scanStop, w.scanDone = make(chan struct{}), make(chan struct{})
	}
	s.cur = w
	s.publish()
	if announce {
		s.emit(&rdzvv1.WorkerStatus{Job: w.job, Generation: w.generation, State: rdzvv1.WorkerState_WORKER_STATE_RUNNING})
	}
	if scan {
		go s.scanLoop(w, spec.GetCheckpointDir(), jobspec.FromProto(spec).Checkpoint.Markers)
	}
	go s.watch(w)
}

func newWorker(a *rdzvv1.Assignment, proc Process, logPath string, token []byte, cred *syscall.Credential) *worker {
	return &worker{job: a.GetSpec().GetName(), generation: a.GetGeneration(), checkpointDir: a.GetSpec().GetCheckpointDir(), proc: proc, logPath: logPath,
		token: token, cred: cred, exited: make(chan struct{}), reported: map[uint64]bool{}, releaseUser: func() {},
		resumed: a.GetResumeFrom() != "", resumeStep: a.GetResumeStep()}
}

// workerExit is what the watch goroutine learnt of the workers' exit.
type workerExit struct {
	// handedOver is whether the workers had been handed over when Wait
	// returned: their exit is then the next agent's, and the fields after
	// exitedAt are not set.
	handedOver bool
	exit       Exit
	exitedAt   *timestamppb.Timestamp
	// reason is the process's own account of the exit (Process.Reason).
	reason string
	// verdict is the preflight's, when it excluded this node.
	verdict  string
	excluded bool
}

// watch waits for w's workers to exit, sweeps what they left and closes
// w.exited; the run goroutine takes it from there (ended). It touches no
// state of the Supervisor's.
func (s *Supervisor) watch(w *worker) {
	exit := w.proc.Wait()
	w.exit = workerExit{handedOver: w.handedOver.Load(), exit: exit, exitedAt: timestamppb.New(s.clock.Now())}
	defer close(w.exited)
	if w.exit.handedOver {
		w.stopScan()
		return
	}
	// torchrun has exited; anything it left in its group (a worker that
	// ignored its parent's death) still holds a GPU, so sweep the group.
	if err := w.proc.Kill(0); err != nil {
		s.log.Error("workers left behind", zap.String("job", w.job), zap.Error(err))
	}
	w.releaseUser()
	// The last scan is queued before the exit is reported, so the
	// controller has it when it picks the checkpoint to resume from.
	w.stopScan()
	w.exit.reason = w.proc.Reason()
	if w.preflight {
		w.exit.verdict, w.exit.excluded = preflightVerdict(w.logPath, exit)
	}
}

// stopScan ends w's checkpoint scanner, if it has one, after its last scan.
func (w *worker) stopScan() {
	if w.scanStop != nil {
		close(w.scanStop)
		<-w.scanDone
	}
}

// ended records and reports the exit of w, whose exited is closed. On the
// run goroutine.
func (s *Supervisor) ended(w *worker) {
	reason, exit := w.stopReason, w.exit.exit
	state := rdzvv1.WorkerState_WORKER_STATE_FAILED
	msg, excluded := "", false
	if reason == "" {
		msg = w.exit.reason
		if excluded = w.exit.excluded; excluded {
			msg = w.exit.verdict
		}
	}
	switch {
	case reason != "":
		state, msg = rdzvv1.WorkerState_WORKER_STATE_STOPPED, reason
	case exit.Code == 0:
		state = rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED
	}
	// The closing line goes in before the worker stops counting as running,
	// so `rdzvctl logs -f` always ends with it.
	appendLog(w.logPath, fmt.Sprintf("=== rdzv: generation %d ended: %s exit_code=%d signal=%q %s\n", w.generation, state, exit.Code, exit.Signal, msg))
	if s.cur == w {
		s.cur, s.ending = nil, w
		s.publish()
	}
	s.log.Info("workers exited", zap.String("job", w.job), zap.Uint64("generation", w.generation),
		zap.Int("exit_code", exit.Code), zap.String("signal", exit.Signal), zap.String("state", state.String()))
	if state == rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED {
		// The job is done: no generation follows. Killed before the exit
		// is reported, so anything that follows the report (the job's end,
		// a check that the node is idle) finds it gone.
		s.dropStandby(w.job)
	} else {
		s.lingerStandby(w.job, w.generation)
	}
	st := &rdzvv1.WorkerStatus{Job: w.job, Generation: w.generation, State: state, ExitCode: int32(exit.Code), Signal: exit.Signal,
		Message: wire.ClipText(msg), ExitedAt: w.exit.exitedAt, PreflightExcluded: excluded}
	s.keep(st)
	if s.ending == w {
		s.ending = nil
	}
	s.publish()
	s.report(s.withMemory(st))
	// The log just stopped growing: it counts toward the cap from now on.
	s.pruneJobLogs()
}

func (s *Supervisor) stop(job string, gen uint64, reason string, grace time.Duration) {
	if gen > s.lastGen[job] {
		// A stop for a generation never started here fences it: a late
		// assignment for it is rejected.
		s.lastGen[job] = gen
	}
	if cur := s.cur; cur != nil && cur.job == job && cur.generation == gen {
		s.kill(reason, grace)
		return
	}
	// Nothing of that generation runs here; say so, so the controller frees
	// the node.
	if st := s.lastStatus(job, gen); st != nil {
		s.emit(st)
		return
	}
	s.finished(job, gen, rdzvv1.WorkerState_WORKER_STATE_STOPPED, Exit{}, "not running on this node: "+reason, nil)
}

// stopCurrent stops the running worker, if any, with the configured grace,
// and waits until its status is recorded.
func (s *Supervisor) stopCurrent(reason string) { s.kill(reason, s.stopGrace) }

// kill stops the running worker, if any, with grace between SIGTERM and
// SIGKILL, and waits for its exit (on its exited channel) and records it.
func (s *Supervisor) kill(reason string, grace time.Duration) {
	w := s.cur
	if w == nil {
		return
	}
	if w.stopReason == "" {
		w.stopReason = reason
	}
	s.log.Info("stopping workers", zap.String("job", w.job), zap.Uint64("generation", w.generation), zap.String("reason", reason))
	if err := w.proc.Kill(grace); err != nil {
		s.log.Error("stopping workers failed", zap.String("job", w.job), zap.Error(err))
	}
	<-w.exited
	s.ended(w)
}

func (s *Supervisor) lastStatus(job string, gen uint64) *rdzvv1.WorkerStatus {
	for i := len(s.history) - 1; i >= 0; i-- {
		if h := s.history[i]; h.GetJob() == job && h.GetGeneration() == gen {
			return h
		}
	}
	return nil
}

// finished records and reports an outcome; exitedAt is when the workers were
// seen to exit, nil when none ran.
func (s *Supervisor) finished(job string, gen uint64, state rdzvv1.WorkerState, exit Exit, msg string, exitedAt *timestamppb.Timestamp) {
	s.record(&rdzvv1.WorkerStatus{Job: job, Generation: gen, State: state, ExitCode: int32(exit.Code), Signal: exit.Signal, Message: wire.ClipText(msg), ExitedAt: exitedAt})
}

// record keeps an outcome in the history and reports it.
func (s *Supervisor) record(st *rdzvv1.WorkerStatus) {
	s.keep(st)
	s.publish()
	s.report(s.withMemory(st))
}

// keep puts an outcome in the history.
func (s *Supervisor) keep(st *rdzvv1.WorkerStatus) {
	s.history = append(s.history, st)
	if len(s.history) > HistorySize {
		s.history = s.history[len(s.history)-HistorySize:]
	}
}

// withMemory is st with what this node holds of the job's in-memory
// checkpoints now, for the controller to resume from the newest step its
// workers saved (the heartbeat's holdings may be an interval old). st
// itself stays as kept: the history goes into registrations, which carry
// holdings of their own.
func (s *Supervisor) withMemory(st *rdzvv1.WorkerStatus) *rdzvv1.WorkerStatus {
	held, _ := s.mem.held(st.GetJob())
	if len(held) == 0 {
		return st
	}
	out := proto.CloneOf(st)
	out.Memory = held
	return out
}

// report counts an outcome and sends it to the controller.
func (s *Supervisor) report(st *rdzvv1.WorkerStatus) {
	if s.exits != nil {
		s.exits.WithLabelValues(exitCause(st)).Inc()
	}
	s.emit(st)
}

func (s *Supervisor) emit(st *rdzvv1.WorkerStatus) {
	select {
	case s.updates <- st:
	default:
		s.log.Warn("status update queue full; the status is re-sent on reconnect", zap.String("job", st.GetJob()))
	}
}

// LogPath is where a job's output is kept on this node.
func (s *Supervisor) LogPath(job string) (string, error) {
	return s.jobPath(job, "logs", job+".log")
}

// jobPath is a path of job's under the state directory. The job name was
// validated by the controller and the assignment again here, but these are
// files the agent writes as itself, so the result is checked once more
// right where it is made: it must stay inside the state directory.
func (s *Supervisor) jobPath(job string, elem ...string) (string, error) {
	if fe := wire.ValidateName("job", job); fe != nil {
		return "", fe
	}
	dir := filepath.Clean(s.stateDir)
	p := filepath.Join(append([]string{dir}, elem...)...)
	if fe := wire.CheckPath("path", p, dir); fe != nil {
		return "", fmt.Errorf("job %s: a file outside the state directory: %w", job, fe)
	}
	return p, nil
}

// launchPrep is what starting anything of a job's on this node needs:
// whom it runs as, where, with what environment, and where its output goes.
type launchPrep struct {
	runAs *RunAs
	// releaseUser gives back the hold on a dynamic user this launch took:
	// once what it started has exited, or at once if nothing started.
	releaseUser func()
	workdir     string
	jobEnv      map[string]string
	// path is PATH in the workers' environment.
	path    string
	logPath string
}

// prepare takes a hold on the job's dynamic user if it runs as one: the
// caller gives it back (launchPrep.releaseUser) when what it started has
// exited, and prepare itself when it fails.
func (s *Supervisor) prepare(spec *rdzvv1.JobSpec) (p *launchPrep, err error) {
	job := spec.GetName()
	scratch, err := s.jobPath(job, "jobs", job)
	if err != nil {
		return nil, err
	}
	runAs, release, err := s.resolveRunAs(spec, scratch)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			release()
		}
	}()
	if err := s.preflight(spec, runAs.Credential); err != nil {
		return nil, err
	}
	workdir := spec.GetWorkdir()
	// A dynamic user's HOME is the scratch directory.
	if workdir == "" || runAs.Env["HOME"] == scratch {
		if err := os.MkdirAll(scratch, 0o755); err != nil {
			return nil, fmt.Errorf("creating scratch workdir: %w", err)
		}
		// The scratch workdir is the workers' own to write in.
		if c := runAs.Credential; c != nil {
			if err := os.Chown(scratch, int(c.Uid), int(c.Gid)); err != nil {
				return nil, fmt.Errorf("handing the scratch workdir to the run_as user: %w", err)
			}
		}
	}
	if workdir == "" {
		workdir = scratch
	}
	jobEnv, err := s.jobEnv(spec)
	if err != nil {
		return nil, err
	}
	for k, v := range runAs.Env {
		if _, set := jobEnv[k]; !set {
			jobEnv[k] = v
		}
	}
	path := s.workerPath
	if p, set := jobEnv["PATH"]; set {
		path = p
	}
	logPath, err := s.LogPath(job)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("creating log directory: %w", err)
	}
	return &launchPrep{runAs: runAs, releaseUser: release, workdir: workdir, jobEnv: jobEnv, path: path, logPath: logPath}, nil
}

func (s *Supervisor) start(a *rdzvv1.Assignment) (w *worker, err error) {
	spec := a.GetSpec()
	job := spec.GetName()
	p, err := s.prepare(spec)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			p.releaseUser()
		} else {
			w.releaseUser = p.releaseUser
		}
	}()
	assigned := assignedFor(a)
	js := jobspec.FromProto(spec)
	kind := js.Launcher.Kind
	if kind == jobspec.KindDeepSpeed {
		if assigned.Hostfile, err = s.writeHostfile(assigned); err != nil {
			return nil, err
		}
	}
	program, args := js.Launch(assigned)
	launcher, err := lookPath(program, p.path)
	if err != nil {
		return nil, &preflightError{failure: wire.FailureLauncherMissing,
			err: fmt.Errorf("launcher %q not found on node %s: %w", program, s.node, err)}
	}
	if py := torchrunPython(js.Launcher, launcher, p.path); py != "" {
		if r := s.probeTorch(py, p); r != nil {
			if assigned.TorchrunOptions, err = torchrunOptions(r, s.node, js.Launcher.ExtraArgs, js.Command); err != nil {
				return nil, err
			}
			_, args = js.Launch(assigned)
		}
	}
	if created := a.GetJobCreatedAt(); created != nil {
		if err := startRunLog(p.logPath, created.AsTime()); err != nil {
			return nil, err
		}
	}
	out, err := openJobLog(p.logPath)
	if err != nil {
		return nil, fmt.Errorf("opening job log: %w", err)
	}
	defer out.Close() // the child keeps its own descriptor
	how := ""
	if kind == jobspec.KindWarm {
		how = fmt.Sprintf(" (%d workers from a warm standby)", a.GetProcsPerNode())
	}
	fmt.Fprintf(out, "=== rdzv: job %s generation %d node %s rank %d/%d started %s: %s %s%s\n",
		job, a.GetGeneration(), s.node, a.GetNodeRank(), a.GetNnodes(), s.clock.Now().UTC().Format(time.RFC3339Nano), launcher, strings.Join(args, " "), how)
	meta, err := proto.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("encoding the assignment: %w", err)
	}
	// A token per generation: workers of an earlier one, or anyone who saw
	// its environment, cannot report for this one.
	token := make([]byte, reportTokenBytes)
	_, _ = rand.Read(token) // never fails; it would crash the agent first
	memEnv, err := s.mem.prepare(context.Background(), a, p.runAs.Credential)
	if err != nil {
		return nil, &preflightError{failure: wire.FailureMemoryFetch, err: err}
	}
	env := s.env(a, p.jobEnv, token, memEnv)
	if kind == jobspec.KindWarm {
		proc, err := s.warmStart(a, env, meta, token)
		if err != nil {
			return nil, err
		}
		return newWorker(a, proc, p.logPath, token, p.runAs.Credential), nil
	}
	path, argv := launcher, args
	if spec.GetHealthPreflight() != nil {
		script, err := writePreflight(s.stateDir)
		if err != nil {
			return nil, err
		}
		path, argv = preflightCommand(a, script, launcher, args)
	}
	proc, err := s.spawner.Spawn(ProcessSpec{Path: path, Args: argv, Dir: p.workdir, Env: env, Output: out, LogPath: p.logPath, Credential: p.runAs.Credential,
		ID: fmt.Sprintf("%s.%d", job, a.GetGeneration()), Meta: meta, ReportToken: token, OrphanTimeout: time.Duration(s.orphanTimeout.Load())})
	if err != nil {
		return nil, err
	}
	w = newWorker(a, proc, p.logPath, token, p.runAs.Credential)
	w.preflight = path != launcher
	return w, nil
}

// assignedFor is the assignment as every launcher kind is given it.
func assignedFor(a *rdzvv1.Assignment) jobspec.Assigned {
	return jobspec.Assigned{
		Job: a.GetSpec().GetName(), Generation: a.GetGeneration(),
		NNodes: int(a.GetNnodes()), NodeRank: int(a.GetNodeRank()), ProcsPerNode: int(a.GetProcsPerNode()),
		MasterAddr: a.GetMasterAddr(), MasterPort: int(a.GetMasterPort()),
	}
}

// writeHostfile writes the deepspeed hostfile for an assignment where the
// workers can read it; each generation overwrites the last one's, which
// has stopped by then.
func (s *Supervisor) writeHostfile(a jobspec.Assigned) (string, error) {
	p, err := s.jobPath(a.Job, "launch", a.Job+".hostfile")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", fmt.Errorf("creating launcher directory: %w", err)
	}
	if err := os.WriteFile(p, jobspec.DeepSpeedHostfile(a), 0o644); err != nil {
		return "", fmt.Errorf("writing deepspeed hostfile: %w", err)
	}
	return p, nil
}

// preflightError is a start failure a restart cannot fix: the job's
// configuration does not fit this node. failure is its wire.Failure* class.
type preflightError struct {
	failure string
	err     error
}

func (e *preflightError) Error() string { return e.failure + ": " + e.err.Error() }
func (e *preflightError) Unwrap() error { return e.err }

// preflight checks, before anything starts, that the job's directories are
// on this node, and that its workers (cred, nil for the agent's own user)
// can write its checkpoints: otherwise the launcher would fail with a
// misleading "fork/exec ...: no such file or directory" (the working
// directory), or the workers crash at their first checkpoint, on every
// restart, with EROFS or EACCES in the job's log.
func (s *Supervisor) preflight(spec *rdzvv1.JobSpec, cred *syscall.Credential) error {
	if dir := spec.GetWorkdir(); dir != "" && !isDir(dir) {
		return &preflightError{failure: wire.FailureWorkdirMissing,
			err: fmt.Errorf("workdir %s is not a directory on node %s", dir, s.node)}
	}
	dir := spec.GetCheckpointDir()
	if dir == "" {
		return nil
	}
	// The job may create checkpoint.dir itself (torch.distributed.checkpoint
	// and Hugging Face's Trainer do), so its parent is enough.
	target := dir
	if !isDir(dir) {
		if target = filepath.Dir(dir); !isDir(target) {
			return &preflightError{failure: wire.FailureCheckpointDirMissing,
				err: fmt.Errorf("checkpoint.dir %s is not a directory on node %s, nor is its parent %s", dir, s.node, target)}
		}
	}
	if err := probeWrite(target, cred); err != nil {
		return &preflightError{failure: wire.FailureCheckpointDirNotWritable, err: notWritable(dir, target, s.node, cred, err)}
	}
	return nil
}

// probeWrite creates, writes and removes a small file in dir as cred's
// user would (nil: the agent's own), which is the only way to learn what
// the kernel lets that user do there: a read-only mount or sandbox,
// permissions, ACLs, quotas or a full disk fail it.
func probeWrite(dir string, cred *syscall.Credential) error {
	return asUser(cred, func() error {
		f, err := os.CreateTemp(dir, ".rdzv-write-probe-*")
		if err != nil {
			return err
		}
		_, werr := f.Write([]byte("rdzv write probe\n"))
		return errors.Join(werr, f.Close(), os.Remove(f.Name()))
	})
}

// notWritable says why the workers (cred) cannot write in target
// (checkpoint.dir, or its parent when it does not exist yet), with the
// error's errno, and what fixes it.
func notWritable(dir, target, node string, cred *syscall.Credential, err error) error {
	who := "the agent's user"
	if cred != nil {
		who = fmt.Sprintf("the job's user %d:%d", cred.Uid, cred.Gid)
	}
	where := "checkpoint.dir " + dir
	if target != dir {
		where = fmt.Sprintf("the parent %s of checkpoint.dir %s (which the job would create)", target, dir)
	}
	var errno syscall.Errno
	errors.As(err, &errno)
	switch errno {
	case syscall.EROFS:
		return fmt.Errorf("%s is read-only on node %s (EROFS: %w)%s", where, node, err, writeFix(target, err))
	case syscall.EACCES, syscall.EPERM:
		return fmt.Errorf("%s is not writable by %s on node %s (%s: %w); give that user write access (chown, chmod or an ACL), or run the job as a user who has it (run_as)",
			where, who, node, unix.ErrnoName(errno), err)
	}
	return fmt.Errorf("%s: %s cannot create a file in it on node %s: %w", where, who, node, err)
}

// writeFix is what lets the agent and its workers write in dir, after
// err from writing there, starting "; ": for a read-only dir, most often
// the agent unit's sandbox. Empty for any other error, whose fix depends
// on who wrote.
func writeFix(dir string, err error) string {
	if !errors.Is(err, syscall.EROFS) {
		return ""
	}
	return "; under systemd, list it in the agent unit's ReadWritePaths= (ProtectSystem=strict makes every path not listed read-only to the agent and its workers: " +
		"systemctl edit rdzv-agent, add ReadWritePaths=" + dir + ", restart the agent), otherwise mount it read-write"
}

func isDir(p string) bool {
	info, err := os.Stat(p)
	return err == nil && info.IsDir()
}

// env is a fixed base, then the job's (jobEnv, with the run_as user's
// HOME, USER and LOGNAME), then what rdzv decides; the last word on
// interfaces, devices and identity is always rdzv's. Nothing comes from the
// agent's own environment but the locale and time zone: the agent runs as
// root under systemd, and neither root's PATH nor its variables are the
// workers' business.
func (s *Supervisor) env(a *rdzvv1.Assignment, jobEnv map[string]string, reportToken []byte, memEnv map[string]string) []string {
	spec := a.GetSpec()
	gpus := make([]string, len(a.GetGpuIndices()))
	for i, g := range a.GetGpuIndices() {
		gpus[i] = strconv.Itoa(int(g))
	}
	rdzv := map[string]string{
		"NCCL_SOCKET_IFNAME":   s.iface,
		"GLOO_SOCKET_IFNAME":   s.iface,
		"CUDA_VISIBLE_DEVICES": strings.Join(gpus, ","),
		"RDZV_JOB":             spec.GetName(),
		"RDZV_GENERATION":      strconv.FormatUint(a.GetGeneration(), 10),
		"RDZV_NODE":            s.node,
		"RDZV_NODE_RANK":       strconv.Itoa(int(a.GetNodeRank())),
		"RDZV_CHECKPOINT_DIR":  spec.GetCheckpointDir(),
		"RDZV_RESUME_FROM":     a.GetResumeFrom(),
		"RDZV_AGENT_ADDR":      s.reportAddr,
		// The launcher's own view of the assignment, whatever its kind:
		// what a custom launcher reads, and what launchers and frameworks
		// take from the environment. torchrun sets these for each worker
		// itself, to the same values.
		"MASTER_ADDR":         a.GetMasterAddr(),
		"MASTER_PORT":         strconv.Itoa(int(a.GetMasterPort())),
		"WORLD_SIZE":          strconv.Itoa(int(a.GetNnodes() * a.GetProcsPerNode())),
		"NODE_RANK":           strconv.Itoa(int(a.GetNodeRank())),
		"RDZV_NNODES":         strconv.Itoa(int(a.GetNnodes())),
		"RDZV_PROCS_PER_NODE": strconv.Itoa(int(a.GetProcsPerNode())),
		reportTokenEnv:        hex.EncodeToString(reportToken),
		// Set, even empty: a job cannot point them elsewhere.
		memDirEnv:         memEnv[memDirEnv],
		memResumeEnv:      memEnv[memResumeEnv],
		memResumeWorldEnv: memEnv[memResumeWorldEnv],
		memPersistEnv:     memEnv[memPersistEnv],
	}
	return s.envOf(jobEnv, rdzv)
}

// baseEnv is env without anything of an assignment: a warm standby's.
func (s *Supervisor) baseEnv(jobEnv map[string]string) []string { return s.envOf(jobEnv, nil) }

func (s *Supervisor) envOf(jobEnv, rdzv map[string]string) []string {
	merged := map[string]string{"PATH": s.workerPath}
	for _, k := range passedThrough {
		if v, set := os.LookupEnv(k); set {
			merged[k] = v
		}
	}
	maps.Copy(merged, jobEnv)
	maps.Copy(merged, rdzv)
	env := make([]string, 0, len(merged))
	for _, k := range slices.Sorted(maps.Keys(merged)) {
		env = append(env, k+"="+merged[k])
	}
	return env
}

// passedThrough are the agent's variables workers get too: how the node
// reads and writes text and time, which the job can still override.
var passedThrough = []string{"LANG", "LC_ALL", "TZ"}

// lookPath finds the launcher on the workers' PATH, where they would find
// it, rather than the agent's.
func lookPath(file, path string) (string, error) {
	if strings.Contains(file, "/") {
		return exec.LookPath(file)
	}
	for _, dir := range filepath.SplitList(path) {
		// A relative entry would be the agent's working directory.
		if !filepath.IsAbs(dir) {
			continue
		}
		if p, err := exec.LookPath(filepath.Join(dir, file)); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("not in the workers' PATH %s: %w", path, exec.ErrNotFound)
}

// jobLogMode keeps a job's output from other local users: it holds what the
// job's code prints. The agent, root, serves it to rdzvctl.
const jobLogMode = 0o640

// openJobLog opens a job's log for appending. A log an older agent created
// readable by all is narrowed too.
func openJobLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, jobLogMode)
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(jobLogMode); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func appendLog(path, line string) {
	f, err := openJobLog(path)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.WriteString(line)
}
