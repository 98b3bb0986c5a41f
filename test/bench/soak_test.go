//go:build bench

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdzv/rdzv/test/netns"
)

const (
	soakHosts  = 3 // h1..h3 train; h0 runs the controller
	soakVictim = 3 // h3's CPU is saturated

	defaultSoakDuration = 10 * time.Minute
	// soakBaseline is trained unsaturated first, so the starvation shows
	// as a change on the same hosts in the same run.
	soakBaseline       = 45 * time.Second
	defaultSoakPercent = 10 // of one CPU, for everything on h3: see docs/benchmarks.md (soak benchmark)
	// soakHogs busy loops share h3's quota with its agent and workers at
	// the same priority: the agent competes for each slice of it.
	soakHogs = 2

	soakSteps           = 100000000 // never reached: the job trains until the soak ends
	soakCheckpointEvery = 200

	netemDelay  = "100ms"
	netemJitter = "50ms"

	controllerMetrics = "http://127.0.0.1:9401/metrics"
	samplePeriod      = time.Second
)

// probeScript sleeps 100 ms at a time and prints how late each wake-up was:
// the scheduling delay every process in its cgroup suffers.
const probeScript = `import time
while True:
    t = time.monotonic()
    time.sleep(0.1)
    print("PROBE %.6f %.6f" % (time.time(), time.monotonic() - t - 0.1), flush=True)
`

// soakPhase is one window of the soak with the same conditions.
type soakPhase struct {
	name       string
	start, end time.Time
	cpuStat    map[string]int64     // the cgroup's cpu.stat at the end, less at the start
	metrics    map[string]float64   // controller /metrics at the end, less at the start
	unreach    map[string]int       // "watched peer unreachable" log lines per agent
	suspect    int                  // controller "node silent ... reachable by its peers" lines
	hbAge      map[string][]float64 // node -> seconds since its last heartbeat, sampled
}

