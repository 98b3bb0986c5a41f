//go:build bench

package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdzv/rdzv/test/netns"
	"github.com/rdzv/rdzv/test/sim"
	"github.com/rdzv/rdzv/test/testpki"
)

const (
	nodeHosts = 3 // h1..h3 train; h0 runs the rdzv controller
	victim    = 3 // h3: node rank 2 under rdzv, and never h1, which holds torchrun's c10d store

	controllerPort    = "7070"
	heartbeatInterval = time.Second
	heartbeatTimeout  = 3 * time.Second
	backoffInitial    = time.Second
	backoffMax        = time.Minute
	agentStopGrace    = 5 * time.Second
	lastCall          = time.Second
	progressTimeout   = 5 * time.Second
	maxRestarts       = 3

	trainSteps      = 400
	stepTime        = "0.05"
	checkpointEvery = 20
	// The fault is injected once every node has passed this step, so a
	// complete checkpoint (step 40) exists to resume from.
	injectAtStep = 50

	systemTorchrun    = "/usr/bin/torchrun" // Debian's python3-torch (BENCH_TORCH=system)
	torchrunStorePort = "29400"

	readyTimeout    = 90 * time.Second
	underWayTimeout = 4 * time.Minute
	ctlTimeout      = 15 * time.Second
	defaultCap      = 120 * time.Second
	jobName         = "bench"
)

var (
	allFaults = []string{"kill-worker", "kill-node", "cut-link", "hang"}
	// rdzv-warm is rdzv with launcher.kind warm (standby workers).
	// nvrx is NVIDIA's ft_launcher, torchft is torchft's lighthouse and
	// Manager (both from BENCH_VENV, see launchers_test.go).
	// rdzv-mem is rdzv-warm with in-memory checkpoints (checkpoint.memory,
	// rdzv.checkpoint.save every step, replicated to the next node).
	allSystems = []string{"rdzv", "rdzv-warm", "rdzv-mem", "torchrun", "nvrx", "torchft"}
)

// result is one measured run.
type result struct {
	system, fault string
	run           int

	recovered bool
	recovery  time.Duration // fault to first step after recovery
	first     tick
	// Steps done again after the resume (see setRecomputed).
	hasRecomputed bool
	recomputed    int

	// rdzv only: the attempt_failed event.
	hasEvent     bool
	detection    time.Duration // its detection_latency field
	toEvent      time.Duration // fault to the event's time
	timeline     string        // the job's events after the fault, as offsets
	phases       []phase       // where the recovery's time went, in order
	note, failed string        // why it did not recover; a setup failure
}

type bench struct {
	controllerBin, agentBin, ctlBin string
	script                          string // bench_worker.py
	torchftScript                   string // bench_torchft.py
	venv                            string // the peers' venv (BENCH_VENV)
	torch                           string // BENCH_TORCH: venv or system
	torchrun, python                string // every system's torchrun and Python ("" python: the launcher's own)
	stateMB                         int    // BENCH_STATE_MB
	goodput, goodputBaseline        time.Duration
	// goodputSpares are hosts beyond the 3 training ones in the goodput
	// run, for the systems that keep spare nodes (goodputUsesSpares).
	goodputSpares int
	// goodputPaired: the faulty run's windows alternate, a fault in one
	// and none in the next, and the fault-free windows are the baseline
	// (BENCH_GOODPUT_PAIRED); no separate baseline run.
	goodputPaired   bool
	runs            int
	cap             time.Duration
	faults, systems []string
	logDir          string
	rdzvConf        string // extra torchrun --rdzv_conf, off by default
}

func TestBenchRecovery(t *testing.T) {
	b := setup(t)
	begin := time.Now()
	var results []result
	for run := 1; run <= b.runs; run++ {
		for _, fault := range b.faults {
			for _, system := range b.systems {
				r := result{system: system, fault: fault, run: run}
				t.Run(fmt.Sprintf("%s/%s/run%d", fault, system, run), func(t *testing.T) {
					start := time.Now()
					switch system {
					case "rdzv", "rdzv-warm", "rdzv-mem":
						b.runRdzv(t, &r)
					default:
						b.runLaunchers(t, &r)
					}
					t.Logf("bench: %s (run took %s)", r.summary(), time.Since(start).Round(time.Second))
				})
				results = append(results, r)
			}
		}
	}
	var goodput []goodputRun
	if b.goodput > 0 {
		for _, system := range b.systems {
			for _, faulty := range []bool{false, true} {
				if b.goodputPaired && !faulty {
					continue
				}
				dur := b.goodput
				if !faulty {
					dur = b.goodputBaseline
				}
				t.Run(fmt.Sprintf("goodput/%s/faults=%v", system, faulty), func(t *testing.T) {
					g := b.runGoodput(t, system, faulty, dur)
					if g.failed != "" {
						t.Errorf("bench: goodput %s: %s", system, g.failed)
					}
					t.Logf("bench: goodput %s faults=%v: %.0f useful steps in %s (%.2f/s)", system, faulty, g.useful, dur, g.rate())
					goodput = append(goodput, g)
				})
			}
		}
	}
	report := b.report(results, time.Since(begin))
	if b.goodput > 0 {
		report += b.goodputReport(goodput)
	}
	t.Logf("\n%s", report)
	if out := os.Getenv("BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(report), 0o644); err != nil {
			t.Errorf("writing BENCH_OUT: %v", err)
		} else {
			t.Logf("bench: report written to %s", out)
		}
	}
}

