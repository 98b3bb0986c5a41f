package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/rdzv/rdzv/health"
)

// A shim is a small process (`rdzv-agent shim --dir DIR`) between the agent
// and one torchrun. It owns the launcher's process group and its exit
// status, so the agent can exit (systemd restart, upgrade) while training
// goes on, and a new agent adopts the workers through the shim's socket.
// While no agent is attached the shim counts down; if none attaches in time
// it SIGKILLs the group, so workers never outlive their supervision for
// longer than the controller waits before moving the job on.
//
// A shim also holds its workers to a lease (docs/fencing.md): a deadline on
// the node's boot clock that the agent renews while it runs and that the
// shim enforces on its own, so that an agent that stops running (a stop
// signal, a frozen cgroup, a stall) cannot keep its workers past the
// controller's bound for the node. A lease that has lapsed is never
// renewed: the group is killed at once, before any request is served.
//
// Files in DIR: spec.json (the agent's, what to run), meta and
// report.token (the agent's, opaque to the shim: the assignment and the
// workers' report token, for the agent that adopts them), shim.sock, state.json (the
// launcher's pid) and exit.json (written once the group is gone), shim.log.
// DIR is 0700 and the files 0600, root's: spec.json and meta hold the
// job's environment, secrets included, and report.token lets its holder
// report for the job.
const (
	shimSpecFile  = "spec.json"
	shimMetaFile  = "meta"
	shimTokenFile = "report.token"
	shimSocket    = "shim.sock"
	shimStateFile = "state.json"
	shimExitFile  = "exit.json"
	shimLogFile   = "shim.log"
	// shimTermGrace is the workers' SIGTERM grace when the shim itself is
	// told to stop (a node shutting down).
	shimTermGrace = 10 * time.Second
	// shimReady is the first line the shim prints once its socket listens.
	shimReady = "ready"
)

// shimSpec is what the agent asks a shim to run.
type shimSpec struct {
	Path string   `json:"path"`
	Args []string `json:"args"`
	Dir  string   `json:"dir"`
	Env  []string `json:"env"`
	// LogPath receives the launcher's stdout and stderr (appended).
	LogPath string `json:"log_path"`
	// OrphanTimeout is how long the workers run on after their agent
	// vanished without a word (a crash) before the shim kills them.
	OrphanTimeout time.Duration `json:"orphan_timeout"`
	// Credential is the job's run_as user; nil runs as the shim's own.
	Credential *syscall.Credential `json:"credential,omitempty"`
	// Lease is the workers' first lease, in nanoseconds on the boot clock
	// (CLOCK_BOOTTIME); 0 holds them to none.
	Lease int64 `json:"lease,omitempty"`
	// Nice is the launcher's nice value and its session's; 0 is
	// workerNice.
	Nice int `json:"nice,omitempty"`
}

// shimRequest is a line from the agent.
type shimRequest struct {
	// Op is "attach", "kill", "hold" or "lease".
	Op string `json:"op"`
	// Grace is the SIGTERM grace of a kill.
	Grace time.Duration `json:"grace,omitempty"`
	// Hold replaces the orphan timeout for the coming disconnect: the agent
	// is about to exit on purpose and its successor adopts the workers.
	Hold time.Duration `json:"hold,omitempty"`
	// Lease is a deadline granted (op "lease"), or the end of the hold
	// (op "hold"), in nanoseconds on the boot clock; an absolute time, so
	// that a request read late, by a shim that was stopped, grants no more
	// than it did when sent. The agent also writes it, with Sent, a line of
	// two decimal numbers, to the shim's stdin until it attaches.
	Lease int64 `json:"lease,omitempty"`
	// Sent is when the agent granted Lease (op "lease"), on the boot clock:
	// a shim that runs late takes a renewal sent before its lease lapsed,
	// never one sent after (health.LeaseRenews). 0, an older agent's, counts
	// only if read in time.
	Sent int64 `json:"sent,omitempty"`
}