// TestBenchSoak trains a long job on three hosts while one of them is
// starved of CPU, and counts what the failure detector made of it: every
// node declared lost and every failed attempt is a false positive, since
// no fault is injected.
func TestBenchSoak(t *testing.T) {
	b := setup(t)
	duration := defaultSoakDuration
	if s := os.Getenv("SOAK_DURATION"); s != "" {
		var err error
		if duration, err = time.ParseDuration(s); err != nil || duration <= 0 {
			t.Fatalf("bench: SOAK_DURATION=%q: want a positive duration such as 10m", s)
		}
	}
	percent := defaultSoakPercent
	if s := os.Getenv("SOAK_CPU_PERCENT"); s != "" {
		var err error
		if percent, err = strconv.Atoi(s); err != nil || percent < 1 || percent > 100 {
			t.Fatalf("bench: SOAK_CPU_PERCENT=%q: want a percentage of one CPU, 1 to 100", s)
		}
	}
	// netem needs the kernel's sch_netem, which not every kernel has:
	// unset, the delay phase runs where it can.
	netemWanted, netemForced := true, false
	if s := os.Getenv("SOAK_NETEM"); s != "" {
		var err error
		if netemWanted, err = strconv.ParseBool(s); err != nil {
			t.Fatalf("bench: SOAK_NETEM=%q: want true or false", s)
		}
		netemForced = netemWanted
	}

	d := b.dirs(t, &result{system: "rdzv", fault: "soak", run: 1})
	net := netns.NewCluster(t, 1+soakHosts, filepath.Join(d.root, "proc-logs"))
	defer killAll(net)
	victimHost := net.Host(soakVictim)
	withNetem := false
	if netemWanted {
		if err := netemAvailable(victimHost); err == nil {
			withNetem = true
		} else if netemForced {
			t.Fatalf("bench: SOAK_NETEM=true but netem is not available: %v", err)
		} else {
			t.Logf("bench: no netem phase: %v", err)
		}
	}
	// Registered after the cluster: removed (its processes killed) first.
	cg, err := newCPUGroup(t, "rdzv-soak-"+net.Prefix, percent)
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	rc, err := b.startRdzv(t, net, d, soakHosts)
	if err != nil {
		rc.diagnose()
		t.Fatalf("bench: %v", err)
	}
	control := net.Host(1)
	probes := map[string]*netns.Proc{
		control.Name:    control.Start(t, "probe", nil, "python3", "-u", "-c", probeScript),
		victimHost.Name: victimHost.Start(t, "probe", nil, "python3", "-u", "-c", probeScript),
	}

	jobPath := filepath.Join(d.root, "job.yaml")
	train := []string{"--steps", strconv.Itoa(soakSteps), "--step-time", stepTime, "--checkpoint-every", strconv.Itoa(soakCheckpointEvery)}
	if err := os.WriteFile(jobPath, b.rdzvJob(d, train, "rdzv", maxRestarts), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := rc.ctl("start", jobPath); err != nil {
		rc.diagnose()
		t.Fatalf("bench: rdzvctl start: %v %s", err, out)
	}
	ended := ""
	gaveUp := func() string {
		out, err := rc.ctl("-o", "json", "status", jobName)
		var j jobJSON
		if err != nil || decode(out, &j) != nil {
			return ""
		}
		switch j.State {
		case "JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED", "JOB_STATE_STOPPED":
			return fmt.Sprintf("job ended %s: %s", j.State, j.Reason)
		}
		return ""
	}
	if _, err := waitUnderWay(d.ticks, gaveUp); err != nil {
		rc.diagnose()
		t.Fatalf("bench: %v", err)
	}

	agentLogs := map[string]string{}
	for i, p := range rc.daemons[1:] {
		agentLogs[net.Host(i+1).Name] = p.LogPath()
	}
	controllerLog := rc.daemons[0].LogPath()
	snapshot := func() (map[string]int64, map[string]float64, map[string]int, int) {
		un := map[string]int{}
		for host, p := range agentLogs {
			un[host] = countLines(p, "watched peer unreachable")
		}
		return cg.stat(), b.controllerMetrics(t, net.Host(0)), un, countLines(controllerLog, "reachable by its peers")
	}

	phases := []*soakPhase{{name: "baseline"}}
	if withNetem {
		phases = append(phases, &soakPhase{name: "cpu"}, &soakPhase{name: "cpu+netem"})
	} else {
		phases = append(phases, &soakPhase{name: "cpu"})
	}
	lengths := []time.Duration{soakBaseline}
	for i := 1; i < len(phases); i++ {
		lengths = append(lengths, duration/time.Duration(len(phases)-1))
	}
	enter := map[string]func() error{
		"cpu": func() error {
			for range soakHogs {
				victimHost.Start(t, "hog", nil, "sh", "-c", "while :; do :; done")
			}
			// Everything on h3 (agent, its torchrun, shim and worker, the
			// probe, the hogs) goes into the group; what they start later
			// inherits it. Twice, for a child forked during the first pass.
			for range 2 {
				if err := cg.addNamespace(victimHost.NS); err != nil {
					return err
				}
				time.Sleep(200 * time.Millisecond)
			}
			return nil
		},
		"cpu+netem": func() error {
			_, _, err := victimHost.Run(context.Background(), nil, "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", netemDelay, netemJitter)
			return err
		},
	}

	t.Logf("bench: soak: %s baseline, then %s with %s's CPU capped at %d%% of one CPU shared with %d busy loops (netem %v)",
		soakBaseline, duration, victimHost.Name, percent, soakHogs, withNetem)
	cpu0, met0, un0, sus0 := snapshot()
	for i, ph := range phases {
		if f := enter[ph.name]; f != nil {
			if err := f(); err != nil {
				t.Fatalf("bench: entering phase %s: %v", ph.name, err)
			}
		}
		ph.start = time.Now()
		ph.hbAge = map[string][]float64{}
		t.Logf("bench: phase %s from %s", ph.name, ph.start.Format("15:04:05"))
		end := ph.start.Add(lengths[0])
		lengths = lengths[1:]
		for time.Now().Before(end) && ended == "" {
			sampleHeartbeats(rc, ph.hbAge)
			if ended = gaveUp(); ended != "" {
				t.Errorf("bench: %s during phase %s", ended, ph.name)
			}
			time.Sleep(samplePeriod)
		}
		ph.end = time.Now()
		cpu1, met1, un1, sus1 := snapshot()
		ph.cpuStat, ph.metrics, ph.unreach, ph.suspect = diffInts(cpu1, cpu0), diffFloats(met1, met0), map[string]int{}, sus1-sus0
		for h, n := range un1 {
			ph.unreach[h] = n - un0[h]
		}
		cpu0, met0, un0, sus0 = cpu1, met1, un1, sus1
		if ended != "" {
			phases = phases[:i+1] // the rest did not run
			break
		}
	}

	events := soakEvents(t, rc)
	report := soakReport(phases, events, readTicks(d.ticks), probes, soakSettings{duration, percent, withNetem, victimHost.Name})
	t.Logf("\n%s", report)
	if out := os.Getenv("BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(report), 0o644); err != nil {
			t.Errorf("writing BENCH_OUT: %v", err)
		}
	}
	// Nothing was injected: any loss or failed attempt is a false positive.
	fp := 0
	for _, ev := range events {
		if ev.Time.After(phases[0].start) && (ev.Kind == "node_lost" || ev.Kind == "attempt_failed") {
			fp++
			t.Errorf("bench: false positive: %s %s %s: %s", ev.Time.Format("15:04:05.000"), ev.Kind, ev.Node, ev.Message)
		}
	}
	if fp > 0 {
		rc.diagnose()
	}
}