func setup(t *testing.T) *bench {
	binDir := os.Getenv("RDZV_BIN_DIR")
	if binDir == "" {
		t.Fatal("bench: RDZV_BIN_DIR is not set: run `make bench-recovery`, or `make build` and set RDZV_BIN_DIR to the bin directory")
	}
	binDir, err := filepath.Abs(binDir)
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{
		controllerBin: filepath.Join(binDir, "rdzv-controller"),
		agentBin:      filepath.Join(binDir, "rdzv-agent"),
		ctlBin:        filepath.Join(binDir, "rdzvctl"),
		runs:          1,
		cap:           defaultCap,
		faults:        allFaults,
		systems:       allSystems,
		logDir:        os.Getenv("BENCH_LOG_DIR"),
		rdzvConf:      os.Getenv("BENCH_TORCHRUN_RDZV_CONF"),
	}
	for _, p := range []string{b.controllerBin, b.agentBin, b.ctlBin} {
		if info, err := os.Stat(p); err != nil || info.Mode()&0o111 == 0 {
			t.Fatalf("bench: %s is missing or not executable (run `make build`; torchrun comes with python3-torch)", p)
		}
	}
	if b.script, err = filepath.Abs("bench_worker.py"); err != nil {
		t.Fatal(err)
	}
	b.torchftScript = filepath.Join(filepath.Dir(b.script), "bench_torchft.py")
	b.goodput = defaultGoodput
	if s := os.Getenv("BENCH_GOODPUT"); s != "" {
		if b.goodput, err = time.ParseDuration(s); err != nil || b.goodput < 0 {
			t.Fatalf("bench: BENCH_GOODPUT=%q: want a duration (0: no goodput run)", s)
		}
	}
	b.goodputBaseline = min(b.goodput, 2*time.Minute)
	if s := os.Getenv("BENCH_GOODPUT_BASELINE"); s != "" {
		if b.goodputBaseline, err = time.ParseDuration(s); err != nil || b.goodputBaseline <= 0 {
			t.Fatalf("bench: BENCH_GOODPUT_BASELINE=%q: want a positive duration", s)
		}
	}
	if s := os.Getenv("BENCH_GOODPUT_PAIRED"); s != "" {
		if b.goodputPaired, err = strconv.ParseBool(s); err != nil {
			t.Fatalf("bench: BENCH_GOODPUT_PAIRED=%q: want a boolean (1: fault-free windows between the faulty ones are the baseline)", s)
		}
	}
	b.goodputSpares = defaultGoodputSpares
	if s := os.Getenv("BENCH_GOODPUT_SPARES"); s != "" {
		if b.goodputSpares, err = strconv.Atoi(s); err != nil || b.goodputSpares < 0 || b.goodputSpares > maxGoodputSpares {
			t.Fatalf("bench: BENCH_GOODPUT_SPARES=%q: want 0 to %d (hosts beyond the 3 that train)", s, maxGoodputSpares)
		}
	}
	if s := os.Getenv("BENCH_STATE_MB"); s != "" {
		if b.stateMB, err = strconv.Atoi(s); err != nil || b.stateMB < 0 {
			t.Fatalf("bench: BENCH_STATE_MB=%q: want a non-negative integer (MB)", s)
		}
	}
	if s := os.Getenv("BENCH_RUNS"); s != "" {
		if b.runs, err = strconv.Atoi(s); err != nil || b.runs < 1 {
			t.Fatalf("bench: BENCH_RUNS=%q: want a positive integer", s)
		}
	}
	if s := os.Getenv("BENCH_CAP"); s != "" {
		if b.cap, err = time.ParseDuration(s); err != nil || b.cap <= 0 {
			t.Fatalf("bench: BENCH_CAP=%q: want a positive duration", s)
		}
	}
	subset := func(env string, all []string) []string {
		s := os.Getenv(env)
		if s == "" {
			return all
		}
		var out []string
		for _, f := range strings.Split(s, ",") {
			if !slices.Contains(all, f) {
				t.Fatalf("bench: %s: unknown %q (choose from %s)", env, f, strings.Join(all, ","))
			}
			out = append(out, f)
		}
		return out
	}
	if os.Getenv("BENCH_FAULTS") != "none" { // none: the goodput run only
		b.faults = subset("BENCH_FAULTS", allFaults)
	} else {
		b.faults = nil
	}
	b.systems = subset("BENCH_SYSTEMS", allSystems)
	b.venv = os.Getenv("BENCH_VENV")
	if b.venv == "" {
		b.venv = filepath.Join("..", "..", ".venv")
	}
	if b.venv, err = filepath.Abs(b.venv); err != nil {
		t.Fatal(err)
	}
	// One torch for every system by default: the peers need torch >= 2.7,
	// so everything runs on BENCH_VENV's (the project's primary stack).
	// BENCH_TORCH=system runs rdzv and torchrun elastic on Debian's 1.13
	// (python3-torch), the peers still on the venv's.
	b.torch = os.Getenv("BENCH_TORCH")
	switch b.torch {
	case "", "venv":
		b.torch, b.torchrun, b.python = "venv", b.venvBin("torchrun"), b.venvBin("python")
	case "system":
		b.torchrun = systemTorchrun
	default:
		t.Fatalf("bench: BENCH_TORCH=%q: want venv or system", b.torch)
	}
	if info, err := os.Stat(b.torchrun); err != nil || info.Mode()&0o111 == 0 {
		t.Fatalf("bench: %s is missing or not executable (BENCH_TORCH=%s; set BENCH_VENV, or BENCH_TORCH=system for python3-torch's)", b.torchrun, b.torch)
	}
	for _, s := range b.systems {
		need := map[string][]string{"nvrx": {"ft_launcher"}, "torchft": {"torchrun", "torchft_lighthouse"}}[s]
		for _, bin := range need {
			if _, err := os.Stat(b.venvBin(bin)); err != nil {
				t.Fatalf("bench: system %s needs %s (python/requirements/peers.txt, installed by `make venv`); set BENCH_VENV to a venv that has it", s, b.venvBin(bin))
			}
		}
	}
	if b.logDir != "" {
		if err := os.MkdirAll(b.logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// runDirs is one run's scratch: process logs, tick files, hang requests and
// checkpoints. Every host sees the same file system, like shared storage.
type runDirs struct{ root, ticks, hang, ckpt string }

func (b *bench) dirs(t *testing.T, r *result) runDirs {
	root := t.TempDir()
	if b.logDir != "" {
		root = filepath.Join(b.logDir, fmt.Sprintf("%s-%s-run%d", r.fault, r.system, r.run))
		if err := os.RemoveAll(root); err != nil {
			t.Fatal(err)
		}
	}
	d := runDirs{root: root, ticks: filepath.Join(root, "ticks"), hang: filepath.Join(root, "hang"), ckpt: filepath.Join(root, "ckpt")}
	for _, p := range []string{d.ticks, d.hang, d.ckpt} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func trainArgs(steps int) []string {
	return []string{"--steps", strconv.Itoa(steps), "--step-time", stepTime, "--checkpoint-every", strconv.Itoa(checkpointEvery)}
}

// killAll ends the run at once: every process on every host gets SIGKILL,
// so the harness's graceful teardown finds nothing left to wait for.
func killAll(net *netns.Cluster) {
	for i := net.Hosts() - 1; i >= 0; i-- {
		_, _ = killNamespace(net.Host(i).NS)
	}
}

// rdzvCluster is the controller on h0 and an agent on each of h1..h<hosts>,
// registered and ready.
type rdzvCluster struct {
	ctl     func(args ...string) (string, error) // rdzvctl on h0
	daemons []*netns.Proc                        // the controller, then the agents
	// startAgent starts host i's agent (again, after a kill-node);
	// agents[i] is the latest one started there.
	startAgent func(i int) *netns.Proc
	agents     map[int]*netns.Proc
	diagnose   func() // logs status, events and log tails
}

// startRdzv starts the controller and the agents with mutual TLS as in
// production and waits until every agent is ready.
func (b *bench) startRdzv(t *testing.T, net *netns.Cluster, d runDirs, hosts int) (*rdzvCluster, error) {
	h0 := net.Host(0)
	addr := h0.IP + ":" + controllerPort
	// Mutual TLS as in production: certificates from `rdzvctl pki`, one
	// per agent host, and an operator's for rdzvctl (in its --tls-dir).
	pkiDir := filepath.Join(d.root, "pki")
	testpki.Run(t, b.ctlBin, "init", "--dir", pkiDir)
	testpki.Run(t, b.ctlBin, "issue", "controller", "rdzv-controller", "--ip", h0.IP, "--dir", pkiDir)
	testpki.Run(t, b.ctlBin, "issue", "operator", "bench", "--dir", pkiDir, "--out", filepath.Join(pkiDir, "rdzvctl"))
	c := &rdzvCluster{ctl: func(args ...string) (string, error) { return ctl(h0, b.ctlBin, addr, pkiDir, ctlTimeout, args...) },
		agents: map[int]*netns.Proc{}}

	ctrl := h0.Start(t, "controller", nil, append([]string{b.controllerBin, "--listen", addr,
		"--heartbeat-interval", heartbeatInterval.String(), "--heartbeat-timeout", heartbeatTimeout.String(),
		"--data-dir", filepath.Join(d.root, "controller-data")},
		testpki.DaemonArgs(pkiDir, "controller", "rdzv-controller")...)...)
	c.daemons = []*netns.Proc{ctrl}
	for i := 1; i <= hosts; i++ {
		testpki.Run(t, b.ctlBin, "issue", "agent", net.Host(i).Name, "--dir", pkiDir)
	}
	c.startAgent = func(i int) *netns.Proc {
		h := net.Host(i)
		p := h.Start(t, "agent", nil, append([]string{b.agentBin, "--controller", addr,
			"--state-dir", filepath.Join(d.root, h.Name), "--stop-grace", agentStopGrace.String(),
			// train.py writes checkpoints into root-owned directories.
			"--run-as", "root", "--allow-root"},
			testpki.DaemonArgs(pkiDir, "agent", h.Name)...)...)
		c.daemons = append(c.daemons, p)
		c.agents[i] = p
		return p
	}
	for i := 1; i <= hosts; i++ {
		c.startAgent(i)
	}
	c.diagnose = func() {
		for _, args := range [][]string{{"status", jobName}, {"events", jobName}, {"events"}} {
			out, err := c.ctl(args...)
			t.Logf("bench: rdzvctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		for i := 1; i <= hosts; i++ {
			h := net.Host(i)
			t.Logf("bench: last lines of %s's job log:\n%s", h.Name, sim.TailFile(filepath.Join(d.root, h.Name, "logs", jobName+".log"), 25))
		}
		for _, p := range c.daemons {
			t.Logf("bench: last lines of %s:\n%s", p.LogPath(), sim.TailFile(p.LogPath(), 25))
		}
	}

	// Agents registered and ready.
	deadline := time.Now().Add(readyTimeout)
	for {
		out, err := c.ctl("-o", "json", "nodes")
		var nodes nodesJSON
		if err == nil && decode(out, &nodes) == nil {
			ready := 0
			for _, n := range nodes.Nodes {
				if n.State == "NODE_STATE_READY" {
					ready++
				}
			}
			if ready == hosts {
				return c, nil
			}
		}
		if time.Now().After(deadline) {
			return c, fmt.Errorf("agents not ready within %s: %v %s", readyTimeout, err, out)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (b *bench) runRdzv(t *testing.T, r *result) {
	d := b.dirs(t, r)
	net := netns.NewCluster(t, 1+nodeHosts, filepath.Join(d.root, "proc-logs"))
	defer killAll(net)
	rc, err := b.startRdzv(t, net, d, nodeHosts)
	ctlRun, diagnose := rc.ctl, rc.diagnose
	fail := func(format string, args ...any) {
		r.failed = fmt.Sprintf(format, args...)
		t.Errorf("bench: %s", r.failed)
		diagnose()
	}
	if err != nil {
		fail("%v", err)
		return
	}

	gaveUp, err := b.startRdzvJob(rc, d, trainSteps, r.system, maxRestarts)
	if err != nil {
		fail("%v", err)
		return
	}

	before, err := waitUnderWay(d.ticks, gaveUp)
	if err != nil {
		fail("%v", err)
		return
	}
	if r.system != "rdzv" {
		// The standby that replaces the one the job started with imports
		// torch for seconds after the start: a fault before it is ready
		// measures a fresh start, not a warm one. In production faults
		// come hours apart.
		if err := waitStandbys(d.root, gaveUp); err != nil {
			fail("%v", err)
			return
		}
		if before, err = waitUnderWay(d.ticks, gaveUp); err != nil {
			fail("%v", err)
			return
		}
	}
	t0, what, err := b.inject(net, r.fault, d, before, victim)
	if err != nil {
		fail("injecting %s: %v", r.fault, err)
		return
	}
	t.Logf("bench: injected %s at %s: %s (h3 was at step %d, generation %s)", r.fault, t0.Format("15:04:05.000"), what, before[net.Host(victim).Name].step, before[net.Host(victim).Name].gen)

	first, ok, why := waitRecovery(d.ticks, t0, b.cap, gaveUp)
	r.recovered, r.first, r.note = ok, first, why
	if ok {
		r.recovery = first.time().Sub(t0)
		r.setRecomputed(readTicks(d.ticks), t0)
		if first.gen == before[net.Host(victim).Name].gen {
			r.note = "first step after the fault came from the failed generation " + first.gen
		}
	}

	out, err := ctlRun("-o", "json", "events", jobName)
	var evs struct {
		Events []eventJSON `json:"events"`
	}
	if err == nil {
		err = decode(out, &evs)
	}
	if err != nil {
		t.Errorf("bench: reading events: %v", err)
	}
	var timeline []string
	failedGen, _ := strconv.ParseUint(before[net.Host(victim).Name].gen, 10, 64)
	var stopped, committed, launched time.Time
	for _, ev := range evs.Events {
		if ev.Time.Before(t0) {
			continue
		}
		switch {
		case ev.Kind == "workers_exited" && ev.Generation == failedGen:
			stopped = later(stopped, ev.Time)
		case ev.Kind == "rendezvous_committed" && committed.IsZero():
			committed = ev.Time
		case ev.Kind == "workers_running" && ev.Generation > failedGen:
			launched = later(launched, ev.Time)
		}
	}
	for _, ev := range evs.Events {
		if ev.Time.Before(t0) {
			continue
		}
		switch ev.Kind {
		case "checkpoint_recorded":
			continue
		}
		node := ""
		if ev.Node != "" {
			node = " " + ev.Node
		}
		timeline = append(timeline, fmt.Sprintf("+%ss %s%s", secs(ev.Time.Sub(t0)), ev.Kind, node))
		if ev.Kind == "attempt_failed" && !r.hasEvent {
			r.hasEvent, r.toEvent = true, ev.Time.Sub(t0)
			if ev.DetectionLatency != nil {
				if r.detection, err = parseProtoDuration(*ev.DetectionLatency); err != nil {
					t.Errorf("bench: attempt_failed detection_latency: %v", err)
				}
			}
			t.Logf("bench: attempt_failed: %s", ev.Message)
		}
	}
	if r.hasEvent {
		r.phases = append(r.phases, phase{"detect", r.toEvent})
	}
	for _, p := range []struct {
		name string
		at   time.Time
	}{{"stopped", stopped}, {"commit", committed}, {"launched", launched}} {
		if !p.at.IsZero() {
			r.phases = append(r.phases, phase{p.name, p.at.Sub(t0)})
		}
	}
	r.phases = append(r.phases, workerPhases(readPhases(d.ticks), t0)...)
	if ok {
		r.phases = append(r.phases, phase{"step", r.recovery})
		timeline = append(timeline, fmt.Sprintf("+%ss first step (step %d, generation %s, %s)", secs(r.recovery), first.step, first.gen, first.host))
	}
	r.timeline = strings.Join(timeline, ", ")
	if !ok {
		t.Logf("bench: rdzv did not recover from %s: %s", r.fault, why)
		diagnose()
	}
}

// startRdzvJob starts the benchmark's job on c and returns its gaveUp: the
// job ending (it should not, short of its last step), polling the controller
// at most every 2s to spare the two cores.
func (b *bench) startRdzvJob(c *rdzvCluster, d runDirs, steps int, system string, restarts int) (func() string, error) {
	jobPath := filepath.Join(d.root, "job.yaml")
	if err := os.WriteFile(jobPath, b.rdzvJob(d, trainArgs(steps), system, restarts), 0o644); err != nil {
		return nil, err
	}
	if out, err := c.ctl("start", jobPath); err != nil {
		return nil, fmt.Errorf("rdzvctl start: %w %s", err, out)
	}
	var lastPoll time.Time
	return func() string {
		if time.Since(lastPoll) < 2*time.Second {
			return ""
		}
		lastPoll = time.Now()
		out, err := c.ctl("-o", "json", "status", jobName)
		var j jobJSON
		if err != nil || decode(out, &j) != nil {
			return ""
		}
		switch j.State {
		case "JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED", "JOB_STATE_STOPPED":
			return fmt.Sprintf("job ended %s: %s", j.State, j.Reason)
		}
		return ""
	}, nil
}

// rdzvJob is the job file: JSON, which is YAML too.
// rdzvJob is the job of system rdzv (launcher.kind torchrun), rdzv-warm
// (warm) or rdzv-mem (warm, and an in-memory checkpoint every step).
func (b *bench) rdzvJob(d runDirs, train []string, system string, restarts int) []byte {
	if system == "rdzv-mem" {
		train = append(slices.Clone(train), "--memory-every", "1")
	}
	spec := map[string]any{
		"name":           jobName,
		"nodes":          map[string]any{"min": nodeHosts - 1, "max": nodeHosts},
		"procs_per_node": 1,
		"command":        append([]string{filepath.Base(b.script)}, train...),
		"workdir":        filepath.Dir(b.script),
		"env": map[string]string{
			"OMP_NUM_THREADS": "1",
			"BENCH_TICK_DIR":  d.ticks,
			"BENCH_HANG_DIR":  d.hang,
			"BENCH_STATE_MB":  strconv.Itoa(b.stateMB),
		},
		"checkpoint": map[string]any{"dir": d.ckpt},
		"rendezvous": map[string]any{"last_call": lastCall.String(), "timeout": "5m"},
		"restart": map[string]any{"max_restarts": restarts,
			"backoff": map[string]any{"initial": backoffInitial.String(), "max": backoffMax.String()}},
		"health": map[string]any{"progress_timeout": progressTimeout.String()},
		"launcher": map[string]any{
			"torchrun":   b.torchrun,
			"extra_args": []string{"--redirects", "2", "--tee", "2", "--log_dir", filepath.Join(d.root, "torchrun-logs"), "--monitor_interval", "1"},
		},
	}
	if b.python != "" {
		// The venv's Python has no rdzv installed: its standbys and
		// workers import this checkout's.
		spec["env"].(map[string]string)["PYTHONPATH"] = filepath.Join(filepath.Dir(b.script), "..", "..", "python", "src")
	}
	if system == "rdzv-mem" {
		spec["checkpoint"] = map[string]any{"dir": d.ckpt, "memory": map[string]any{"replicas": 1, "replicated": true}}
	}
	if system != "rdzv" {
		spec["launcher"] = map[string]any{"kind": "warm"}
		if b.python != "" {
			spec["launcher"].(map[string]any)["python"] = b.python
		}
	}
	data, _ := json.MarshalIndent(spec, "", "  ")
	return data
}

// waitUnderWay waits until every node's worker has passed injectAtStep and
// returns each host's latest tick.
func waitUnderWay(tickDir string, gaveUp func() string) (map[string]tick, error) {
	deadline := time.Now().Add(underWayTimeout)
	for {
		latest := latestStepByHost(readTicks(tickDir))
		n := 0
		for _, k := range latest {
			if k.step >= injectAtStep {
				n++
			}
		}
		if n == nodeHosts {
			return latest, nil
		}
		if why := gaveUp(); why != "" {
			return nil, fmt.Errorf("before the fault: %s", why)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("training not past step %d on all %d nodes within %s; latest ticks: %+v", injectAtStep, nodeHosts, underWayTimeout, latest)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitStandbys waits until every training host has a warm standby ready:
// its socket, which the standby binds once it has imported the preload
// modules and removes when it is handed an assignment, is in the agent's
// state directory (state_dir/warm/JOB/).
func waitStandbys(root string, gaveUp func() string) error {
	deadline := time.Now().Add(underWayTimeout)
	for {
		ready := 0
		for i := 1; i <= nodeHosts; i++ {
			socks, _ := filepath.Glob(filepath.Join(root, fmt.Sprintf("h%d", i), "warm", jobName, "standby-*.sock"))
			if len(socks) > 0 {
				ready++
			}
		}
		if ready == nodeHosts {
			return nil
		}
		if why := gaveUp(); why != "" {
			return fmt.Errorf("before the fault: %s", why)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("warm standbys ready on %d of %d nodes within %s", ready, nodeHosts, underWayTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitRecovery waits for the first step of a worker started after t0.
func waitRecovery(tickDir string, t0 time.Time, limit time.Duration, gaveUp func() string) (tick, bool, string) {
	return waitFor(tickDir, t0, limit, gaveUp, firstTickAfter)
}

// inject applies the fault to h3 and returns when it took effect (taken
// just before the action) and what was done.
func (b *bench) inject(net *netns.Cluster, fault string, d runDirs, before map[string]tick, v int) (time.Time, string, error) {
	h := net.Host(v)
	switch fault {
	case "kill-worker":
		pid := before[h.Name].pid
		// bench_worker.py, or bench_torchft.py under torchft.
		if cl := cmdline(pid); !strings.Contains(cl, filepath.Base(b.script)) && !strings.Contains(cl, filepath.Base(b.torchftScript)) {
			return time.Time{}, "", fmt.Errorf("pid %d of %s's latest tick is not a worker: %q", pid, h.Name, cl)
		}
		t0 := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return time.Time{}, "", err
		}
		return t0, fmt.Sprintf("SIGKILL to worker pid %d on %s", pid, h.Name), nil
	case "kill-node":
		t0 := time.Now()
		n, err := killNamespace(h.NS)
		return t0, fmt.Sprintf("SIGKILL to all %d processes on %s", n, h.Name), err
	case "cut-link":
		t0 := time.Now()
		return t0, fmt.Sprintf("link of %s down (%s)", h.Name, h.Veth), net.CutLink(v)
	case "hang":
		t0 := time.Now()
		p := filepath.Join(d.hang, "hang-"+h.Name)
		return t0, "asked " + h.Name + "'s worker to stop stepping without exiting", os.WriteFile(p, nil, 0o644)
	}
	return time.Time{}, "", fmt.Errorf("unknown fault %q", fault)
}

func (r result) summary() string {
	s := fmt.Sprintf("%s %s run %d: ", r.system, r.fault, r.run)
	switch {
	case r.failed != "":
		return s + "ERROR: " + r.failed
	case r.recovered:
		s += fmt.Sprintf("recovered in %ss", secs(r.recovery))
	default:
		s += "did not recover: " + r.note
	}
	if r.hasEvent {
		s += fmt.Sprintf("; attempt_failed %ss after the fault, detection_latency %ss", secs(r.toEvent), secs(r.detection))
	}
	if len(r.phases) > 0 {
		s += "; phases " + phaseList(r.phases)
	}
	if r.timeline != "" {
		s += "; " + r.timeline
	}
	if r.recovered && r.note != "" {
		s += "; NOTE " + r.note
	}
	return s
}

// stats summarises the runs of one fault and system.
type stats struct {
	n, recovered, errors int
	recovery, detection  time.Duration
	toEvent              time.Duration
	events               int
	recomputed           int // median steps recomputed
	recomputedRuns       int
}

func summarise(results []result, system, fault string) stats {
	var s stats
	var rec, det, ev, redo []time.Duration
	for _, r := range results {
		if r.system != system || r.fault != fault {
			continue
		}
		if r.failed != "" {
			s.errors++
			continue
		}
		s.n++
		if r.recovered {
			s.recovered++
			rec = append(rec, r.recovery)
		}
		if r.hasRecomputed {
			s.recomputedRuns++
			redo = append(redo, time.Duration(r.recomputed))
		}
		if r.hasEvent {
			s.events++
			det = append(det, r.detection)
			ev = append(ev, r.toEvent)
		}
	}
	s.recovery, s.detection, s.toEvent = median(rec), median(det), median(ev)
	s.recomputed = int(median(redo))
	return s
}

func (b *bench) recoveryCell(s stats) string {
	switch {
	case s.n == 0 && s.errors == 0:
		return "not run"
	case s.n == 0:
		return fmt.Sprintf("error (%d runs)", s.errors)
	case s.recovered == 0:
		return fmt.Sprintf("no recovery within %s (0/%d)", b.cap, s.n)
	}
	cell := fmt.Sprintf("%s (%d/%d)", secs(s.recovery), s.recovered, s.n)
	if s.errors > 0 {
		cell += fmt.Sprintf(", %d errors", s.errors)
	}
	return cell
}

// peerTargets prints issue 32's recovery target: rdzv, in its default
// configuration (rdzv-warm: what a script job without a launcher section
// gets) and its best (per fault, the fastest of the rdzv systems run),
// ahead of every peer on fault → first step, as a ratio in the same run.
// A configuration not run in this invocation has no line.
func (b *bench) peerTargets(w *strings.Builder, results []result) {
	for _, fault := range b.faults {
		def := summarise(results, "rdzv-warm", fault)
		best, bestName := def, "rdzv-warm"
		for _, name := range []string{"rdzv", "rdzv-mem"} {
			if alt := summarise(results, name, fault); alt.recovered > 0 && (best.recovered == 0 || alt.recovery < best.recovery) {
				best, bestName = alt, name
			}
		}
		for _, peer := range []string{"torchrun", "nvrx", "torchft"} {
			ps := summarise(results, peer, fault)
			if ps.n == 0 {
				continue
			}
			for _, c := range []struct {
				label string
				s     stats
			}{{"default (rdzv-warm)", def}, {"best (" + bestName + ")", best}} {
				switch {
				case c.s.n == 0:
					continue
				case c.s.recovered == 0:
					fmt.Fprintf(w, "- %s: rdzv %s ahead of %s: rdzv did not recover (NOT met)\n", fault, c.label, peer)
					continue
				}
				ahead := ps.recovered == 0 || ps.recovery > c.s.recovery
				fmt.Fprintf(w, "- %s: rdzv %s ahead of %s on fault → first step: %s (%s)\n", fault, c.label, peer, b.ratio(ps, c.s), met(ahead))
			}
		}
	}
}

// ratio is a peer's median recovery over a system's: how many times faster
// the system recovered in the same run.
func (b *bench) ratio(peer, sys stats) string {
	switch {
	case sys.recovered == 0 || peer.n == 0:
		return "-"
	case peer.recovered == 0:
		return fmt.Sprintf("> %.1fx (peer did not recover)", b.cap.Seconds()/sys.recovery.Seconds())
	}
	return fmt.Sprintf("%.2fx", peer.recovery.Seconds()/sys.recovery.Seconds())
}

func (b *bench) report(results []result, took time.Duration) string {
	var w strings.Builder
	fmt.Fprintf(&w, "rdzv recovery benchmark: seconds from fault injection to the first training step after recovery\n")
	fmt.Fprintf(&w, "median of %d run(s) per cell; (k/n) = runs that recovered within %s / runs\n\n", b.runs, b.cap)
	peers := []string{}
	for _, p := range []string{"torchrun", "nvrx", "torchft"} {
		if slices.Contains(b.systems, p) {
			peers = append(peers, p)
		}
	}
	fmt.Fprintf(&w, "| fault | system | recovery s | steps recomputed | detection s | fault→attempt_failed s |")
	for _, p := range peers {
		fmt.Fprintf(&w, " %s / system |", p)
	}
	fmt.Fprintf(&w, "\n|%s\n", strings.Repeat(" --- |", 6+len(peers)))
	summaries := map[string][2]stats{}
	for _, fault := range b.faults {
		for _, system := range b.systems {
			rd := summarise(results, system, fault)
			if system == "rdzv" {
				summaries[fault] = [2]stats{rd, summarise(results, "torchrun", fault)}
			}
			det, toEv, recomputed := "-", "-", "-"
			if rd.events > 0 {
				det, toEv = secs(rd.detection), secs(rd.toEvent)
			}
			if rd.recomputedRuns > 0 {
				recomputed = strconv.Itoa(rd.recomputed)
			}
			fmt.Fprintf(&w, "| %s | %s | %s | %s | %s | %s |", fault, system, b.recoveryCell(rd), recomputed, det, toEv)
			for _, p := range peers {
				cell := "-"
				if strings.HasPrefix(system, "rdzv") {
					cell = b.ratio(summarise(results, p, fault), rd)
				}
				fmt.Fprintf(&w, " %s |", cell)
			}
			fmt.Fprintf(&w, "\n")
		}
	}

	fmt.Fprintf(&w, "\nPhases (median seconds after the fault at which each was reached; see Columns):\n\n")
	fmt.Fprintf(&w, "| fault | system | %s |\n", strings.Join(phaseNames, " | "))
	fmt.Fprintf(&w, "|%s\n", strings.Repeat(" --- |", len(phaseNames)+2))
	for _, fault := range b.faults {
		for _, system := range b.systems {
			cells := make([]string, len(phaseNames))
			for i, name := range phaseNames {
				var ats []time.Duration
				for _, r := range results {
					if r.fault != fault || r.system != system || r.failed != "" {
						continue
					}
					for _, p := range r.phases {
						if p.name == name {
							ats = append(ats, p.at)
						}
					}
				}
				cells[i] = "-"
				if len(ats) > 0 {
					cells[i] = secs(median(ats))
				}
			}
			fmt.Fprintf(&w, "| %s | %s | %s |\n", fault, system, strings.Join(cells, " | "))
		}
	}

	fmt.Fprintf(&w, "\nTargets (figures, not assertions):\n")
	b.peerTargets(&w, results)
	if s, ok := summaries["kill-node"]; ok && s[0].recovered > 0 && s[1].n > 0 {
		if s[1].recovered > 0 {
			r := s[1].recovery.Seconds() / s[0].recovery.Seconds()
			fmt.Fprintf(&w, "- kill-node at least 5x faster than torchrun: %.1fx (%s)\n", r, met(r >= 5))
		} else {
			fmt.Fprintf(&w, "- kill-node at least 5x faster than torchrun: torchrun did not recover within %s (met)\n", b.cap)
		}
	}
	if s, ok := summaries["cut-link"]; ok && s[0].n > 0 {
		if s[0].recovered > 0 {
			fmt.Fprintf(&w, "- cut-link recovered in under 10 s: %ss (%s)\n", secs(s[0].recovery), met(s[0].recovery < 10*time.Second))
		} else {
			fmt.Fprintf(&w, "- cut-link recovered in under 10 s: rdzv did not recover (not met)\n")
		}
	}
	for _, fault := range []string{"kill-worker", "kill-node", "cut-link"} {
		if s, ok := summaries[fault]; ok && s[0].events > 0 {
			fmt.Fprintf(&w, "- detection under 3 s, %s: fault→attempt_failed %ss (%s); event detection_latency %ss (%s)\n", fault,
				secs(s[0].toEvent), met(s[0].toEvent < 3*time.Second), secs(s[0].detection), met(s[0].detection < 3*time.Second))
		}
	}
	fmt.Fprintf(&w, "  (for a lost node detection_latency counts from its last heartbeat, which precedes the fault by up to a heartbeat\n")
	fmt.Fprintf(&w, "  interval (%s); fault→attempt_failed is the latency an outside observer sees)\n", heartbeatInterval)
	if s, ok := summaries["hang"]; ok && s[0].events > 0 {
		fmt.Fprintf(&w, "- hang: fault→attempt_failed %ss includes health.progress_timeout (%s); detection_latency (%ss) is the time past that timeout\n",
			secs(s[0].toEvent), progressTimeout, secs(s[0].detection))
	}

	fmt.Fprintf(&w, "\nColumns:\n")
	fmt.Fprintf(&w, "- recovery: fault injection to the first step of a worker process started after the fault; both systems are observed the same way,\n")
	fmt.Fprintf(&w, "  by TICK lines that test/bench/bench_worker.py (a hook around examples/train.py's per-step report) writes with a timestamp.\n")
	fmt.Fprintf(&w, "- rdzv detection: detection_latency of the attempt_failed event, as the controller computes it: from torchrun's exit as the\n")
	fmt.Fprintf(&w, "  agent saw it (not from the worker's death), from the lost node's last heartbeat (up to one heartbeat interval before the\n")
	fmt.Fprintf(&w, "  fault), or for a hang the time past health.progress_timeout.\n")
	fmt.Fprintf(&w, "- rdzv fault→attempt_failed: the event's time minus the injection time, i.e. detection as seen from outside.\n")
	fmt.Fprintf(&w, "- phases (rdzv, from the controller's events): detect = attempt_failed; stopped = the failed generation's\n")
	fmt.Fprintf(&w, "  workers_exited (its survivors gone); commit = rendezvous_committed (after fencing, backoff and last call);\n")
	fmt.Fprintf(&w, "  launched = the new generation's workers_running (torchrun running on every node). Both systems, from the\n")
	fmt.Fprintf(&w, "  workers' PHASE lines: python = first new worker process up; torch = last one to have imported torch;\n")
	fmt.Fprintf(&w, "  pg = last one with its process group up (init_process_group returned); step = the first step after recovery.\n")
	fmt.Fprintf(&w, "- torchft: recovery = fault to the survivors' first step committed in a new quorum (they never restart; a step\n")
	fmt.Fprintf(&w, "  in flight that still commits in the old quorum does not count); rejoin = the victim's restarted replica group's\n")
	fmt.Fprintf(&w, "  first committed step, after healing from a live peer (python/torch/pg are its start-up); waited for up to %s.\n", rejoinWait)
	fmt.Fprintf(&w, "- steps recomputed: the furthest step any worker finished before the fault minus the step the first step after\n")
	fmt.Fprintf(&w, "  recovery continues from (restart-based systems resume from the newest complete checkpoint; torchft from a peer).\n")
	fmt.Fprintf(&w, "- X / system: X's median recovery over the row's, for rdzv's rows (> 1: rdzv faster).\n")

	fmt.Fprintf(&w, "\nSettings:\n")
	fmt.Fprintf(&w, "- hosts: network namespaces on one machine (test/netns), h0 the rdzv controller, h1..h3 training nodes; fault on h3\n")
	fmt.Fprintf(&w, "  (node rank 2 under rdzv; torchrun's c10d store lives on h1, so the victim is never h1 and the store survives)\n")
	fmt.Fprintf(&w, "- workload: examples/train.py (via test/bench/bench_worker.py), 3 nodes x 1 process, gloo on eth0, OMP_NUM_THREADS=1,\n")
	fmt.Fprintf(&w, "  --steps %d --step-time %s --checkpoint-every %d; fault once every node has passed step %d (newest complete checkpoint: step %d)\n",
		trainSteps, stepTime, checkpointEvery, injectAtStep, injectAtStep/checkpointEvery*checkpointEvery)
	fmt.Fprintf(&w, "- faults: kill-worker = SIGKILL of h3's worker python; kill-node = SIGKILL of every process on h3 (rdzv: agent, torchrun,\n")
	fmt.Fprintf(&w, "  worker; baseline: torchrun, worker); cut-link = h3's link down; hang = h3's worker stops stepping without exiting\n")
	fmt.Fprintf(&w, "- rdzv: controller with embedded etcd, heartbeat interval %s, heartbeat timeout %s; agent stop_grace %s;\n", heartbeatInterval, heartbeatTimeout, agentStopGrace)
	fmt.Fprintf(&w, "  job nodes {min: %d, max: %d}, rendezvous.last_call %s, restart.max_restarts %d, restart.backoff {initial: %s, max: %s},\n",
		nodeHosts-1, nodeHosts, lastCall, maxRestarts, backoffInitial, backoffMax)
	fmt.Fprintf(&w, "  health.progress_timeout %s; launcher %s --redirects 2 --tee 2 --monitor_interval 1; resume from RDZV_RESUME_FROM\n", progressTimeout, b.torchrun)
	fmt.Fprintf(&w, "- rdzv-warm: the same rdzv job with launcher {kind: warm} (standby workers with torch imported, no torchrun)\n")
	fmt.Fprintf(&w, "- rdzv-mem: rdzv-warm with checkpoint.memory (replicas 1, replicated: DDP's state) and an in-memory checkpoint (rdzv.checkpoint.save) every step\n")
	fmt.Fprintf(&w, "- torchrun elastic: %s --nnodes=1:3 --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint=<h1>:%s --rdzv_id=bench\n", b.torchrun, torchrunStorePort)
	fmt.Fprintf(&w, "  --max_restarts=3 --redirects 2 --tee 2 --monitor_interval 1, GLOO_SOCKET_IFNAME=eth0, c10d rendezvous defaults (torch 1.13:\n")
	fmt.Fprintf(&w, "  last_call_timeout 30s, join_timeout 600s, keep-alive every 5s, 3 misses); restarted workers resume from the newest complete checkpoint\n")
	if b.rdzvConf != "" {
		fmt.Fprintf(&w, "  NOT the defaults in this run: --rdzv_conf=%s (BENCH_TORCHRUN_RDZV_CONF)\n", b.rdzvConf)
	}
	fmt.Fprintf(&w, "- nvrx (nvidia-resiliency-ext ft_launcher): --nnodes=2:3 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=<h1>:%s\n", torchrunStorePort)
	fmt.Fprintf(&w, "  --rdzv-conf=%s --max-restarts=%d --ft-restart-policy=any-failed --workers-stop-timeout=%s\n", nvrxRdzvConf, maxRestarts, nvrxWorkersStopTimeout)
	fmt.Fprintf(&w, "  --ft-initial-rank-heartbeat-timeout=%s --ft-rank-heartbeat-timeout=%s --ft-workload-check-interval=%s\n", nvrxInitialHeartbeatTimeout, nvrxHeartbeatTimeout, nvrxCheckInterval)
	fmt.Fprintf(&w, "  --ft-node-health-check-interval=%s --ft-enable-nic-monitor=false; workers send a rank heartbeat every step\n", nvrxCheckInterval)
	fmt.Fprintf(&w, "  (RankMonitorClient) and resume from the newest complete checkpoint\n")
	fmt.Fprintf(&w, "- torchft: torchft_lighthouse on h0 --min_replicas %d --heartbeat_timeout_ms %d --join_timeout_ms %d --quorum_tick_ms %d;\n",
		torchftMinReplicas, torchftHeartbeatTimeout.Milliseconds(), torchftJoinTimeout.Milliseconds(), torchftQuorumTick.Milliseconds())
	fmt.Fprintf(&w, "  one replica group per host (torchrun --nnodes=1 --max_restarts=%d), test/bench/bench_torchft.py: Manager(min_replica_size 2,\n", maxRestarts)
	fmt.Fprintf(&w, "  timeout 5s, quorum_timeout 30s, async quorum), torchft DDP and ProcessGroupGloo, same model, data, step time, checkpoints\n")
	fmt.Fprintf(&w, "- torch: rdzv and torchrun elastic %s (%s), nvrx and torchft the venv's (BENCH_TORCH); large state: %d MB extra in every checkpoint (BENCH_STATE_MB)\n", b.torch, b.torchrun, b.stateMB)
	fmt.Fprintf(&w, "- cap: %s per fault (BENCH_CAP); runs: %d (BENCH_RUNS); total time %s\n", b.cap, b.runs, took.Round(time.Second))

	fmt.Fprintf(&w, "\nRuns:\n")
	for _, r := range results {
		fmt.Fprintf(&w, "- %s\n", r.summary())
	}
	return w.String()
}

// phaseNames orders the phases of a recovery (see the report's Columns).
var phaseNames = []string{"detect", "stopped", "commit", "launched", "python", "torch", "pg", "step", "rejoin"}

func phaseList(ps []phase) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = fmt.Sprintf("%s +%s", p.name, secs(p.at))
	}
	return strings.Join(out, ", ")
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}
