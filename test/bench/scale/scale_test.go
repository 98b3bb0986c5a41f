//go:build bench

package scale

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/health"
	"github.com/rdzv/rdzv/jobspec"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/test/sim"
)

const (
	jobName = "scale"

	// Hang guards, not targets: a phase that has not finished by then is
	// reported as not finished, and the run for that size ends.
	startCap      = time.Minute
	registerCap   = 5 * time.Minute
	rendezvousCap = 3 * time.Minute
	recoveryCap   = 3 * time.Minute
	stopCap       = 30 * time.Second
	// settle lets a burst's writes and garbage collection finish before
	// the next phase is timed.
	settle = 3 * time.Second
)

// The controller's liveness settings, as in the recovery benchmark.
var heartbeat = health.Heartbeat{Interval: time.Second, Timeout: 3 * time.Second, Vouched: time.Minute}

// Profile windows (BENCH_PROFILE=1), one CPU profile per phase.
var profileWindow = map[string]time.Duration{"register": 20 * time.Second, "rendezvous": 10 * time.Second, "recovery": 15 * time.Second}

type config struct {
	controllerBin string
	ctlBin        string // rdzvctl
	nodes         []int
	steady        time.Duration
	pkiDir        string
	logDir        string
	profile       bool
	// ctlConfig is the controller's --config, to compare settings; ctlEnv
	// is added to its environment (the Go runtime's settings).
	ctlConfig string
	ctlEnv    []string
	// relays is how many rdzv-relay processes carry the agents' streams
	// (agent i through relay i mod relays); 0: every agent connects to
	// the controller itself.
	relays   int
	relayBin string
	// simGC is this process's collection policy (gc_test.go).
	simGC simGC
}

func TestBenchScale(t *testing.T) {
	cfg := setup(t)
	maxNodes := slices.Max(cfg.nodes)
	// An agent that goes around its relay holds a second connection; half
	// of them may.
	need := uint64(maxNodes) + 4096
	if cfg.relays > 0 {
		need += uint64(maxNodes) / 2
	}
	if err := sim.RaiseNoFile(need); err != nil {
		t.Fatal("bench: ", err)
	}
	begin := time.Now()
	certs, err := sim.LoadCerts(cfg.pkiDir, maxNodes)
	if err != nil {
		t.Fatalf("certificates in %s: %v", cfg.pkiDir, err)
	}
	t.Logf("bench: %d agent certificates ready in %s (cache %s)", maxNodes, time.Since(begin).Round(time.Millisecond), cfg.pkiDir)

	var results []*result
	for _, n := range cfg.nodes {
		r := &result{nodes: n, fig: map[string]string{}}
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			start := time.Now()
			dir := t.TempDir()
			if cfg.logDir != "" {
				dir = filepath.Join(cfg.logDir, fmt.Sprintf("nodes-%d", n))
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
			}
			runSize(t, cfg, certs, dir, r)
			t.Logf("bench: %d nodes took %s", n, time.Since(start).Round(time.Second))
		})
		results = append(results, r)
	}
	report := formatReport(results, cfg, time.Since(begin))
	t.Logf("\n%s", report)
	if out := os.Getenv("BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(report), 0o644); err != nil {
			t.Errorf("writing BENCH_OUT: %v", err)
		}
	}
}

func setup(t *testing.T) config {
	binDir := os.Getenv("RDZV_BIN_DIR")
	if binDir == "" {
		t.Fatal("bench: RDZV_BIN_DIR is not set: run `make bench-scale`, or `make build` and set RDZV_BIN_DIR to the bin directory")
	}
	binDir, err := filepath.Abs(binDir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config{
		controllerBin: filepath.Join(binDir, "rdzv-controller"),
		ctlBin:        filepath.Join(binDir, "rdzvctl"),
		nodes:         []int{1000},
		steady:        30 * time.Second,
		pkiDir:        filepath.Join(os.TempDir(), "rdzv-bench-scale-pki"),
		logDir:        os.Getenv("BENCH_LOG_DIR"),
		profile:       os.Getenv("BENCH_PROFILE") == "1",
		ctlConfig:     os.Getenv("BENCH_CONTROLLER_CONFIG"),
		ctlEnv:        strings.Fields(os.Getenv("BENCH_CONTROLLER_ENV")),
		relayBin:      filepath.Join(binDir, "rdzv-relay"),
	}
	if cfg.simGC, err = parseSimGC(os.Getenv("BENCH_SIM_GC")); err != nil {
		t.Fatalf("bench: %v", err)
	}
	for _, bin := range []string{cfg.controllerBin, cfg.ctlBin} {
		if info, err := os.Stat(bin); err != nil || info.Mode()&0o111 == 0 {
			t.Fatalf("bench: %s is missing or not executable (run `make build`)", bin)
		}
	}
	if s := os.Getenv("BENCH_NODES"); s != "" {
		cfg.nodes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 2 || n > 50000 {
				t.Fatalf("bench: BENCH_NODES=%q: want comma-separated node counts between 2 and 50000", s)
			}
			cfg.nodes = append(cfg.nodes, n)
		}
	}
	if s := os.Getenv("BENCH_STEADY"); s != "" {
		if cfg.steady, err = time.ParseDuration(s); err != nil || cfg.steady < time.Second {
			t.Fatalf("bench: BENCH_STEADY=%q: want a duration of at least 1s", s)
		}
	}
	if s := os.Getenv("BENCH_RELAYS"); s != "" {
		if cfg.relays, err = strconv.Atoi(s); err != nil || cfg.relays < 0 || cfg.relays > 1000 {
			t.Fatalf("bench: BENCH_RELAYS=%q: want a number of relays between 0 and 1000", s)
		}
		if info, err := os.Stat(cfg.relayBin); cfg.relays > 0 && (err != nil || info.Mode()&0o111 == 0) {
			t.Fatalf("bench: %s is missing or not executable (run `make build`)", cfg.relayBin)
		}
	}
	if s := os.Getenv("BENCH_PKI_DIR"); s != "" {
		cfg.pkiDir = s
	}
	return cfg
}

