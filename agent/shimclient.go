package agent

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

const (
	// shimStartTimeout bounds the wait for a new shim's ready line.
	shimStartTimeout = 30 * time.Second
	// shimRequestTimeout bounds a request that needs no kill.
	shimRequestTimeout = 5 * time.Second
)

// ShimSpawner runs each launcher under its own shim process, so workers
// survive an agent restart and a new agent can adopt them.
type ShimSpawner struct {
	// Dir holds one directory per shim (<state_dir>/workers).
	Dir string
	// Command starts a shim; "--dir DIR" is appended. In production it is
	// the agent's own binary with the "shim" subcommand.
	Command []string
	Log     *zap.Logger
	// Leases is what holds every shim to the agent's lease; nil holds
	// them to none.
	Leases *Leases
}

// leased is a Spawner whose workers run under the agent's lease.
type leased interface{ LeaseHolder() *Leases }

// LeaseHolder is what renews the shims' lease; nil if they have none.
func (s ShimSpawner) LeaseHolder() *Leases { return s.Leases }

// Leases is the lease the agent grants its shims (health.LeaseUntil), as
// a time on the boot clock, and the shims it renews it to. One lock.
type Leases struct {
	mu    sync.Mutex
	until time.Duration
	// sent is when until was granted, on the boot clock.
	sent  time.Duration
	shims map[*shimProcess]bool
	// starting are the stdins of shims not attached yet, which take
	// their renewals there.
	starting map[io.Writer]bool
}

// leaseWrite bounds a renewal's write to one shim: a shim that does not
// read for that long is no reason to delay the others'.
const leaseWrite = 50 * time.Millisecond

// Renew grants every shim the lease until (boot clock), shortening it too:
// each lease is the bound as of its grant. It is stamped with the time of
// the call, no earlier than the state it was computed from, so that a
// shim reading it late takes it only if its lease held by then.
func (l *Leases) Renew(until time.Duration) {
	sent := bootTime()
	l.mu.Lock()
	l.until, l.sent = until, sent
	shims := make([]*shimProcess, 0, len(l.shims))
	for p := range l.shims {
		shims = append(shims, p)
	}
	starting := make([]io.Writer, 0, len(l.starting))
	for w := range l.starting {
		starting = append(starting, w)
	}
	l.mu.Unlock()
	for _, w := range starting {
		// A pipe's buffer takes far more renewals than a shim's start
		// lasts; one that ended already says so here, harmlessly.
		_, _ = fmt.Fprintf(w, "%d %d\n", int64(until), int64(sent))
	}
	for _, p := range shims {
		if err := p.requestWithin(shimRequest{Op: "lease", Lease: int64(until), Sent: int64(sent)}, leaseWrite); err != nil {
			p.log.Debug("renewing a shim's lease failed", zap.String("dir", p.dir), zap.Error(err))
		}
	}
}

// current is the lease a new shim starts with: none until the agent has
// granted one.
func (l *Leases) current() time.Duration {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.until
}

// starts renews the lease through w, a starting shim's stdin, until the
// returned func is called; it writes the current lease there at once.
func (l *Leases) starts(w io.Writer) (stop func()) {
	if l == nil {
		return func() {}
	}
	l.mu.Lock()
	if l.starting == nil {
		l.starting = map[io.Writer]bool{}
	}
	l.starting[w] = true
	until, sent := l.until, l.sent
	l.mu.Unlock()
	if until != 0 {
		_, _ = fmt.Fprintf(w, "%d %d\n", int64(until), int64(sent))
	}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.starting, w)
	}
}

// add renews p's lease from now on, unless it was removed already (a shim
// that ended before it was added).
func (l *Leases) add(p *shimProcess) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.unleased {
		return
	}
	if l.shims == nil {
		l.shims = map[*shimProcess]bool{}
	}
	l.shims[p] = true
}

// remove stops renewing p's lease: it ended, or was handed over.
func (l *Leases) remove(p *shimProcess) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	p.unleased = true
	delete(l.shims, p)
}

