package agent

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/agent/torchprobe"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// Warm standbys (launcher.kind warm). For a job of that kind the agent keeps
// one standby process on each node that runs it: the job's Python, started
// through a shim like any launcher (the job's user, workdir and
// environment), running zygoteScript, which imports the job's preload
// modules and waits on a socket for its assignment. An assignment is handed
// to the standby instead of starting torchrun: the standby forks the
// workers with torchrun's environment (node rank 0's first starts the
// generation's TCPStore, as node rank 0's torchrun would host it), and from
// then on it is the generation's launcher process, supervised, fenced,
// stopped and adopted as torchrun would be. The next standby starts right
// after, so starting Python and importing torch (seconds, and twice with
// torchrun: the launcher and each worker) is paid while the job trains,
// not while it recovers.
//
//go:embed warm/zygote.py
var zygoteScript []byte

const (
	// zygoteFile holds the script under state_dir, readable by every
	// worker user, written by the agent only.
	zygoteFile = "rdzv_zygote.py"
	// standbyWait bounds a hand-off: the standby may still be importing
	// the preload modules (a fresh one, on a loaded node).
	standbyWait = 2 * time.Minute
	// standbyDialEvery paces the hand-off's dials while the standby is
	// not yet listening.
	standbyDialEvery = 10 * time.Millisecond
	// standbyLinger is how long a job's idle standby outlives its last
	// generation here when no stop order said the job ended (JobEnded
	// drops it at once: Supervisor.Ordered): a restart's next assignment
	// comes within seconds, and a job whose end the agent never heard of
	// (its controller gone meanwhile) does not keep a zygote for long.
	standbyLinger = time.Minute
)

// standby is one started zygote waiting for an assignment. The Supervisor's
// run goroutine owns it; the goroutine spawnStandby starts sets proc, err
// and torch before closing ready, and closes exited.
type standby struct {
	job string
	// spec and created are the job it was started for: a standby serves
	// only that run of that job (same user, workdir, environment).
	spec    *rdzvv1.JobSpec
	created int64
	// dir is the per-job socket directory, sock the socket's name in it.
	dir  string
	sock string
	// ready is closed once the spawn is over: proc or err is set.
	ready chan struct{}
	proc  Process
	err   error
	// exited is closed when proc has exited.
	exited chan struct{}
	// torch is what the node's torch says of its torchrun, for the
	// workers' environment; nil when it could not be asked. Set with proc.
	torch *torchprobe.Result
	// until is set on a standby kept as an idle spare's (PrepareStandby):
	// it is dropped then unless told again. Owned by the run goroutine.
	until time.Time
}

// handoff is the zygote's one message: see warm/zygote.py.
type handoff struct {
	Argv    []string        `json:"argv"`
	Workers []handoffWorker `json:"workers"`
	Store   handoffStore    `json:"store"`
	// ErrorDir holds the workers' TORCHELASTIC_ERROR_FILEs, one directory
	// per local rank; the standby reports a failed worker's and removes it.
	ErrorDir string `json:"error_dir"`
}

// handoffStore is the generation's TCPStore: node rank 0's standby serves
// it, the others wait for it to listen before forking their workers.
type handoffStore struct {
	Addr  string `json:"addr"`
	Port  int    `json:"port"`
	Serve bool   `json:"serve"`
}

type handoffWorker struct {
	Env map[string]string `json:"env"`
}