// shimStatus is a line from the shim: the answer to every request, and
// pushed when the launcher's group is gone.
type shimStatus struct {
	Pid    int    `json:"pid"`
	Exited bool   `json:"exited"`
	Exit   Exit   `json:"exit"`
	Reason string `json:"reason,omitempty"`
}

// Shim is the `rdzv-agent shim` daemon.
type Shim struct {
	// Dir is the shim's directory, prepared by the agent.
	Dir string
	// Ready receives the ready line (the shim's stdout) and is closed after.
	Ready *os.File
	// Spawner is the shim's stdin, whose other end the agent that started
	// it holds until it attaches: its end says that agent died before it
	// could attach, and starts the orphan timeout. Until then, the agent is
	// only slow, and its workers are not orphans.
	Spawner io.Reader
	Log     *zap.Logger
	// Clock times the orphan timeout and the lease checks; nil is the
	// real clock.
	Clock clockwork.Clock
	// Boot reads the boot clock the lease is on; nil is CLOCK_BOOTTIME.
	Boot func() time.Duration
	// Subreaper makes this process the child subreaper of what runs below
	// the launcher (PR_SET_CHILD_SUBREAPER): workers that a launcher dying
	// on its own leaves behind (torchrun 2.x starts each in a session of
	// its own) come to the shim, not init, and go with the launcher's
	// group. The shim command sets it; the setting is the whole process's,
	// which a test running a shim in its own process must not take on.
	Subreaper bool
}

// Run starts the launcher and serves the agent until the launcher's process
// group is gone.
func (sh Shim) Run(ctx context.Context) error {
	dir, ready, log := sh.Dir, sh.Ready, sh.Log
	var spec shimSpec
	if err := readJSON(filepath.Join(dir, shimSpecFile), &spec); err != nil {
		return err
	}
	out, err := openJobLog(spec.LogPath)
	if err != nil {
		return fmt.Errorf("opening job log: %w", err)
	}
	defer out.Close()
	sock := filepath.Join(dir, shimSocket)
	_ = os.Remove(sock) // a crashed shim's
	var ln net.Listener
	err = viaDirFD(dir, shimSocket, func(path string) (err error) {
		ln, err = net.Listen("unix", path)
		return err
	})
	if err != nil {
		return fmt.Errorf("listening on %s: %w", sock, err)
	}
	defer ln.Close()
	// The agent that started the shim renews the lease through stdin until
	// it attaches: read from the start, so that renewals sent while this
	// shim was starting count at its first check.
	spawnerGone, stdinLeases := make(chan struct{}), make(chan renewal, stdinBacklog)
	if sh.Spawner != nil {
		go readLeases(sh.Spawner, stdinLeases, spawnerGone)
	}
	reaper := false
	if sh.Subreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			log.Warn("becoming the workers' subreaper failed", zap.Error(err))
		} else {
			reaper = true
		}
	}
	proc, err := ExecSpawner{Reaper: reaper}.Spawn(ProcessSpec{Path: spec.Path, Args: spec.Args, Dir: spec.Dir, Env: spec.Env, Output: out, Credential: spec.Credential})
	if err != nil {
		return err
	}
	nice := spec.Nice
	if nice == 0 {
		nice = workerNice
	}
	yieldCPU(proc.Pid(), nice, log)
	if err := writeJSON(filepath.Join(dir, shimStateFile), shimStatus{Pid: proc.Pid()}); err != nil {
		_ = proc.Kill(0)
		return err
	}
	fmt.Fprintf(ready, "%s %d\n", shimReady, proc.Pid())
	ready.Close()
	log = log.With(zap.Int("pid", proc.Pid()))
	log.Info("launcher started", zap.String("path", spec.Path))
	clock := sh.Clock
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	boot := sh.Boot
	if boot == nil {
		boot = bootTime
	}
	s := &shimServer{dir: dir, spec: spec, proc: proc, log: log, clock: clock, boot: boot, conns: make(chan net.Conn), reqs: make(chan connRequest), gone: make(chan net.Conn),
		spawnerGone: spawnerGone, stdinLeases: stdinLeases, quit: make(chan struct{})}
	go s.accept(ln)
	if reaper {
		go reapOrphans(proc.Pid(), s.quit)
	}
	// workerNice, not nice: a standby starts no session before its
	// hand-off, and its workers' sessions after it are the workers'.
	go yieldSessions(proc.Pid(), workerNice, s.quit, log)
	return s.run(ctx)
}