// result is one cluster size's figures, formatted, by row key.
type result struct {
	nodes int
	fig   map[string]string
	notes []string
}

func (r *result) set(key, format string, args ...any) { r.fig[key] = fmt.Sprintf(format, args...) }

func (r *result) secs(key string, d time.Duration) {
	if d > -time.Second && d < time.Second {
		r.set(key, "%.3f s", d.Seconds())
		return
	}
	r.set(key, "%.2f s", d.Seconds())
}

func (r *result) note(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	r.notes = append(r.notes, msg)
	t.Log("bench: " + msg)
}

// run is one cluster size's state.
type run struct {
	t     *testing.T
	cfg   config
	r     *result
	n     int
	dir   string
	ctl   *sim.Controller
	op    *client.Client
	certs *sim.Certs
	sims  []*sim.Agent
	// relays carry the sims' streams when cfg.relays > 0; relayed is how
	// many sims they served after registering.
	relays  []*sim.Relay
	relayed int
	led     *ledger
	store   *durable
	ctx     context.Context
	// trace receives every etcd transaction seen (BENCH_LOG_DIR);
	// stopWatch ends the watch of what is durable.
	trace     io.Writer
	stopWatch func()
	// coldProfile is the register phase's CPU profile with relays: the
	// controller starts inside the phase, so the profile starts there.
	coldProfile *profile
}