// warmHandoff is an assignment as the zygote gets it: for each local rank,
// the launcher's environment (env, as torchrun itself would get it) plus
// what the node's torchrun sets for each worker, as its torch (torch, from
// torchprobe) showed it: the ranks and sizes rdzv assigned, the per-worker
// TORCHELASTIC_ERROR_FILE under errDir, and every other variable that
// torchrun added (TORCHELASTIC_USE_AGENT_STORE, [TORCH_]NCCL_ASYNC_ERROR_HANDLING,
// TORCHELASTIC_SIGNALS_TO_HANDLE...) with torchrun's value, unless the job
// gave its own. Without an answer from the node's torch it is torch
// 1.13's set (legacyTorchrunEnv). rdzv's generations are torchrun's static
// rendezvous: one group per node, ranks by node, and the TCPStore on
// MASTER_PORT is the agents' (node rank 0's standby serves it), not rank
// 0's worker's: TORCHELASTIC_USE_AGENT_STORE=True, as every torchrun sets
// it for the static backend, makes every worker's env:// or tcp://
// rendezvous a client of it. Served before any worker starts, it spares
// the workers torch's one-second retry of a store not yet listening. Each
// generation is a fresh launcher, so its restart count is 0 of 0, and the
// run id is <job>-<generation>, as the custom launcher's {rdzv_id}.
func warmHandoff(a *rdzvv1.Assignment, env []string, command []string, torch *torchprobe.Result, errDir string) handoff {
	base := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		base[k] = v
	}
	nproc, nnodes, node := int(a.GetProcsPerNode()), int(a.GetNnodes()), int(a.GetNodeRank())
	added := legacyTorchrunEnv
	if torch != nil {
		added = torch.Env
	}
	world := strconv.Itoa(nnodes * nproc)
	h := handoff{Argv: command, Workers: make([]handoffWorker, nproc), ErrorDir: errDir,
		Store: handoffStore{Addr: a.GetMasterAddr(), Port: int(a.GetMasterPort()), Serve: node == 0}}
	for local := range nproc {
		w := make(map[string]string, len(base)+len(added)+16)
		maps.Copy(w, base)
		for k, v := range added {
			_, set := base[k]
			switch {
			case k == "TORCHELASTIC_ERROR_FILE":
				w[k] = filepath.Join(errDir, strconv.Itoa(local), "error.json")
			case k == "OMP_NUM_THREADS":
				// torchrun's default for more than one worker.
				if !set && nproc > 1 {
					w[k] = v
				}
			case !set:
				w[k] = v
			}
		}
		rank := strconv.Itoa(node*nproc + local)
		for k, v := range map[string]string{
			"LOCAL_RANK":                   strconv.Itoa(local),
			"RANK":                         rank,
			"GROUP_RANK":                   strconv.Itoa(node),
			"ROLE_RANK":                    rank,
			"ROLE_NAME":                    "default",
			"LOCAL_WORLD_SIZE":             strconv.Itoa(nproc),
			"WORLD_SIZE":                   world,
			"GROUP_WORLD_SIZE":             strconv.Itoa(nnodes),
			"ROLE_WORLD_SIZE":              world,
			"MASTER_ADDR":                  a.GetMasterAddr(),
			"MASTER_PORT":                  strconv.Itoa(int(a.GetMasterPort())),
			"TORCHELASTIC_RESTART_COUNT":   "0",
			"TORCHELASTIC_MAX_RESTARTS":    "0",
			"TORCHELASTIC_RUN_ID":          fmt.Sprintf("%s-%d", a.GetSpec().GetName(), a.GetGeneration()),
			"TORCHELASTIC_USE_AGENT_STORE": "True",
		} {
			w[k] = v
		}
		h.Workers[local] = handoffWorker{Env: w}
	}
	return h
}

// legacyTorchrunEnv is what torch 1.13's torchrun adds for its workers
// beyond the ranks and sizes (local_elastic_agent.py, _start_workers), for
// a node whose torch could not be asked.
var legacyTorchrunEnv = map[string]string{
	"OMP_NUM_THREADS":              "1",
	"NCCL_ASYNC_ERROR_HANDLING":    "1",
	"TORCHELASTIC_USE_AGENT_STORE": "True",
	"TORCHELASTIC_ERROR_FILE":      "",
}

// standbyEnv is a standby's environment before its assignment: the job's,
// without anything of an assignment (those reach the workers at the
// hand-off). OMP_NUM_THREADS is as the workers will have it, since the
// OpenMP runtime reads it when torch is imported.
func standbyEnv(spec *rdzvv1.JobSpec, base []string) []string {
	if spec.GetProcsPerNode() <= 1 {
		return base
	}
	for _, kv := range base {
		if strings.HasPrefix(kv, "OMP_NUM_THREADS=") {
			return base
		}
	}
	return append(base, "OMP_NUM_THREADS=1")
}