const (
	// sessionScanFast is how often yieldSessions looks for new sessions
	// while the workers start, for sessionScanFastFor; then every
	// sessionScanSlow.
	sessionScanFast    = 100 * time.Millisecond
	sessionScanFastFor = time.Minute
	sessionScanSlow    = 5 * time.Second
)

// yieldSessions gives the sessions that processes below the launcher
// start the nice value yieldCPU gave the launcher's session's autogroup.
// torchrun 2.x starts each worker in a session of its own, and where
// autogroups are on (a shell, not a systemd unit) each session is weighed
// against the agent's as a whole, whatever its processes' nice values:
// three workers importing torch at once, each in an autogroup at nice 0,
// took the agents' CPU at a job's start and leases lapsed. It looks often
// while the workers start, then seldom, until quit. On the real clock, not
// the shim's: it paces looks at other processes' progress, which no test
// clock advances.
func yieldSessions(launcher, nice int, quit <-chan struct{}, log *zap.Logger) {
	done := map[int]bool{}
	start := time.Now()
	for {
		every := sessionScanSlow
		if time.Since(start) < sessionScanFastFor {
			every = sessionScanFast
		}
		select {
		case <-quit:
			return
		case <-time.After(every):
		}
		for _, pid := range newSessions(readProcs(""), launcher, done) {
			err := os.WriteFile(fmt.Sprintf("/proc/%d/autogroup", pid), []byte(strconv.Itoa(nice)), 0)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				log.Debug("lowering a worker session's autogroup priority failed", zap.Int("session", pid), zap.Error(err))
			}
		}
	}
}

// newSessions lists the leaders of the sessions below launcher (its
// descendants whose session is their own) that are not in done, and adds
// them to it.
func newSessions(procs []procStat, launcher int, done map[int]bool) []int {
	below := map[int]bool{launcher: true}
	for added := true; added; {
		added = false
		for _, p := range procs {
			if !below[p.pid] && below[p.ppid] {
				below[p.pid], added = true, true
			}
		}
	}
	var leaders []int
	for _, p := range procs {
		if p.pid != launcher && below[p.pid] && p.sid == p.pid && !done[p.pid] {
			done[p.pid] = true
			leaders = append(leaders, p.pid)
		}
	}
	slices.Sort(leaders)
	return leaders
}

// reapOrphans reaps the processes reparented to this shim as they exit:
// every child but the launcher, whose status os/exec collects. Left
// unreaped they would hold their pids until the shim exits, days later
// for a job whose workers start helpers that outlive their parents.
func reapOrphans(launcher int, quit <-chan struct{}) {
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	defer signal.Stop(chld)
	self := os.Getpid()
	for {
		select {
		case <-quit:
			return
		case <-chld:
		}
		for _, pr := range readProcs("") {
			if pr.ppid == self && pr.pid != launcher && pr.state == 'Z' {
				_, _ = unix.Wait4(pr.pid, nil, unix.WNOHANG, nil)
			}
		}
	}
}

// renewal is a lease the agent granted at sent, both on the boot clock.
type renewal struct{ lease, sent int64 }

// stdinBacklog is how many renewals from stdin wait for a starting shim,
// the oldest dropped first: more than a second of them (one every fence
// check), all of which a shim that ran late may still take.
const stdinBacklog = 16

// readLeases passes on the renewals the spawning agent writes to stdin
// (parseRenewal), and closes gone at its end.
func readLeases(r io.Reader, leases chan renewal, gone chan<- struct{}) {
	defer close(gone)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l, ok := parseRenewal(sc.Text())
		if !ok {
			continue
		}
		select {
		case leases <- l:
		default: // full: the oldest goes; the only sender, this finds room
			select {
			case <-leases:
			default:
			}
			leases <- l
		}
	}
}