// netemAvailable tries a netem qdisc on h's loopback.
func netemAvailable(h *netns.Host) error {
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout)
	defer cancel()
	if _, _, err := h.Run(ctx, nil, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"); err != nil {
		return err
	}
	_, _, err := h.Run(ctx, nil, "tc", "qdisc", "del", "dev", "lo", "root")
	return err
}

type soakSettings struct {
	duration   time.Duration
	percent    int
	netem      bool
	victimName string
}

// cpuGroup is a cgroup with a CPU quota (v2 cpu.max, or v1 cfs quota where
// the cpu controller is still on the v1 hierarchy).
type cpuGroup struct {
	dir string
	v2  bool
}

func newCPUGroup(t *testing.T, name string, percent int) (*cpuGroup, error) {
	const period = 100000 // µs
	quota := period * percent / 100
	g := &cpuGroup{}
	if ctrls, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && strings.Contains(" "+string(ctrls)+" ", " cpu ") {
		g.v2, g.dir = true, filepath.Join("/sys/fs/cgroup", name)
	} else if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); err == nil {
		g.dir = filepath.Join("/sys/fs/cgroup/cpu", name)
	} else {
		return nil, fmt.Errorf("no cgroup cpu controller found (neither /sys/fs/cgroup/cgroup.controllers listing cpu nor /sys/fs/cgroup/cpu)")
	}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating cgroup: %w", err)
	}
	t.Cleanup(func() {
		if err := g.remove(); err != nil {
			t.Errorf("bench: %v", err)
		}
	})
	files := map[string]string{"cpu.cfs_period_us": strconv.Itoa(period), "cpu.cfs_quota_us": strconv.Itoa(quota)}
	if g.v2 {
		files = map[string]string{"cpu.max": fmt.Sprintf("%d %d", quota, period)}
	}
	for _, f := range []string{"cpu.cfs_period_us", "cpu.cfs_quota_us", "cpu.max"} {
		if v, ok := files[f]; ok {
			if err := os.WriteFile(filepath.Join(g.dir, f), []byte(v), 0o644); err != nil {
				return nil, fmt.Errorf("setting %s: %w", f, err)
			}
		}
	}
	return g, nil
}

// addNamespace moves every process of a network namespace into the group.
func (g *cpuGroup) addNamespace(ns string) error {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return fmt.Errorf("ip netns pids %s: %w", ns, err)
	}
	for _, pid := range strings.Fields(string(out)) {
		// A process that exited meanwhile cannot be moved: not an error.
		if err := os.WriteFile(filepath.Join(g.dir, "cgroup.procs"), []byte(pid), 0o644); err != nil && !os.IsNotExist(err) && !strings.Contains(err.Error(), "no such process") {
			if _, statErr := os.Stat(filepath.Join("/proc", pid)); statErr == nil {
				return fmt.Errorf("moving pid %s into %s: %w", pid, g.dir, err)
			}
		}
	}
	return nil
}

// stat reads cpu.stat: nr_periods, nr_throttled and the throttled time.
func (g *cpuGroup) stat() map[string]int64 {
	m := map[string]int64{}
	data, err := os.ReadFile(filepath.Join(g.dir, "cpu.stat"))
	if err != nil {
		return m
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				m[k] = n
			}
		}
	}
	return m
}