// spawnStandby starts a standby for a's job in the background; the next
// assignment takes it (takeStandby).
func (s *Supervisor) spawnStandby(a *rdzvv1.Assignment) *standby {
	sb := &standby{job: a.GetSpec().GetName(), spec: a.GetSpec(), created: a.GetJobCreatedAt().AsTime().UnixNano(),
		ready: make(chan struct{}), exited: make(chan struct{})}
	s.standbySeq++
	sb.sock = fmt.Sprintf("standby-%d.sock", s.standbySeq)
	go func() {
		defer close(sb.ready)
		var release func()
		sb.proc, release, sb.err = s.startStandby(sb)
		if sb.err != nil {
			s.log.Warn("starting a warm standby failed; the next generation starts a fresh one", zap.String("job", sb.job), zap.Error(sb.err))
			close(sb.exited)
			return
		}
		go func() {
			sb.proc.Wait()
			release()
			close(sb.exited)
		}()
	}()
	return sb
}

// startStandby also returns what gives back the standby's hold on its
// dynamic user, once it has exited.
func (s *Supervisor) startStandby(sb *standby) (_ Process, release func(), err error) {
	p, err := s.prepare(sb.spec)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			p.releaseUser()
		}
	}()
	l := jobspec.FromProto(sb.spec).Launcher
	python, err := lookPath(l.Python, p.path)
	if err != nil {
		return nil, nil, &preflightError{failure: wire.FailureLauncherMissing, err: fmt.Errorf("launcher.python %q not found on node %s: %w", l.Python, s.node, err)}
	}
	script, err := writeScript(s.stateDir, zygoteFile, zygoteScript)
	if err != nil {
		return nil, nil, err
	}
	if sb.dir, err = s.jobPath(sb.job, "warm", sb.job); err != nil {
		return nil, nil, err
	}
	// The socket's directory is the job user's alone: whoever can connect
	// can have the standby run the job's script with an environment of
	// their choosing.
	if err := os.MkdirAll(filepath.Dir(sb.dir), 0o755); err != nil {
		return nil, nil, fmt.Errorf("creating the standbys' directory: %w", err)
	}
	if err := os.Mkdir(sb.dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, nil, fmt.Errorf("creating the standby's directory: %w", err)
	}
	if c := p.runAs.Credential; c != nil {
		if err := os.Chown(sb.dir, int(c.Uid), int(c.Gid)); err != nil {
			return nil, nil, fmt.Errorf("handing the standby's directory to the run_as user: %w", err)
		}
	}
	out, err := openJobLog(p.logPath)
	if err != nil {
		return nil, nil, fmt.Errorf("opening job log: %w", err)
	}
	defer out.Close()
	args := append(append(append([]string{"-u", script, sb.dir, sb.sock}, l.Preload...), "--"), sb.spec.GetCommand()...)
	proc, err := s.spawner.Spawn(ProcessSpec{Path: python, Args: args, Dir: p.workdir, Env: standbyEnv(sb.spec, s.baseEnv(p.jobEnv)), Output: out, LogPath: p.logPath,
		Credential: p.runAs.Credential, ID: sb.job + "." + strings.TrimSuffix(sb.sock, ".sock"), OrphanTimeout: time.Duration(s.orphanTimeout.Load()), Nice: s.standbyNice})
	if err != nil {
		return nil, nil, err
	}
	// Asked while the standby imports: what the node's torchrun gives its
	// workers.
	sb.torch = s.probeTorch(python, p)
	return proc, p.releaseUser, nil
}

// takeStandby returns the standby started for a's job and run, waiting
// for its spawn to finish, or nil if there is none fit to use.
func (s *Supervisor) takeStandby(a *rdzvv1.Assignment) *standby {
	sb := s.standby
	if sb == nil {
		return nil
	}
	s.standby = nil
	s.publish()
	<-sb.ready
	select {
	case <-sb.exited:
		s.log.Warn("the warm standby had exited; starting a fresh one", zap.String("job", sb.job))
		s.discardStandby(sb)
		return nil
	default:
	}
	if !sb.fits(a) {
		s.discardStandby(sb)
		return nil
	}
	return sb
}

// dropStandby kills the standby of job ("" for any).
func (s *Supervisor) dropStandby(job string) {
	sb := s.standby
	if sb == nil || job != "" && sb.job != job {
		return
	}
	s.standby = nil
	s.publish()
	<-sb.ready
	s.discardStandby(sb)
}