// parseRenewal parses a stdin renewal line: "LEASE SENT", boot-clock
// nanoseconds, or "LEASE" alone from an agent that predates SENT (during
// an upgrade, an agent still running the old binary starts its shims from
// the new one on disk), whose renewal is of unknown age
// (health.LeaseRenews). Anything else is no renewal.
func parseRenewal(line string) (renewal, bool) {
	f := strings.Fields(line)
	if len(f) < 1 || len(f) > 2 {
		return renewal{}, false
	}
	var n [2]int64
	for i, s := range f {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			return renewal{}, false
		}
		n[i] = v
	}
	return renewal{lease: n[0], sent: n[1]}, true
}

type shimServer struct {
	dir   string
	spec  shimSpec
	proc  Process
	log   *zap.Logger
	clock clockwork.Clock
	boot  func() time.Duration
	conns chan net.Conn
	reqs  chan connRequest
	gone  chan net.Conn
	// spawnerGone is closed when the agent that started the shim closed
	// its stdin, or died; stdinLeases has the latest renewals it wrote
	// there.
	spawnerGone chan struct{}
	stdinLeases chan renewal
	// quit is closed when run returns: no one serves connections after.
	quit chan struct{}
}

type connRequest struct {
	conn net.Conn
	req  shimRequest
}

func (s *shimServer) accept(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return // closed when the shim ends
		}
		select {
		case s.conns <- conn:
		case <-s.quit:
			conn.Close()
			return
		}
	}
}

func (s *shimServer) read(conn net.Conn) {
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		var req shimRequest
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			s.log.Warn("ignoring malformed request", zap.Error(err))
			continue
		}
		select {
		case s.reqs <- connRequest{conn, req}:
		case <-s.quit:
			return
		}
	}
	select {
	case s.gone <- conn:
	case <-s.quit:
	}
}