func runSize(t *testing.T, cfg config, certs *sim.Certs, dir string, r *result) {
	n := r.nodes
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ru := &run{t: t, cfg: cfg, r: r, n: n, dir: dir, led: newLedger(), ctx: ctx, certs: certs}

	var err error
	ctlCfg := sim.ControllerConfig{Bin: cfg.controllerBin, Dir: dir, Certs: certs, Heartbeat: heartbeat, Pprof: true, ConfigFile: cfg.ctlConfig, Env: cfg.ctlEnv}
	// With relays, the controller starts in the register phase, once the
	// agents wait on their relays (see register).
	if ru.ctl, err = sim.NewController(ctlCfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ru.ctl.Stop()
		if t.Failed() {
			t.Logf("controller log (%s), last lines:\n%s", ru.ctl.LogPath, ru.ctl.Tail(30))
		}
	})
	ru.op, err = certs.OperatorClient(ru.ctl.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ru.op.Close()
	if cfg.logDir != "" {
		f, err := os.Create(filepath.Join(dir, "etcd-txns.tsv"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		ru.trace = f
	}
	defer func() {
		if ru.stopWatch != nil {
			ru.stopWatch()
		}
	}()
	if cfg.relays == 0 {
		if err := ru.startController(); err != nil {
			t.Fatal(err)
		}
	}

	for i := range cfg.relays {
		rl, err := sim.StartRelay(cfg.relayBin, dir, certs, i, ru.ctl.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rl.Stop)
		ru.relays = append(ru.relays, rl)
	}
	built := time.Now()
	for i := range n {
		relay := ""
		if len(ru.relays) > 0 {
			relay = ru.relays[i%len(ru.relays)].Addr
		}
		s, err := sim.NewAgent(ctx, sim.AgentConfig{Index: i, Controller: ru.ctl.Addr, Relay: relay, Cert: certs.Agents[i], Roots: certs.Roots, Observe: ru.led.observe})
		if err != nil {
			t.Fatal(err)
		}
		ru.sims = append(ru.sims, s)
	}
	t.Logf("bench: %d simulated agents built in %s", n, time.Since(built).Round(time.Millisecond))
	defer ru.stopSims()
	if cfg.simGC == simGCPhases {
		defer holdCollections()()
	}

	for _, phase := range []struct {
		name string
		run  func() error
	}{
		{"register", ru.register},
		{"steady", ru.steady},
		{"rendezvous", ru.rendezvous},
		{"recovery", ru.recovery},
		{"restart", ru.restart},
	} {
		if !ru.ctl.Running() {
			t.Errorf("bench: the controller exited before %s: %v", phase.name, ru.ctl.WaitErr())
			return
		}
		var prof *profile
		window := profileWindow[phase.name]
		if phase.name == "steady" {
			window = cfg.steady + settle
		}
		cold := phase.name == "register" && len(ru.relays) > 0
		if cfg.profile && !cold {
			prof = startProfile(ctx, ru.ctl.PprofSocket, window, filepath.Join(dir, phase.name+".pprof"))
		}
		var relayProf *profile
		if cfg.profile && phase.name == "steady" && len(ru.relays) > 0 {
			relayProf = startProfile(ctx, ru.relays[0].PprofSocket, window, filepath.Join(dir, "relay-steady.pprof"))
		}
		gcBefore := ru.countGC()
		err := phase.run()
		if phase.name != "steady" { // steady counts its window's own
			r.set("gc-"+phase.name, "%s", describeGC(gcBefore, ru.countGC()))
		}
		if cold {
			prof = ru.coldProfile
		}
		if relayProf != nil {
			if perr := <-relayProf.done; perr != nil {
				r.note(t, "relay steady profile: %v", perr)
			} else {
				t.Logf("bench: %d nodes, steady: CPU profile of relay 0 (of %d):\n%s", n, len(ru.relays),
					top(ctx, cfg.relayBin, filepath.Join(dir, "relay-steady.pprof"), 25))
			}
		}
		if prof != nil {
			if perr := <-prof.done; perr != nil {
				r.note(t, "%s profile: %v", phase.name, perr)
			} else {
				t.Logf("bench: %d nodes, %s: CPU profile of the controller's first %s:\n%s", n, phase.name, window,
					top(ctx, cfg.controllerBin, filepath.Join(dir, phase.name+".pprof"), 25))
			}
		}
		if err != nil {
			r.note(t, "%s did not finish: %v", phase.name, err)
			t.Errorf("bench: %d nodes: %s did not finish (a hang guard, not a timing target): %v", n, phase.name, err)
			break
		}
	}
	ru.counters()
}

// startController starts the controller, waits until it leads and starts
// watching what is durable in its etcd: with relays from its first
// revision, since agents held by their relays register as soon as it
// leads.
func (ru *run) startController() error {
	if err := ru.ctl.Start(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ru.ctx, startCap)
	defer cancel()
	if err := ru.ctl.WaitLeading(ctx, ru.op); err != nil {
		return err
	}
	if limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", ru.ctl.Pid())); err == nil {
		for _, l := range strings.Split(string(limits), "\n") {
			if strings.HasPrefix(l, "Max open files") {
				ru.t.Logf("bench: controller %s", strings.Join(strings.Fields(l), " "))
			}
		}
	}
	var err error
	ru.store, ru.stopWatch, err = watchDurable(ru.ctx, ru.ctl, jobName, ru.trace, len(ru.relays) > 0)
	return err
}

// stopSims stops every sim, waiting a bounded time: a sim that does not
// stop must not keep the report of what was measured from being written.
func (ru *run) stopSims() {
	var wg sync.WaitGroup
	for _, s := range ru.sims {
		wg.Add(1)
		go func() { defer wg.Done(); s.Stop() }()
	}
	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(stopCap):
		ru.r.note(ru.t, "some simulated agents did not stop within %s", stopCap)
	}
}