// discardStandby kills an unused standby: it has run nothing of the job's,
// so it gets no grace.
func (s *Supervisor) discardStandby(sb *standby) {
	if sb.proc != nil {
		if err := sb.proc.Kill(0); err != nil {
			s.log.Error("killing a warm standby failed", zap.String("job", sb.job), zap.Error(err))
		}
	}
	if sb.dir != "" {
		_ = os.Remove(filepath.Join(sb.dir, sb.sock))
	}
}

// lingerStandby drops job's standby, once generation gen's workers here
// have exited, unless a later generation of the job is assigned here by
// standbyLinger from now, on the supervisor's clock.
func (s *Supervisor) lingerStandby(job string, gen uint64) {
	s.clock.AfterFunc(standbyLinger, func() {
		select {
		case s.cmds <- func() { s.dropIdleStandby(job, gen) }:
		default: // a busy agent drops it on the next assignment instead
		}
	})
}

// dropIdleStandby drops job's standby unless a generation after gen was
// assigned here since (its own exit lingers in turn: a restart a fault
// after this one must find the standby its generation left, even while
// between generations when this timer fires), the job's workers run here
// (a new run of the same name) or the controller holds this node as the
// job's spare.
func (s *Supervisor) dropIdleStandby(job string, gen uint64) {
	later := s.lastGen[job] > gen
	running := s.cur != nil && s.cur.job == job
	if !later && !running && !s.heldFor(job) {
		s.dropStandby(job)
	}
}

// warmStart hands a to a standby (a fresh one if none is ready) and
// returns it as the generation's launcher process.
func (s *Supervisor) warmStart(a *rdzvv1.Assignment, env []string, meta, token []byte) (Process, error) {
	sb := s.takeStandby(a)
	if sb == nil {
		sb = s.spawnStandby(a)
	}
	proc, err := s.handOffTo(sb, a, env, meta, token)
	if errors.Is(err, errStandbyExited) {
		// Killed before it took the assignment, as its shim does when the
		// agent's lease lapses on a starved node: it ran nothing of the
		// job's, so a fresh one takes the assignment rather than the
		// generation failing. Once: a standby that cannot start fails.
		s.log.Warn("the warm standby exited before its hand-off; starting a fresh one", zap.String("job", sb.job))
		proc, err = s.handOffTo(s.spawnStandby(a), a, env, meta, token)
	}
	return proc, err
}

// handOffTo hands a to sb once it is ready and returns it as the
// generation's launcher process.
func (s *Supervisor) handOffTo(sb *standby, a *rdzvv1.Assignment, env []string, meta, token []byte) (Process, error) {
	<-sb.ready
	if sb.err != nil {
		return nil, sb.err
	}
	errDir := filepath.Join(sb.dir, strings.TrimSuffix(sb.sock, ".sock"))
	msg, err := json.Marshal(warmHandoff(a, env, a.GetSpec().GetCommand(), sb.torch, errDir))
	if err != nil {
		return nil, fmt.Errorf("encoding the hand-off: %w", err)
	}
	// The standby is this generation's from the hand-off on: an agent that
	// adopts it after a restart must know which, so it is recorded first.
	if m, ok := sb.proc.(interface {
		SetMeta(meta, token []byte) error
	}); ok {
		if err := m.SetMeta(meta, token); err != nil {
			s.log.Warn("recording the standby's assignment failed; a restarted agent kills it instead of adopting it", zap.Error(err))
		}
	}
	// Raised first, so that a standby still importing (a fault soon after
	// the last) finishes at the workers' priority too.
	if s.standbyNice != 0 {
		if err := raisePriority(sb.proc.Pid()); err != nil {
			s.log.Warn("the workers run at the standby's priority", zap.String("job", sb.job), zap.Error(err))
		}
	}
	if err := handOff(sb, msg); err != nil {
		s.discardStandby(sb)
		return nil, err
	}
	return sb.proc, nil
}

// errStandbyExited is a standby that exited before taking its assignment.
var errStandbyExited = errors.New("the warm standby exited before its assignment")