// run serves the agent until the launcher's group is gone. One agent is
// attached at a time; a newer one replaces the older.
func (s *shimServer) run(ctx context.Context) error {
	defer close(s.quit)
	exited := make(chan shimStatus, 1)
	go func() {
		exit := s.proc.Wait()
		// torchrun is gone; sweep whatever it left in its group before
		// saying the workers are gone.
		if err := s.proc.Kill(0); err != nil {
			s.log.Error("workers left behind", zap.Error(err))
		}
		exited <- shimStatus{Pid: s.proc.Pid(), Exited: true, Exit: exit}
	}()
	var (
		owner   net.Conn
		hold    time.Duration
		reason  string
		orphan  <-chan time.Time
		killing bool
		lease   int64
	)
	kill := func(grace time.Duration, why string) {
		if killing {
			return
		}
		killing, reason = true, why
		go func() { _ = s.proc.Kill(grace) }()
	}
	// Checked only while there is a lease to check.
	var (
		leaseTicker clockwork.Ticker
		leaseCheck  <-chan time.Time
	)
	setLease := func(l int64) {
		lease = l
		if l != 0 && leaseTicker == nil {
			leaseTicker = s.clock.NewTicker(health.LeaseCheckEvery)
			leaseCheck = leaseTicker.Chan()
		}
	}
	defer func() {
		if leaseTicker != nil {
			leaseTicker.Stop()
		}
	}()
	setLease(s.spec.Lease)
	// Each lease the agent grants holds for a loss of the node declared
	// any time after (health.LeaseUntil), so the latest deadline counts,
	// not the latest grant: except a hold's, which holds only until the
	// next agent is heard, and which its first grant replaces.
	held := false
	grant := func(l int64) {
		if held || l > lease {
			held = false
			setLease(l)
		}
	}
	// renew takes a renewal sent at sent unless the lease had lapsed by
	// then (health.LeaseRenews).
	renew := func(l, sent int64) {
		if !killing && health.LeaseRenews(time.Duration(lease), time.Duration(sent), s.boot()) {
			grant(l)
		}
	}
	// late takes, for health.LeaseDrain, the renewals on their way to a
	// shim that found its lease lapsed: run late, it is woken by its clock
	// before it has read its socket or stdin. Other requests are refused,
	// as to a lapsed lease; a kill is done. It reports whether the lease
	// holds again.
	late := func() bool {
		drain := s.clock.NewTimer(health.LeaseDrain)
		defer drain.Stop()
		for time.Duration(lease) <= s.boot() && !killing {
			select {
			case r := <-s.stdinLeases:
				renew(r.lease, r.sent)
			case r := <-s.reqs:
				if r.conn != owner {
					continue
				}
				switch r.req.Op {
				case "lease":
					renew(r.req.Lease, r.req.Sent)
				case "kill":
					kill(r.req.Grace, "")
				}
				s.send(owner, shimStatus{Pid: s.proc.Pid()})
			case <-drain.Chan():
				return false
			}
		}
		return !killing
	}
	// lapsed kills the group once its lease has lapsed and no renewal on
	// its way renews it; checked on every tick and before any request is
	// served, so that a shim stopped with its agent kills its workers
	// first thing when it runs again.
	lapsed := func() bool {
		if lease == 0 || killing || time.Duration(lease) > s.boot() {
			return killing
		}
		if late() {
			return false
		}
		if !killing {
			s.log.Warn("lease lapsed, fencing workers", zap.Duration("lapsed_for", s.boot()-time.Duration(lease)))
			// The agent did not extend it: stalled, or cut off (its
			// self-fence comes at about the same time, by design).
			kill(0, "fenced: lease lapsed (not extended by the agent: stalled or cut off)")
		}
		return true
	}
	// What the agent wrote to stdin while this shim started comes first.
	for pending := true; pending; {
		select {
		case r := <-s.stdinLeases:
			renew(r.lease, r.sent)
		default:
			pending = false
		}
	}
	lapsed()
	orphaned := func() {
		timeout := s.spec.OrphanTimeout
		if hold > 0 {
			timeout, hold = hold, 0
		}
		s.log.Info("agent detached", zap.Duration("orphan_timeout", timeout))
		orphan = s.clock.After(timeout)
	}
	// Before its first attach the agent that started the shim is watched
	// through stdin: orphaned when it dies, not when it is slow.
	spawnerGone, attached := s.spawnerGone, false
	for {
		select {
		case <-spawnerGone:
			spawnerGone = nil
			if !attached {
				orphaned()
			}
		case conn := <-s.conns:
			if owner != nil {
				owner.Close()
			}
			owner, orphan, attached = conn, nil, true
			go s.read(conn)
		case <-leaseCheck:
			lapsed()
		case r := <-s.stdinLeases:
			renew(r.lease, r.sent)
			lapsed()
		case r := <-s.reqs:
			if r.conn != owner {
				continue
			}
			if r.req.Op == "lease" {
				renew(r.req.Lease, r.req.Sent)
			}
			if lapsed() {
				s.send(owner, shimStatus{Pid: s.proc.Pid()})
				continue
			}
			switch r.req.Op {
			case "kill":
				kill(r.req.Grace, "")
			case "hold":
				hold = r.req.Hold
				if lease != 0 && r.req.Lease > lease {
					setLease(r.req.Lease)
					held = true
				}
			}
			s.send(owner, shimStatus{Pid: s.proc.Pid()})
		case conn := <-s.gone:
			conn.Close()
			if conn == owner {
				owner = nil
				orphaned()
			}
		case <-orphan:
			s.log.Warn("no agent attached in time, fencing workers")
			kill(0, "fenced: no agent adopted the workers in time")
		case <-ctx.Done():
			kill(shimTermGrace, "shim terminated")
			ctx = context.Background() // once
		case st := <-exited:
			st.Reason = reason
			if err := writeJSON(filepath.Join(s.dir, shimExitFile), st); err != nil {
				s.log.Error("recording exit status failed", zap.Error(err))
			}
			if owner != nil {
				s.send(owner, st)
				owner.Close()
			}
			s.log.Info("launcher exited", zap.Int("exit_code", st.Exit.Code), zap.String("signal", st.Exit.Signal), zap.String("reason", reason))
			return nil
		}
	}
}