// register: a cold controller (empty etcd, no connections), and all N
// agents connecting at once. With relays, the relays and the agents are up
// first, each agent connected to its relay, which holds it while no
// controller answers: then the controller starts, as on a cluster whose
// controller is installed or replaced, and is timed from its start.
func (ru *run) register() error {
	ctx, cancel := context.WithTimeout(ru.ctx, registerCap)
	defer cancel()
	if len(ru.relays) > 0 {
		t0 := time.Now()
		for _, s := range ru.sims {
			s.Start(ru.ctx)
		}
		if err := sim.WaitFor(ctx, "agents connected to their relays", func() (bool, string) {
			got, _, _ := ru.led.get(kindHandshake, 0)
			return got >= ru.n, fmt.Sprintf("%d of %d", got, ru.n)
		}); err != nil {
			return err
		}
		_, _, last := ru.led.get(kindHandshake, 0)
		ru.r.secs("relay-connect", last.Sub(t0))
	}
	usage := ru.startUsage()
	ru.led.takeGap()
	t0 := time.Now()
	if len(ru.relays) > 0 {
		if err := ru.startController(); err != nil {
			return err
		}
		if ru.cfg.profile {
			ru.coldProfile = startProfile(ru.ctx, ru.ctl.PprofSocket, profileWindow["register"], filepath.Join(ru.dir, "register.pprof"))
		}
	} else {
		for _, s := range ru.sims {
			s.Start(ru.ctx)
		}
	}
	err := sim.WaitFor(ctx, "agents registered", func() (bool, string) {
		got, _, _ := ru.led.get(kindRegistered, 0)
		return got >= ru.n, fmt.Sprintf("%d of %d", got, ru.n)
	})
	ru.r.set("register-cpu", "%s", usage())
	ru.r.set("register-gap", "%s", ms(ru.led.takeGap()))
	ru.relayed = ru.countRelayed()
	if err != nil {
		return err
	}
	_, _, last := ru.led.get(kindRegistered, 0)
	ru.r.secs("register", last.Sub(t0))
	if err := sim.WaitFor(ctx, "node records durable", func() (bool, string) {
		got, _ := ru.store.readyCount()
		return got >= ru.n, fmt.Sprintf("%d of %d", got, ru.n)
	}); err != nil {
		return err
	}
	_, at := ru.store.readyCount()
	ru.r.secs("register-durable", at.Sub(t0))

	// What an operator sees: every node READY, listed page by page.
	for {
		start := time.Now()
		ready, err := ru.readyListed(ctx)
		took := time.Since(start)
		if err != nil {
			ru.r.set("listnodes", "failed")
			ru.r.note(ru.t, "ListNodes at %d nodes: %v", ru.n, err)
			break
		}
		if ready >= ru.n {
			ru.r.set("listnodes", "%.0f ms", float64(took.Microseconds())/1000)
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("ListNodes shows %d of %d ready", ready, ru.n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// readyListed lists every node, a page at a time as the API serves them,
// and counts the READY ones.
func (ru *run) readyListed(ctx context.Context) (int, error) {
	ready := 0
	req := &rdzvv1.ListNodesRequest{}
	for {
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := ru.op.ListNodes(cctx, req)
		ccancel()
		if err != nil {
			return 0, err
		}
		for _, n := range resp.GetNodes() {
			if n.GetState() == rdzvv1.NodeState_NODE_STATE_READY {
				ready++
			}
		}
		if resp.GetNextPageToken() == "" {
			return ready, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// usage is the CPU the controller, the simulated agents and everything
// else on the machine used since a start.
type usage struct {
	ctl, self procSample
	// relays is the relays' CPU, summed.
	relays time.Duration
	busy   time.Duration
}

func (ru *run) sampleUsage() usage {
	var u usage
	// Before the controller starts (with relays) it has used nothing yet.
	u.ctl = procSample{at: time.Now()}
	if pid := ru.ctl.Pid(); pid != 0 {
		u.ctl, _ = sampleProc(pid)
	}
	u.self, _ = sampleProc(os.Getpid())
	for _, rl := range ru.relays {
		p, _ := sampleProc(rl.Pid())
		u.relays += p.cpu
	}
	u.busy, _ = cpuBusy()
	return u
}

// cores is the controller's, the sims', the relays' and everyone else's
// CPU from u to v.
func (u usage) cores(v usage) (ctl, sims, relays, others float64) {
	wall := v.ctl.at.Sub(u.ctl.at).Seconds()
	ctl = (v.ctl.cpu - u.ctl.cpu).Seconds() / wall
	sims = (v.self.cpu - u.self.cpu).Seconds() / wall
	relays = (v.relays - u.relays).Seconds() / wall
	others = max((v.busy-u.busy).Seconds()/wall-ctl-sims-relays, 0)
	return ctl, sims, relays, others
}

// startUsage starts measuring; the function it returns describes the
// usage until it is called.
func (ru *run) startUsage() func() string {
	u := ru.sampleUsage()
	return func() string { return ru.describeUsage(u, ru.sampleUsage()) }
}

// describeUsage is the CPU used from u to v, as the report shows it.
func (ru *run) describeUsage(u, v usage) string {
	ctl, sims, relays, others := u.cores(v)
	if len(ru.relays) > 0 {
		return fmt.Sprintf("%.2f / %.2f / %.2f relays / %.2f cores (load avg %s)", ctl, sims, relays, others, loadAvg())
	}
	return fmt.Sprintf("%.2f / %.2f / %.2f cores (load avg %s)", ctl, sims, others, loadAvg())
}

// steady: every agent heartbeating, nothing else happening.
func (ru *run) steady() error {
	if ru.cfg.simGC == simGCPhases {
		// The registrations' garbage, before the window (see gc_test.go).
		runtime.GC()
	}
	time.Sleep(settle)
	before := ru.sampleUsage()
	ru.led.takeRTTs()
	ru.led.takeGap()
	gcBefore := ru.countGC()
	ru.led.recording.Store(true)
	time.Sleep(ru.cfg.steady)
	ru.led.recording.Store(false)
	after := ru.sampleUsage()
	ru.r.set("gc-steady", "%s", describeGC(gcBefore, ru.countGC()))
	ctlCPU, _, _, _ := before.cores(after)
	ru.r.set("cpu", "%.2f cores", ctlCPU)
	ru.r.set("load", "%s", ru.describeUsage(before, after))
	ru.r.set("rss", "%.0f KiB (%.0f MiB)", float64(after.ctl.rss)/1024/float64(ru.n), float64(after.ctl.rss)/(1<<20))
	ru.r.set("rss-parts", "%.0f / %.0f MiB", float64(after.ctl.rssAnon)/(1<<20), float64(after.ctl.rssFile)/(1<<20))
	ru.r.set("threads", "%d", after.ctl.threads)
	// Every sim heartbeats throughout: any loss so far is a healthy node
	// condemned because the controller (or the sims) fell behind.
	ru.r.set("healthy-lost", "%d", ru.store.lossCount())
	ru.r.set("steady-gap", "%s", ms(ru.led.takeGap()))
	rtts := ru.led.takeRTTs()
	if len(rtts) > 0 {
		ru.r.set("rtt", "%s / %s (%d samples)", ms(pct(rtts, 50)), ms(pct(rtts, 99)), len(rtts))
	}
	cctx, cancel := context.WithTimeout(ru.ctx, 10*time.Second)
	defer cancel()
	if g, err := goroutines(cctx, ru.ctl.PprofSocket); err == nil {
		ru.r.set("goroutines", "%.2f (%d)", float64(g)/float64(ru.n), g)
	} else {
		ru.r.note(ru.t, "goroutines: %v", err)
	}
	if ms, err := memStats(cctx, ru.ctl.PprofSocket); err == nil {
		perNode := func(name string) float64 { return float64(ms[name]) / 1024 / float64(ru.n) }
		ru.r.set("heap", "%.0f / %.0f KiB", perNode("HeapInuse"), perNode("Stack"))
		mib := func(v uint64) float64 { return float64(v) / (1 << 20) }
		ru.r.set("heap-parts", "%.0f / %.0f / %.0f / %.0f MiB", mib(ms["HeapInuse"]), mib(ms["HeapIdle"]-ms["HeapReleased"]),
			mib(ms["NextGC"]), mib(ms["GCSys"]+ms["MSpan"]+ms["MCache"]+ms["BuckHashSys"]+ms["OtherSys"]))
	} else {
		ru.r.note(ru.t, "heap: %v", err)
	}
	// The heap in use above holds garbage the collector has not reached
	// yet; what a node costs is what survives a collection, once etcd
	// holds nothing more for this benchmark's own watch.
	wctx, wcancel := context.WithTimeout(ru.ctx, 30*time.Second)
	defer wcancel()
	if err := ru.store.caughtUp(wctx); err != nil {
		ru.r.note(ru.t, "live heap: %v", err)
	} else if ms, err := memStatsAfterGC(wctx, ru.ctl.PprofSocket); err == nil {
		ru.r.set("live", "%.1f KiB", float64(ms["HeapAlloc"])/1024/float64(ru.n))
	} else {
		ru.r.note(ru.t, "live heap: %v", err)
	}
	if ru.cfg.profile {
		ru.saveProfiles(wctx)
	}
	return nil
}

// saveProfiles keeps the controller's heap and goroutines after the steady
// phase, and prints where the heap goes.
func (ru *run) saveProfiles(ctx context.Context) {
	for _, p := range []struct{ path, file string }{{"heap", "heap.pprof"}, {"goroutine?debug=1", "goroutines.txt"}} {
		data, err := pprofGet(ctx, ru.ctl.PprofSocket, p.path)
		if err == nil {
			err = os.WriteFile(filepath.Join(ru.dir, p.file), data, 0o644)
		}
		if err != nil {
			ru.r.note(ru.t, "%s profile: %v", p.path, err)
			return
		}
	}
	ru.t.Logf("bench: %d nodes: controller heap in use after steady:\n%s", ru.n,
		top(ctx, ru.cfg.controllerBin, filepath.Join(ru.dir, "heap.pprof"), 25, "-sample_index=inuse_space"))
}

// rendezvous: one job over every node, all of them idle and ready.
func (ru *run) rendezvous() error {
	ctx, cancel := context.WithTimeout(ru.ctx, rendezvousCap)
	defer cancel()
	spec, err := jobspec.Parse(fmt.Appendf(nil, `name: %s
nodes: {min: %d, max: %d}
command: [train.py]
rendezvous: {last_call: 0s, timeout: 0s}
restart: {max_restarts: 3, backoff: {initial: 100ms, max: 1s}}
`, jobName, ru.n-1, ru.n))
	if err == nil {
		err = spec.Validate()
	}
	if err != nil {
		return err
	}
	ru.led.recording.Store(true) // heartbeats during the bursts
	ru.led.takeGap()
	usage := ru.startUsage()
	defer func() { ru.r.set("rendezvous-cpu", "%s", usage()) }()
	keys, txns := ru.store.writes()
	t0 := time.Now()
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = ru.op.StartJob(cctx, &rdzvv1.StartJobRequest{Spec: spec.ToProto()})
	ccancel()
	if err != nil {
		return fmt.Errorf("StartJob: %w", err)
	}
	if err := ru.waitAssignments(ctx, 1, ru.n); err != nil {
		return err
	}
	if err := ru.waitRunning(ctx, 1, ru.n); err != nil {
		return err
	}
	committed, err := ru.waitEvent(ctx, controller.EventRendezvousCommitted, 1)
	if err != nil {
		return err
	}
	_, firstAsg, lastAsg := ru.led.get(kindAssignment, 1)
	_, runAt := ru.store.runningCount(1)
	ru.r.secs("start-commit", committed.Sub(t0))
	ru.r.secs("commit-durable", ru.store.round(1).Sub(committed))
	ru.r.secs("commit-first-asg", firstAsg.Sub(committed))
	ru.r.secs("commit-asg", lastAsg.Sub(committed))
	ru.r.secs("asg-running", runAt.Sub(lastAsg))
	ru.r.secs("commit-running", runAt.Sub(committed))
	ru.setWrites("rendezvous-writes", keys, txns)
	ru.operatorViews(ctx)
	return nil
}

// operatorViews times what an operator runs: the real rdzvctl, process
// start and TLS handshake included, with every node busy in the job.
func (ru *run) operatorViews(ctx context.Context) {
	op := pki.DefaultOut(ru.certs.Dir, pki.Identity{Role: pki.RoleOperator, Name: "sim"})
	for _, v := range []struct {
		key  string
		args []string
		want string // in the output, so a refusal is not timed as an answer
	}{
		{"cli-nodes", []string{"nodes"}, fmt.Sprintf("%d nodes", ru.n)},
		{"cli-status", []string{"status", jobName}, "Workers:"},
		{"cli-nodes-all", []string{"nodes", "--all"}, sim.Name(ru.n - 1)},
	} {
		args := append([]string{"--controller", ru.ctl.Addr, "--tls-cert", op + ".crt", "--tls-key", op + ".key",
			"--tls-ca", filepath.Join(ru.certs.Dir, pki.CACertFile), "--timeout", "30s"}, v.args...)
		start := time.Now()
		out, err := exec.CommandContext(ctx, ru.cfg.ctlBin, args...).CombinedOutput()
		took := time.Since(start)
		if err != nil || !bytes.Contains(out, []byte(v.want)) {
			ru.r.set(v.key, "failed")
			ru.r.note(ru.t, "rdzvctl %s: %v: %s", strings.Join(v.args, " "), err, firstLines(out, 5))
			continue
		}
		ru.r.set(v.key, "%.0f ms (%d lines)", float64(took.Microseconds())/1000, bytes.Count(out, []byte("\n")))
	}
}

// firstLines is the start of a command's output, for a note.
func firstLines(out []byte, n int) string {
	lines := strings.SplitN(string(out), "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// setWrites reports the etcd writes since the counts keys and txns.
func (ru *run) setWrites(key string, keys, txns int) {
	k, t := ru.store.writes()
	ru.r.set(key, "%d / %d", k-keys, t-txns)
}

// recovery: one node of the running job goes silent.
func (ru *run) recovery() error {
	time.Sleep(settle)
	ctx, cancel := context.WithTimeout(ru.ctx, recoveryCap)
	defer cancel()
	usage := ru.startUsage()
	defer func() { ru.r.set("recovery-cpu", "%s", usage()) }()
	keys, txns := ru.store.writes()
	victim := ru.sims[ru.n-1] // the last rank: never the master
	victim.Silence()
	lastSent := victim.LastSent()
	survivors := ru.n - 1
	if err := ru.waitAssignments(ctx, 2, survivors); err != nil {
		return err
	}
	if err := ru.waitRunning(ctx, 2, survivors); err != nil {
		return err
	}
	ru.setWrites("recovery-writes", keys, txns)
	ru.led.recording.Store(false)
	lost, err := ru.waitEvent(ctx, controller.EventNodeLost, 1)
	if err != nil {
		return err
	}
	committed, err := ru.waitEvent(ctx, controller.EventRendezvousCommitted, 2)
	if err != nil {
		return err
	}
	stops, firstStop, lastStop := ru.led.get(kindStop, 1)
	_, firstAsg, lastAsg := ru.led.get(kindAssignment, 2)
	_, runAt := ru.store.runningCount(2)
	fencedBy := heartbeat.FencedBy(health.Loss{At: lost, LastSeen: lastSent, Heard: true})
	ru.r.secs("silent-lost", lost.Sub(lastSent))
	ru.r.set("lost-stops", "%.2f / %.2f s (%d of %d)", firstStop.Sub(lost).Seconds(), lastStop.Sub(lost).Seconds(), stops, survivors)
	ru.r.secs("lost-commit", committed.Sub(lost))
	ru.r.secs("commit-durable2", ru.store.round(2).Sub(committed))
	ru.r.secs("commit-first-asg2", firstAsg.Sub(committed))
	ru.r.secs("lost-asg", lastAsg.Sub(lost))
	ru.r.secs("fence-asg", lastAsg.Sub(fencedBy))
	ru.r.secs("asg-running2", runAt.Sub(lastAsg))
	if rtts := ru.led.takeRTTs(); len(rtts) > 0 {
		ru.r.set("rtt-burst", "%s / %s", ms(pct(rtts, 99)), ms(pct(rtts, 100)))
	}
	ru.r.set("burst-gap", "%s", ms(ru.led.takeGap()))
	if s, err := sampleProc(ru.ctl.Pid()); err == nil {
		ru.r.set("rss-end", "%.0f MiB", float64(s.rss)/(1<<20))
	}
	return nil
}

// restart: the controller crashes (SIGKILL) and starts again on its data
// directory, as after an OOM kill or a host reboot, while every agent runs
// on: all of them reconnect at once and register again, resuming their
// TLS sessions (tickets sealed with keys derived from the secrets keyring,
// which survives the restart). The silenced node stays silent.
func (ru *run) restart() error {
	ctx, cancel := context.WithTimeout(ru.ctx, registerCap)
	defer cancel()
	ru.led.epoch.Store(1)
	lostBefore := ru.store.lossCount()
	ru.ctl.Kill()
	t0 := time.Now()
	if err := ru.ctl.Restart(); err != nil {
		return err
	}
	usage := ru.startUsage()
	if err := ru.ctl.WaitLeading(ctx, ru.op); err != nil {
		return err
	}
	ru.r.secs("restart-leading", time.Since(t0))
	want := ru.n - 1
	err := sim.WaitFor(ctx, "agents registered again", func() (bool, string) {
		got := ru.led.agents(kindReregistered, 1)
		return got >= want, fmt.Sprintf("%d of %d", got, want)
	})
	ru.r.set("restart-cpu", "%s", usage())
	if err != nil {
		return err
	}
	_, _, last := ru.led.get(kindReregistered, 1)
	ru.r.secs("restart", last.Sub(t0))
	// A node the restarted leader declares lost before its agent got
	// back is a healthy one: every sim but the silenced one runs on.
	ru.r.set("restart-lost", "%d", ru.store.lossCount()-lostBefore)
	full, _, _ := ru.led.get(kindHandshake, 1)
	resumed, _, _ := ru.led.get(kindResumed, 1)
	ru.r.set("restart-resumed", "%d of %d", resumed, resumed+full)
	if len(ru.relays) > 0 {
		ru.r.set("relayed", "%d / %d of %d", ru.relayed, ru.countRelayed(), ru.n)
	}
	return nil
}

// countRelayed counts the sims last served through a relay.
func (ru *run) countRelayed() int {
	relays := map[string]bool{}
	for _, rl := range ru.relays {
		relays[rl.Addr] = true
	}
	n := 0
	for _, s := range ru.sims {
		if relays[s.Via()] {
			n++
		}
	}
	return n
}

func (ru *run) waitAssignments(ctx context.Context, gen uint64, want int) error {
	return sim.WaitFor(ctx, fmt.Sprintf("generation %d assignments delivered", gen), func() (bool, string) {
		got, _, _ := ru.led.get(kindAssignment, gen)
		return got >= want, fmt.Sprintf("%d of %d", got, want)
	})
}

func (ru *run) waitRunning(ctx context.Context, gen uint64, want int) error {
	return sim.WaitFor(ctx, fmt.Sprintf("generation %d RUNNING durable", gen), func() (bool, string) {
		got, _ := ru.store.runningCount(gen)
		return got >= want, fmt.Sprintf("%d of %d", got, want)
	})
}

// waitEvent is when the controller decided what the stored event says.
func (ru *run) waitEvent(ctx context.Context, kind string, gen uint64) (time.Time, error) {
	var e *rdzvv1.Event
	err := sim.WaitFor(ctx, "event "+kind, func() (bool, string) {
		e = ru.store.event(kind, gen)
		return e != nil, "not stored"
	})
	return e.GetTime().AsTime(), err
}

// counters reports sessions that ended while their sim was alive: the
// controller dropped them (a full send queue, an error) or the transport
// broke.
func (ru *run) counters() {
	n, _, _ := ru.led.get(kindReconnect, 0)
	ru.r.set("reconnects", "%d", n)
	ru.led.mu.Lock()
	defer ru.led.mu.Unlock()
	classes := map[string]int{}
	for reason, count := range ru.led.reasons {
		classes[addrs.ReplaceAllString(reason, "ADDR")] += count
	}
	for reason, count := range classes {
		ru.r.note(ru.t, "%d sessions ended: %s", count, reason)
	}
}

// addrs matches the addresses in connection errors, which make every
// sim's error message unique.
var addrs = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+(:\d+)?`)

func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)*p/100, len(s)-1)
	return s[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// rows are the report's lines: the figures first.
var rows = []struct{ key, label string }{
	{"register", "all nodes registered (cold start: last `Registered` reply)"},
	{"register-durable", "… every node record durable in etcd"},
	{"relay-connect", "with relays: every agent connected to its relay, before the controller starts"},
	{"commit-asg", "rendezvous commit → last assignment delivered"},
	{"commit-running", "… → every worker RUNNING durable"},
	{"lost-asg", "node declared lost → next generation's last assignment"},
	{"fence-asg", "… minus the lost node's fencing deadline"},
	{"rss", "controller RSS per node (total) after steady"},
	{"rss-parts", "… anonymous / file-backed (the binary, etcd's mapped database)"},
	{"heap", "controller Go heap / goroutine stacks per node"},
	{"heap-parts", "… heap in use / free but not returned to the OS / next collection's target / the runtime's own"},
	{"live", "controller live heap per node (after a forced collection)"},
	{"goroutines", "controller goroutines per node (total)"},
	{"rtt", "heartbeat round trip p50 / p99 (steady)"},
	{"cpu", "steady CPU for heartbeats (controller)"},
	{"threads", "controller OS threads"},
	{"healthy-lost", "healthy nodes declared lost while registering and steady"},
	{"start-commit", "StartJob → rendezvous committed"},
	{"commit-durable", "rendezvous committed → its round durable (as the benchmark's etcd watch sees it)"},
	{"commit-first-asg", "… → first assignment delivered (sent once the round is durable)"},
	{"asg-running", "last assignment → every worker RUNNING durable"},
	{"silent-lost", "lost node's last message → declared lost (3 s timeout)"},
	{"lost-stops", "declared lost → first / last stop order delivered"},
	{"lost-commit", "declared lost → next generation committed"},
	{"commit-durable2", "next generation committed → its round durable (as the benchmark's etcd watch sees it)"},
	{"commit-first-asg2", "… → first assignment delivered (sent once the round is durable)"},
	{"asg-running2", "next generation: last assignment → RUNNING durable"},
	{"rendezvous-writes", "etcd keys written / transactions: rendezvous (until every worker RUNNING durable)"},
	{"recovery-writes", "… recovery (silence until the next generation RUNNING durable)"},
	{"rtt-burst", "heartbeat p99 / max during rendezvous and recovery"},
	{"listnodes", "ListNodes of every node (all pages)"},
	{"cli-nodes", "`rdzvctl nodes` (a summary), whole command"},
	{"cli-status", "`rdzvctl status JOB` of the job on every node"},
	{"cli-nodes-all", "`rdzvctl nodes --all` (every node)"},
	{"restart", "controller SIGKILLed and restarted → every live agent registered again"},
	{"restart-leading", "… → leading again, as an operator's call sees it (embedded etcd up, state loaded)"},
	{"restart-resumed", "… TLS handshakes that resumed a session / all"},
	{"restart-lost", "… healthy nodes declared lost meanwhile"},
	{"relayed", "agents served through a relay: after registering / after the restart"},
	{"rss-end", "controller RSS at the end"},
	{"reconnects", "agent sessions dropped"},
	{"register-gap", "longest gap between a sim's heartbeats (sims' own lateness; 1 s is on time): registering"},
	{"steady-gap", "… steady"},
	{"burst-gap", "… rendezvous and recovery"},
	{"register-cpu", "CPU while registering: controller / simulated agents / everything else"},
	{"rendezvous-cpu", "CPU during rendezvous: controller / simulated agents / everything else"},
	{"recovery-cpu", "CPU during recovery: controller / simulated agents / everything else"},
	{"restart-cpu", "CPU while registering again after the restart: controller / simulated agents / everything else"},
	{"load", "CPU during steady: controller / simulated agents / everything else"},
	{"gc-register", "collections while registering: the benchmark's own process (simulated agents) / each relay"},
	{"gc-steady", "… the steady window"},
	{"gc-rendezvous", "… rendezvous"},
	{"gc-recovery", "… recovery"},
	{"gc-restart", "… restart"},
}

func formatReport(results []*result, cfg config, took time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rdzv scale benchmark: real rdzv-controller (embedded etcd, mutual TLS), simulated agents; heartbeat %s / timeout %s; steady window %s; took %s\n\n",
		heartbeat.Interval, heartbeat.Timeout, cfg.steady, took.Round(time.Second))
	if cfg.simGC == simGCPhases {
		b.WriteString("the benchmark's own process (the simulated agents) collects its garbage before the steady window and not again until the size's phases end (BENCH_SIM_GC=go: Go's default)\n\n")
	}
	if cfg.relays > 0 {
		fmt.Fprintf(&b, "agents through %d real rdzv-relay processes (agent i through relay i mod %d); their CPU is the \"relays\" column\n\n", cfg.relays, cfg.relays)
	}
	if cfg.ctlConfig != "" {
		yaml, err := os.ReadFile(cfg.ctlConfig)
		if err != nil {
			yaml = []byte(err.Error())
		}
		fmt.Fprintf(&b, "controller --config %s:\n\n```yaml\n%s\n```\n\n", cfg.ctlConfig, strings.TrimSpace(string(yaml)))
	}
	if len(cfg.ctlEnv) > 0 {
		fmt.Fprintf(&b, "controller environment: %s\n\n", strings.Join(cfg.ctlEnv, " "))
	}
	b.WriteString("| figure |")
	for _, r := range results {
		fmt.Fprintf(&b, " %d nodes |", r.nodes)
	}
	b.WriteString("\n| --- |")
	for range results {
		b.WriteString(" --- |")
	}
	b.WriteString("\n")
	for _, row := range rows {
		fmt.Fprintf(&b, "| %s |", row.label)
		for _, r := range results {
			v := r.fig[row.key]
			if v == "" {
				v = "-"
			}
			fmt.Fprintf(&b, " %s |", v)
		}
		b.WriteString("\n")
	}
	for _, r := range results {
		if len(r.notes) > 0 {
			sort.Strings(r.notes)
			fmt.Fprintf(&b, "\n%d nodes:\n", r.nodes)
			for _, n := range r.notes {
				fmt.Fprintf(&b, "- %s\n", n)
			}
		}
	}
	return b.String()
}