// handOff sends msg to the standby, waiting for it to listen (it may
// still be importing), and for its answer. The wait for the socket is on
// the real clock, not the supervisor's: it paces dials against another
// process's progress, which no test clock could advance, and the
// connection's deadline is the kernel's.
func handOff(sb *standby, msg []byte) error {
	deadline := time.NewTimer(standbyWait)
	defer deadline.Stop()
	retry := time.NewTicker(standbyDialEvery)
	defer retry.Stop()
	var conn net.Conn
	for {
		err := viaDirFD(sb.dir, sb.sock, func(path string) (err error) {
			conn, err = net.DialTimeout("unix", path, shimRequestTimeout)
			return err
		})
		if err == nil {
			break
		}
		select {
		case <-sb.exited:
			return errStandbyExited
		case <-deadline.C:
			return fmt.Errorf("the warm standby did not listen within %s: %w", standbyWait, err)
		case <-retry.C:
		}
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(shimRequestTimeout))
	if _, err := conn.Write(append(msg, '\n')); err != nil {
		return fmt.Errorf("handing the assignment to the warm standby: %w", err)
	}
	reply, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading the warm standby's answer: %w", err)
	}
	if reply = strings.TrimSpace(reply); reply != "ok" {
		return fmt.Errorf("the warm standby refused its assignment: %s", reply)
	}
	return nil
}

// maxStandbyKeep bounds how long one PrepareStandby keeps a spare's
// standby: the controller repeats it every half minute or so, and a longer
// promise would keep a standby of a job that ended just as long.
const maxStandbyKeep = 10 * time.Minute

// PrepareStandby queues keeping the warm standby p asks for, and only it,
// while this node is an idle spare (docs/jobs.md#warm-standby-workers, "Standbys on spares").
func (s *Supervisor) PrepareStandby(p *rdzvv1.PrepareStandby) {
	s.cmds <- func() { s.prepareStandby(p) }
}

// validPrepare checks what the agent acts on: the spec is validated again
// as an assignment's is, since the standby runs as its run_as user.
func validPrepare(p *rdzvv1.PrepareStandby) error {
	if p.GetSpec() == nil {
		return nil
	}
	spec := jobspec.FromProto(p.GetSpec())
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("prepare_standby.spec: %w", err)
	}
	if spec.Launcher.Kind != jobspec.KindWarm {
		return &wire.FieldError{Field: "prepare_standby.spec.launcher.kind", Value: wire.Quote(spec.Launcher.Kind), Reason: "expected " + jobspec.KindWarm}
	}
	if !p.GetJobCreatedAt().IsValid() {
		return &wire.FieldError{Field: "prepare_standby.job_created_at", Value: p.GetJobCreatedAt().String(), Reason: "expected a valid time"}
	}
	if keep := p.GetKeepFor().AsDuration(); !p.GetKeepFor().IsValid() || keep <= 0 || keep > maxStandbyKeep {
		return &wire.FieldError{Field: "prepare_standby.keep_for", Value: keep.String(), Reason: fmt.Sprintf("expected more than 0 and at most %s", maxStandbyKeep)}
	}
	return nil
}

// prepareStandby makes the standby p asks for this node's, replacing any
// other, or drops the one prepared before when p names no job. A node
// whose workers run is no spare: its standby is its own job's, which p
// does not touch (the controller's word may lag behind an assignment).
func (s *Supervisor) prepareStandby(p *rdzvv1.PrepareStandby) {
	if err := validPrepare(p); err != nil {
		s.log.Warn("ignoring an invalid standby request", zap.Error(err))
		return
	}
	sb := s.standby
	if s.cur != nil {
		return
	}
	if p.GetSpec() == nil {
		if sb != nil && !sb.until.IsZero() {
			s.log.Info("dropping the warm standby of a spare no longer held", zap.String("job", sb.job))
			s.dropStandby("")
		}
		return
	}
	if ok, avail := s.standbyMemory(); !ok {
		s.log.Warn("keeping no warm standby for another job: too little memory available",
			zap.String("job", p.GetSpec().GetName()), zap.Uint64("mem_available_bytes", avail), zap.Uint64("floor_bytes", s.standbyFloor))
		if sb != nil && !sb.until.IsZero() {
			s.dropStandby("")
		}
		return
	}
	// Shaped as the assignment it stands for, for takeStandby.
	want := &rdzvv1.Assignment{Spec: p.GetSpec(), JobCreatedAt: p.GetJobCreatedAt()}
	until := s.clock.Now().Add(p.GetKeepFor().AsDuration())
	if sb == nil || !sb.fits(want) || sb.gone() {
		s.dropStandby("")
		s.log.Info("starting a warm standby on a spare", zap.String("job", want.GetSpec().GetName()))
		sb = s.spawnStandby(want)
		s.standby = sb
	}
	sb.until = until
	s.publish()
	s.expireStandby(sb, p.GetKeepFor().AsDuration())
}