// remove kills whatever is left in the group and deletes it.
func (g *cpuGroup) remove() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := os.ReadFile(filepath.Join(g.dir, "cgroup.procs"))
		for _, s := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(s); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		err := os.Remove(g.dir)
		if err == nil || os.IsNotExist(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("removing cgroup %s: %w", g.dir, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sampleHeartbeats records how long ago each node's last heartbeat arrived,
// as the controller reports it (rdzvctl's own latency included, the same
// for every host).
func sampleHeartbeats(rc *rdzvCluster, ages map[string][]float64) {
	out, err := rc.ctl("-o", "json", "nodes")
	now := time.Now()
	if err != nil {
		return
	}
	var nodes struct {
		Nodes []struct {
			Info struct {
				Name string `json:"name"`
			} `json:"info"`
			LastHeartbeat time.Time `json:"last_heartbeat"`
		} `json:"nodes"`
	}
	if decode(out, &nodes) != nil {
		return
	}
	for _, n := range nodes.Nodes {
		if !n.LastHeartbeat.IsZero() {
			ages[n.Info.Name] = append(ages[n.Info.Name], now.Sub(n.LastHeartbeat).Seconds())
		}
	}
}

// controllerMetrics scrapes the controller's /metrics from h0 (it listens
// on h0's loopback); empty when it cannot be read.
func (b *bench) controllerMetrics(t *testing.T, h0 *netns.Host) map[string]float64 {
	ctx, cancel := context.WithTimeout(context.Background(), ctlTimeout)
	defer cancel()
	out, _, err := h0.Run(ctx, nil, "curl", "-sf", controllerMetrics)
	m := map[string]float64{}
	if err != nil {
		t.Logf("bench: scraping %s: %v", controllerMetrics, err)
		return m
	}
	for _, line := range strings.Split(out, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m
}

func soakEvents(t *testing.T, rc *rdzvCluster) []eventJSON {
	seen := map[string]bool{}
	var all []eventJSON
	for _, args := range [][]string{{"-o", "json", "events"}, {"-o", "json", "events", jobName}} {
		out, err := rc.ctl(args...)
		var evs struct {
			Events []eventJSON `json:"events"`
		}
		if err == nil {
			err = decode(out, &evs)
		}
		if err != nil {
			t.Errorf("bench: reading events: %v", err)
			continue
		}
		for _, ev := range evs.Events {
			key := ev.Time.String() + ev.Kind + ev.Node
			if !seen[key] {
				seen[key] = true
				all = append(all, ev)
			}
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Time.Before(all[j].Time) })
	return all
}

func countLines(path, substr string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(data), substr)
}

func diffInts(a, b map[string]int64) map[string]int64 {
	m := map[string]int64{}
	for k, v := range a {
		m[k] = v - b[k]
	}
	return m
}

func diffFloats(a, b map[string]float64) map[string]float64 {
	m := map[string]float64{}
	for k, v := range a {
		m[k] = v - b[k]
	}
	return m
}

// probeLateness reads a probe's log: wake-up delays in seconds within [from, to).
func probeLateness(p *netns.Proc, from, to time.Time) []float64 {
	data, _ := os.ReadFile(p.LogPath())
	var out []float64
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "PROBE" {
			continue
		}
		at, err1 := strconv.ParseFloat(f[1], 64)
		late, err2 := strconv.ParseFloat(f[2], 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if tt := unixTime(at); !tt.Before(from) && tt.Before(to) {
			out = append(out, late)
		}
	}
	return out
}

// quantiles formats p50/p99/max of xs in milliseconds.
func quantiles(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	q := func(p float64) float64 { return s[min(len(s)-1, int(p*float64(len(s))))] * 1000 }
	return fmt.Sprintf("%.0f/%.0f/%.0f", q(0.5), q(0.99), s[len(s)-1]*1000)
}

// stepStats is a host's training steps in a window: how many per second
// and the longest time between two.
func stepStats(ticks []tick, host string, from, to time.Time) (rate float64, maxGap time.Duration) {
	var ts []float64
	for _, k := range ticks {
		if tt := k.time(); k.host == host && !tt.Before(from) && tt.Before(to) {
			ts = append(ts, k.t)
		}
	}
	sort.Float64s(ts)
	for i := 1; i < len(ts); i++ {
		maxGap = max(maxGap, time.Duration((ts[i]-ts[i-1])*float64(time.Second)))
	}
	return float64(len(ts)) / to.Sub(from).Seconds(), maxGap
}

func soakReport(phases []*soakPhase, events []eventJSON, ticks []tick, probes map[string]*netns.Proc, s soakSettings) string {
	var w strings.Builder
	hosts := []string{"h1", "h2", "h3"}
	fmt.Fprintf(&w, "rdzv soak: false positives of the failure detector with %s's CPU saturated (no fault injected)\n\n", s.victimName)
	fmt.Fprintf(&w, "| phase | length s | nodes lost | attempt_failed | restarts | peer unreachable reports (agents) | controller 'silent but reachable' |\n")
	fmt.Fprintf(&w, "| --- | --- | --- | --- | --- | --- | --- |\n")
	totalFP := 0
	for _, ph := range phases {
		count := func(kind string) int {
			n := 0
			for _, ev := range events {
				if ev.Kind == kind && !ev.Time.Before(ph.start) && ev.Time.Before(ph.end) {
					n++
				}
			}
			return n
		}
		lost, failed := count("node_lost"), count("attempt_failed")
		totalFP += lost + failed
		var un []string
		for _, h := range hosts {
			if n, ok := ph.unreach[h]; ok {
				un = append(un, fmt.Sprintf("%s %d", h, n))
			}
		}
		fmt.Fprintf(&w, "| %s | %.0f | %d | %d | %d | %s | %d |\n", ph.name, ph.end.Sub(ph.start).Seconds(), lost, failed,
			count("rendezvous_committed"), strings.Join(un, ", "), ph.suspect)
	}

	fmt.Fprintf(&w, "\nStarvation (is it real?):\n\n")
	fmt.Fprintf(&w, "| phase | steps/s h1 h2 h3 | longest step gap h3 s | heartbeat age p50/p99/max ms h1 / h2 / h3 | probe wake-up delay p50/p99/max ms h1 (control) / h3 | cgroup throttled periods | throttled s |\n")
	fmt.Fprintf(&w, "| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, ph := range phases {
		var rates, ages []string
		var gap time.Duration
		for _, h := range hosts {
			r, g := stepStats(ticks, h, ph.start, ph.end)
			rates = append(rates, fmt.Sprintf("%.1f", r))
			if h == s.victimName {
				gap = g
			}
			ages = append(ages, quantiles(ph.hbAge[h]))
		}
		var pr []string
		for _, h := range []string{"h1", s.victimName} {
			if p := probes[h]; p != nil {
				pr = append(pr, quantiles(probeLateness(p, ph.start, ph.end)))
			}
		}
		throttled := float64(ph.cpuStat["throttled_time"]) / 1e9 // v1, ns
		if us, ok := ph.cpuStat["throttled_usec"]; ok {
			throttled = float64(us) / 1e6
		}
		fmt.Fprintf(&w, "| %s | %s | %s | %s | %s | %d of %d | %.1f |\n", ph.name, strings.Join(rates, " "), secs(gap),
			strings.Join(ages, " / "), strings.Join(pr, " / "), ph.cpuStat["nr_throttled"], ph.cpuStat["nr_periods"], throttled)
	}

	fmt.Fprintf(&w, "\nController /metrics, increase per phase:\n\n")
	for _, ph := range phases {
		var parts []string
		keys := make([]string, 0, len(ph.metrics))
		for k := range ph.metrics {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v := ph.metrics[k]
			if v == 0 {
				continue
			}
			if strings.HasPrefix(k, "rdzv_attempts_failed_total") || strings.HasPrefix(k, "rdzv_nodes_lost_total") ||
				strings.HasPrefix(k, "rdzv_job_restarts_total") || strings.HasPrefix(k, "rdzv_heartbeat_interval_seconds") {
				parts = append(parts, fmt.Sprintf("%s %g", k, v))
			}
		}
		if len(parts) == 0 {
			parts = []string{"(no change or no metrics)"}
		}
		fmt.Fprintf(&w, "- %s: %s\n", ph.name, strings.Join(parts, "; "))
	}

	fmt.Fprintf(&w, "\nFalse positives (nodes lost + attempt_failed, all phases; no fault was injected): %d\n", totalFP)
	fmt.Fprintf(&w, "\nSettings: h0 controller (embedded etcd), h1..h3 agents, one job (nodes {min: %d, max: %d}, 1 proc per node,\n", soakHosts-1, soakHosts)
	fmt.Fprintf(&w, "test/bench/bench_worker.py, --step-time %s, gloo); heartbeat interval %s, timeout %s; baseline %s unsaturated, then\n", stepTime, heartbeatInterval, heartbeatTimeout, soakBaseline)
	fmt.Fprintf(&w, "%s with every process of %s (agent, torchrun, shim, worker, probe) and %d busy loops in one cgroup capped at %d%% of one CPU", s.duration, s.victimName, soakHogs, s.percent)
	if s.netem {
		fmt.Fprintf(&w, ";\nthe second half also with netem delay %s ± %s on %s's eth0 (its outgoing packets)", netemDelay, netemJitter, s.victimName)
	}
	fmt.Fprintf(&w, ".\nheartbeat age: now − the node's last_heartbeat in `rdzvctl nodes`, sampled every %s (includes rdzvctl's latency);\n", samplePeriod)
	fmt.Fprintf(&w, "probe: a python loop sleeping 100 ms, how late it woke (the scheduling delay of its cgroup).\n")
	return w.String()
}