// Spawn starts a shim for spec, which starts the launcher, and attaches to it.
func (s ShimSpawner) Spawn(spec ProcessSpec) (Process, error) {
	if spec.ID == "" || strings.ContainsAny(spec.ID, `/\`) || spec.ID == "." || spec.ID == ".." {
		return nil, fmt.Errorf("invalid worker id %q", spec.ID)
	}
	dir := filepath.Join(s.Dir, spec.ID)
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("clearing shim directory: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating shim directory: %w", err)
	}
	if spec.LogPath == "" {
		return nil, errors.New("a shim needs the path of its worker's log")
	}
	ss := shimSpec{Path: spec.Path, Args: spec.Args, Dir: spec.Dir, Env: spec.Env, LogPath: spec.LogPath, OrphanTimeout: spec.OrphanTimeout, Credential: spec.Credential, Nice: spec.Nice,
		Lease: int64(s.Leases.current())}
	if err := writeJSON(filepath.Join(dir, shimSpecFile), ss); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, shimMetaFile), spec.Meta, 0o600); err != nil {
		return nil, fmt.Errorf("writing worker metadata: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, shimTokenFile), []byte(hex.EncodeToString(spec.ReportToken)), 0o600); err != nil {
		return nil, fmt.Errorf("writing the workers' report token: %w", err)
	}
	shimLog, err := os.OpenFile(filepath.Join(dir, shimLogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening shim log: %w", err)
	}
	defer shimLog.Close()
	cmd := exec.Command(s.Command[0], append(append([]string(nil), s.Command[1:]...), "--dir", dir)...)
	cmd.Stderr = shimLog
	// Its own session: neither a terminal's Ctrl-C nor a signal to the
	// agent's process group reaches it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	// Held until attached: if this agent dies first, the shim sees its
	// stdin end and fences the workers within the orphan timeout.
	spawner, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	defer spawner.Close()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting shim: %w", err)
	}
	// Until attached, renewals go through stdin: a shim slow to start on a
	// loaded node must not find the lease it was started with lapsed.
	defer s.Leases.starts(spawner)()
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(l)
	}()
	var ready string
	timedOut := false
	select {
	case ready = <-line:
	case <-time.After(shimStartTimeout):
		timedOut = true
		_ = cmd.Process.Kill()
	}
	// Reaped here while this agent lives; init reaps it after. Only once
	// the ready line is read: Wait closes the pipe, and a shim whose
	// launcher ended at once may have exited before the line was read.
	reaped := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(reaped)
	}()
	switch {
	case timedOut:
		return nil, fmt.Errorf("shim not ready after %s: %s", shimStartTimeout, lastLine(filepath.Join(dir, shimLogFile)))
	case !strings.HasPrefix(ready, shimReady+" "):
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("shim failed to start the launcher: %s", lastLine(filepath.Join(dir, shimLogFile)))
	}
	p, err := attachShim(dir, reaped, s.Leases, s.Log)
	if err == nil {
		s.Leases.add(p)
	}
	if err != nil {
		// A launcher that ends at once can take its shim with it before we
		// attach; the shim leaves the exit status behind, as for an agent
		// that was away.
		select {
		case <-reaped:
		case <-time.After(shimRequestTimeout):
			return nil, err
		}
		if _, statErr := os.Stat(filepath.Join(dir, shimExitFile)); statErr != nil {
			return nil, err
		}
		return endedShim(dir, s.Log), nil
	}
	return p, nil
}

// Adopted is a worker a previous agent left behind.
type Adopted struct {
	// Meta and ReportToken are what was passed in ProcessSpec; the token
	// is nil for a worker started before report tokens.
	Meta        []byte
	ReportToken []byte
	// Credential is the user the workers run as, nil for the agent's own.
	Credential *syscall.Credential
	// Live is set when the shim was still there to attach to: its workers
	// may still be reporting.
	Live bool
	Proc Process
}

// HandsOver is true: the shims keep the workers through an agent restart.
func (ShimSpawner) HandsOver() bool { return true }

// Adopt attaches to every shim a previous agent left, and returns the
// workers of those that already ended with their exit status.
func (s ShimSpawner) Adopt() ([]Adopted, error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing shims: %w", err)
	}
	var out []Adopted
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(s.Dir, e.Name())
		// The spec says which user the workers run as, which their
		// checkpoints are checked as.
		var spec shimSpec
		meta, err := os.ReadFile(filepath.Join(dir, shimMetaFile))
		if err == nil {
			err = readJSON(filepath.Join(dir, shimSpecFile), &spec)
		}
		if err != nil {
			s.Log.Warn("removing an unreadable shim directory", zap.String("dir", dir), zap.Error(err))
			_ = os.RemoveAll(dir)
			continue
		}
		// Missing from a shim of an agent before report tokens.
		token, _ := os.ReadFile(filepath.Join(dir, shimTokenFile))
		token, _ = hex.DecodeString(string(token))
		p, err := attachShim(dir, nil, s.Leases, s.Log)
		live := err == nil
		if live {
			// Renewed once this agent has heard a controller; until then
			// the shim keeps what the agent before granted it.
			s.Leases.add(p)
		}
		if !live {
			// The shim is gone: its exit file says how the workers ended,
			// or, if it died first, sweep its launcher's group ourselves.
			p = endedShim(dir, s.Log)
		}
		out = append(out, Adopted{Meta: meta, ReportToken: token, Credential: spec.Credential, Live: live, Proc: p})
	}
	return out, nil
}

func lastLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// shimProcess is the agent's handle on a shim.
type shimProcess struct {
	dir  string
	log  *zap.Logger
	pid  int
	done chan struct{}

	// reaped, for a shim this agent started, is closed once it has exited.
	reaped chan struct{}

	// leases renews this shim's lease, nil for none; unleased, guarded by
	// its lock, is set once it no longer does.
	leases   *Leases
	unleased bool

	mu       sync.Mutex
	conn     net.Conn
	exit     Exit
	reason   string
	detached bool
	// exitPid is the pid the exit status names: the launcher's, for a
	// shim whose first answer to attach was its exit.
	exitPid int
	replies chan shimStatus
}

// attachShim connects to the shim in dir; reaped is closed when it exits,
// if this agent started it, and nil otherwise. It fails only when there is
// no shim to connect to: once connected, a shim that ends or falls silent
// is a process that ended, with the status it left.
func attachShim(dir string, reaped chan struct{}, leases *Leases, log *zap.Logger) (*shimProcess, error) {
	var conn net.Conn
	err := viaDirFD(dir, shimSocket, func(path string) (err error) {
		conn, err = net.DialTimeout("unix", path, shimRequestTimeout)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to shim: %w", err)
	}
	p := &shimProcess{dir: dir, log: log, conn: conn, reaped: reaped, leases: leases, done: make(chan struct{}), replies: make(chan shimStatus, 1)}
	statuses := make(chan shimStatus, 4)
	go p.read(statuses)
	// A shim whose launcher just ended may have sent its exit status and
	// closed before reading the request: the status is still to be read,
	// so a failed request waits for the reader as an unanswered one does.
	reqErr := p.request(shimRequest{Op: "attach"})
	select {
	case st, ok := <-statuses:
		if ok {
			p.pid = st.Pid
			go p.forward(statuses)
			return p, nil
		}
		// Closed: the reader ended, with the exit status or without one.
	case <-p.done:
	case <-time.After(shimRequestTimeout):
		// Closing our end ends the reader, which takes the exit file's
		// status or, without one, kills what is left of the workers.
		log.Warn("shim did not answer attach", zap.String("dir", dir), zap.NamedError("request_error", reqErr))
		conn.Close()
	}
	<-p.done
	p.pid = p.exitPid
	return p, nil
}

// endedShim stands for a shim that is no longer there.
func endedShim(dir string, log *zap.Logger) *shimProcess {
	p := &shimProcess{dir: dir, log: log, done: make(chan struct{})}
	var st shimStatus
	if err := readJSON(filepath.Join(dir, shimExitFile), &st); err == nil {
		p.pid = st.Pid
		p.finish(st)
		return p
	}
	p.lost()
	return p
}

func (p *shimProcess) read(statuses chan<- shimStatus) {
	defer close(statuses)
	sc := bufio.NewScanner(p.conn)
	for sc.Scan() {
		var st shimStatus
		if err := json.Unmarshal(sc.Bytes(), &st); err != nil {
			continue
		}
		if st.Exited {
			p.finish(st)
			return
		}
		statuses <- st
	}
	p.mu.Lock()
	detached := p.detached
	p.mu.Unlock()
	if detached {
		return
	}
	// The shim died without a word (or was replaced by another agent's
	// attach): its exit file, if any, has the status.
	var st shimStatus
	if err := readJSON(filepath.Join(p.dir, shimExitFile), &st); err == nil {
		p.finish(st)
		return
	}
	p.lost()
}

func (p *shimProcess) forward(statuses <-chan shimStatus) {
	for st := range statuses {
		select {
		case p.replies <- st:
		default:
		}
	}
}

// lost handles a shim that vanished without recording an exit: whatever is
// left of its launcher's group is killed here, so nothing runs unsupervised.
func (p *shimProcess) lost() {
	pid := p.pid
	if pid == 0 {
		var st shimStatus
		if err := readJSON(filepath.Join(p.dir, shimStateFile), &st); err == nil {
			pid = st.Pid
		}
	}
	if pid > 0 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	p.log.Error("worker shim vanished, killed its process group", zap.String("dir", p.dir), zap.Int("pid", pid))
	p.finish(shimStatus{Pid: pid, Exited: true, Exit: Exit{Code: -1, Signal: "unknown"}, Reason: errShimGone.Error()})
}

// shimExitWait bounds the wait for a shim to exit after its last word.
const shimExitWait = 5 * time.Second

func (p *shimProcess) finish(st shimStatus) {
	p.leases.remove(p)
	// The shim exits right after reporting; once it has, nothing of this
	// worker is left on the node.
	if p.reaped != nil {
		select {
		case <-p.reaped:
		case <-time.After(shimExitWait):
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return
	default:
	}
	p.exit, p.reason, p.exitPid = st.Exit, st.Reason, st.Pid
	if p.conn != nil {
		p.conn.Close()
	}
	// The status now lives in this agent, unless it is handing the workers
	// over: then the exit file is for its successor.
	if !p.detached {
		_ = os.RemoveAll(p.dir)
	}
	close(p.done)
}

func (p *shimProcess) request(req shimRequest) error {
	return p.requestWithin(req, shimRequestTimeout)
}

func (p *shimProcess) requestWithin(req shimRequest, timeout time.Duration) error {
	b, _ := json.Marshal(req)
	p.mu.Lock()
	conn := p.conn
	p.mu.Unlock()
	if conn == nil {
		return errShimGone
	}
	_ = conn.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("writing to shim: %w", err)
	}
	return nil
}

func (p *shimProcess) Pid() int { return p.pid }

// SetMeta replaces what is kept with the worker for an adopting agent: a
// warm standby learns its assignment after its shim started.
func (p *shimProcess) SetMeta(meta, token []byte) error {
	for name, b := range map[string][]byte{shimMetaFile: meta, shimTokenFile: []byte(hex.EncodeToString(token))} {
		tmp := filepath.Join(p.dir, name+".tmp")
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			return fmt.Errorf("writing worker metadata: %w", err)
		}
		if err := os.Rename(tmp, filepath.Join(p.dir, name)); err != nil {
			return fmt.Errorf("writing worker metadata: %w", err)
		}
	}
	return nil
}

func (p *shimProcess) Wait() Exit {
	<-p.done
	return p.exit
}

// Reason is the shim's own account of the end, e.g. that it fenced the
// workers because no agent adopted them.
func (p *shimProcess) Reason() string {
	<-p.done
	return p.reason
}

func (p *shimProcess) Kill(grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.request(shimRequest{Op: "kill", Grace: grace}); err != nil {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(grace + groupSweepTimeout + shimRequestTimeout):
		return fmt.Errorf("shim in %s did not report its workers gone", p.dir)
	}
}

// Detach lets go of the workers without stopping them: the shim keeps them
// running for hold, and kills them unless an agent adopts them by then.
// Their lease is extended to the end of the hold, which the controller was
// told of (it waits for it), and no longer renewed by this agent.
func (p *shimProcess) Detach(hold time.Duration) error {
	p.leases.remove(p)
	p.mu.Lock()
	p.detached = true
	p.mu.Unlock()
	req := shimRequest{Op: "hold", Hold: hold}
	if hold > 0 {
		req.Lease = int64(bootTime() + hold)
	}
	err := p.request(req)
	if err == nil {
		select {
		case <-p.replies:
		case <-p.done:
		case <-time.After(shimRequestTimeout):
			err = errors.New("shim did not confirm the hold")
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		p.conn.Close()
	}
	// Wait returns: this agent is done with the workers, whose end is for
	// the next agent to learn.
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	return err
}