// standbyMemory says whether the node may keep a standby for a job it
// does not run, and the MemAvailable it read. A meminfo it cannot read
// or parse does not stop standbys: the floor protects nodes that can tell.
func (s *Supervisor) standbyMemory() (ok bool, avail uint64) {
	if s.standbyFloor == 0 {
		return true, 0
	}
	data, err := s.meminfo()
	if err != nil {
		return true, 0
	}
	avail, found := memAvailable(data)
	return standbyMemoryOK(avail, found, s.standbyFloor), avail
}

// memAvailable is MemAvailable from /proc/meminfo ("MemAvailable: 123 kB"),
// in bytes; found is false when the line is missing or malformed.
func memAvailable(meminfo []byte) (bytes uint64, found bool) {
	for line := range strings.Lines(string(meminfo)) {
		rest, ok := strings.CutPrefix(line, "MemAvailable:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil || kb > math.MaxUint64/1024 {
			return 0, false
		}
		return kb * 1024, true
	}
	return 0, false
}

// standbyMemoryOK is the policy: a standby for a job the node does not
// run is kept while MemAvailable is at least floor; 0 is no floor, and an
// unknown MemAvailable (found false) does not count as pressure.
func standbyMemoryOK(avail uint64, found bool, floor uint64) bool {
	return floor == 0 || !found || avail >= floor
}

// expireStandby drops sb once its until has passed, unless it was renewed,
// taken or replaced by then. A busy command queue is tried again shortly
// (while the snapshot still shows sb kept): a standby must not outlive its
// promise for good. The timer's goroutine only sends the check to the run
// goroutine.
func (s *Supervisor) expireStandby(sb *standby, after time.Duration) {
	s.clock.AfterFunc(after, func() {
		select {
		case s.cmds <- func() {
			if s.standby == sb && !sb.until.IsZero() && !sb.until.After(s.clock.Now()) {
				s.log.Info("dropping the warm standby of a spare not told again", zap.String("job", sb.job))
				s.dropStandby("")
			}
		}:
		default:
			if s.view.Load().standby == sb {
				s.expireStandby(sb, time.Second)
			}
		}
	})
}

// heldFor reports whether this node keeps job's standby as a spare's.
func (s *Supervisor) heldFor(job string) bool {
	return s.standby != nil && s.standby.job == job && s.standby.until.After(s.clock.Now())
}

// fits reports whether sb was started for a's job, run and spec.
func (sb *standby) fits(a *rdzvv1.Assignment) bool {
	return sb.job == a.GetSpec().GetName() && sb.created == a.GetJobCreatedAt().AsTime().UnixNano() && proto.Equal(sb.spec, a.GetSpec())
}

// gone reports whether sb failed to start or has exited.
func (sb *standby) gone() bool {
	select {
	case <-sb.exited:
		return true
	default:
		return false
	}
}

// ReadyStandby is the job whose standby this node keeps ready for a job it
// does not run (an idle node's or a spare's, kept at PrepareStandby), ""
// for none. Ready is listening: the zygote listens once its imports are
// done. The controller lets a job grow onto the node once it is
// (Heartbeat.standby_ready). Called on the session's heartbeat goroutine.
func (s *Supervisor) ReadyStandby() string {
	v := s.view.Load()
	sb := v.standby
	if v.cur != nil || sb == nil || !v.spare {
		return ""
	}
	select {
	case <-sb.ready:
	default:
		return ""
	}
	if sb.err != nil || sb.gone() {
		return ""
	}
	if err := viaDirFD(sb.dir, sb.sock, func(path string) error { _, err := os.Stat(path); return err }); err != nil {
		return ""
	}
	return sb.job
}