func (s *shimServer) send(conn net.Conn, st shimStatus) {
	b, _ := json.Marshal(st)
	_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(append(b, '\n')); err != nil {
		s.log.Warn("writing to agent failed", zap.Error(err))
	}
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("parsing %s: %w", path, err)
	}
	return nil
}

// writeJSON replaces path atomically, so a reader never sees half a file.
func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("renaming %s: %w", tmp, err)
	}
	return nil
}

// viaDirFD calls f with a short path to the socket name in dir. A socket
// path is limited to 107 bytes, less than a state directory plus a job name
// may take; through an open descriptor of the directory it always fits.
func viaDirFD(dir, name string, f func(path string) error) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return f(fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), name))
}

var errShimGone = errors.New("shim vanished without an exit status")

// workerNice is the job's processes' nice value. They yield the CPU to the
// agent and the shims, whose heartbeats, probe answers and lease renewals
// must not wait behind a job's start (every rank importing torch at once
// on a node with few cores) for the node to stay alive to its peers and
// the controller; the agent takes little of it.
const workerNice = 10

// standbyNice is a warm standby's nice value until its hand-off: the
// lowest priority. A standby prepares (starts Python, imports torch: CPU
// seconds) on the nodes where its job trains, right after each restart:
// it should run on what the workers leave idle and wait while they need
// the CPU, not take an equal share from the job's first steps. Its
// hand-off raises it to workerNice (raisePriority) before it forks the
// workers, which needs CAP_SYS_NICE: without it, standbys start at
// workerNice.
const standbyNice = 19

// yieldCPU lowers the priority of the launcher just started to nice, before
// it forks workers, which inherit it, and of its session's autogroup, which
// is what the scheduler weighs against the agent's where autogroups are on
// (a shell, not a systemd unit). The launcher's session is its own
// (ExecSpawner), not the shim's: the shim enforces the lease and must not
// wait behind what it fences, or it reads its renewals late, finds the
// lease lapsed and kills a healthy generation. Failing either only costs
// the agent its lead.
func yieldCPU(pid, nice int, log *zap.Logger) {
	if err := unix.Setpriority(unix.PRIO_PROCESS, pid, nice); err != nil {
		log.Warn("lowering the launcher's priority failed", zap.Error(err))
	}
	err := os.WriteFile(fmt.Sprintf("/proc/%d/autogroup", pid), []byte(strconv.Itoa(nice)), 0)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Debug("lowering the session's autogroup priority failed", zap.Error(err))
	}
}

// raisePriority gives pid, a standby's process being handed its
// assignment, and its session's autogroup the workers' priority back
// before it forks them. Raising a nice value needs CAP_SYS_NICE
// (canRaisePriority).
func raisePriority(pid int) error {
	if err := unix.Setpriority(unix.PRIO_PROCESS, pid, workerNice); err != nil {
		return fmt.Errorf("raising the standby's priority: %w", err)
	}
	err := os.WriteFile(fmt.Sprintf("/proc/%d/autogroup", pid), []byte(strconv.Itoa(workerNice)), 0)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("raising the standby's autogroup priority: %w", err)
	}
	return nil
}

// canRaisePriority reports whether this process holds CAP_SYS_NICE, which
// raisePriority needs.
func canRaisePriority() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[unix.CAP_SYS_NICE/32].Effective&(1<<(unix.CAP_SYS_NICE%32)) != 0
}

// bootTime reads CLOCK_BOOTTIME, the clock leases are on: shared by every
// process of the node, unmoved by changes to the wall clock, and running
// through a suspend, as the controller's clock does.
func bootTime() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) // cannot fail for this clock
	return time.Duration(ts.Nano())
}
