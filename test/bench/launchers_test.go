//go:build bench

package bench

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdzv/rdzv/test/netns"
	"github.com/rdzv/rdzv/test/sim"
)

// The systems that run one launcher process per host and no controller:
// torchrun elastic, NVIDIA's ft_launcher (nvidia-resiliency-ext) and
// torchft (a torchrun per replica group, and the lighthouse on h0).
const (
	torchftLighthousePort = "29510"
	// torchft's lighthouse: min_replicas 2 like rdzv's nodes.min; a dead
	// replica is dropped after 3 s without heartbeats (rdzv's heartbeat
	// timeout; default 5 s); stragglers are waited for 1 s before a quorum
	// is issued (rdzv's last_call; default 60 s, which would stall every
	// reconfiguration by a minute); the quorum is re-checked every 100 ms.
	torchftMinReplicas      = 2
	torchftHeartbeatTimeout = 3 * time.Second
	torchftJoinTimeout      = time.Second
	torchftQuorumTick       = 100 * time.Millisecond
)

// launchers is one run of a launcher-based system on h1..h3.
type launchers struct {
	system string
	procs  map[int]*netns.Proc // each training host's launcher, the latest one started
	start  func(i int) *netns.Proc
	aux    []*netns.Proc // torchft's lighthouse
	// hosts are the hosts with a launcher, h1..hN (the training hosts and
	// the goodput run's spares).
	hosts int
	// faulted are the hosts a fault was injected on: their launcher may be
	// gone from then on.
	faulted map[int]bool
}

// launcherEnv is every launcher's environment: the worker's hooks and
// durable checkpoints, gloo on the hosts' link.
func (b *bench) launcherEnv(d runDirs) []string {
	return []string{"GLOO_SOCKET_IFNAME=eth0", "OMP_NUM_THREADS=1", "RDZV_CHECKPOINT_DIR=" + d.ckpt,
		"BENCH_RESUME_LATEST=1", "BENCH_TICK_DIR=" + d.ticks, "BENCH_HANG_DIR=" + d.hang,
		"BENCH_STATE_MB=" + strconv.Itoa(b.stateMB)}
}

// launcherArgv is host i's launcher command line for system.
func (b *bench) launcherArgv(system string, net *netns.Cluster, d runDirs, i, steps, restarts int) []string {
	h := net.Host(i)
	logDir := filepath.Join(d.root, "launcher-logs", h.Name, strconv.FormatInt(time.Now().UnixNano(), 10))
	store := net.Host(1).IP + ":" + torchrunStorePort
	switch system {
	case "torchrun":
		args := []string{b.torchrun, "--nnodes=1:3", "--nproc_per_node=1", "--rdzv_backend=c10d",
			"--rdzv_endpoint=" + store, "--rdzv_id=bench", "--max_restarts=" + strconv.Itoa(restarts)}
		if b.rdzvConf != "" {
			args = append(args, "--rdzv_conf="+b.rdzvConf)
		}
		args = append(args, "--redirects", "2", "--tee", "2", "--log_dir", logDir, "--monitor_interval", "1", b.script)
		return append(args, trainArgs(steps)...)
	case "nvrx":
		// ft_launcher as its fault-tolerance guide sets it up for fast
		// in-job restarts (see nvrxSettings in the report).
		args := []string{b.venvBin("ft_launcher"), "--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
			"--rdzv-endpoint=" + store, "--rdzv-id=bench", "--rdzv-conf=" + nvrxRdzvConf,
			"--max-restarts=" + strconv.Itoa(restarts), "--ft-restart-policy=any-failed",
			"--workers-stop-timeout=" + nvrxWorkersStopTimeout,
			"--ft-initial-rank-heartbeat-timeout=" + nvrxInitialHeartbeatTimeout,
			"--ft-rank-heartbeat-timeout=" + nvrxHeartbeatTimeout,
			"--ft-workload-check-interval=" + nvrxCheckInterval,
			"--ft-node-health-check-interval=" + nvrxCheckInterval,
			"--ft-enable-nic-monitor=false",
			"--log-dir", logDir, b.script}
		return append(args, trainArgs(steps)...)
	case "torchft":
		// One replica group per host, each its own torchrun (a local c10d
		// store on the host's address), restarting a dead worker in place.
		args := []string{b.venvBin("torchrun"), "--nnodes=1", "--nproc_per_node=1", "--rdzv_backend=c10d",
			"--rdzv_endpoint=" + h.IP + ":" + torchrunStorePort, "--rdzv_id=bench-" + h.Name,
			"--max_restarts=" + strconv.Itoa(restarts), "--monitor_interval", "1",
			"--redirects", "2", "--tee", "2", "--log_dir", logDir, b.torchftScript}
		return append(args, trainArgs(steps)...)
	}
	panic("bench: no launcher for system " + system)
}

const (
	// ft_launcher: the rank monitor kills a rank 5 s after its last
	// heartbeat (rdzv's progress timeout; default 45 min), allows 60 s for
	// the first one (start-up, torch import, resume), checks every second
	// (default 5 s); stops ranks for a restart within 5 s (default 30 s);
	// c10d rendezvous last call 1 s (rdzv's; torch's default 30 s).
	nvrxHeartbeatTimeout        = "5"
	nvrxInitialHeartbeatTimeout = "60"
	nvrxCheckInterval           = "1"
	nvrxWorkersStopTimeout      = "5"
	nvrxRdzvConf                = "last_call_timeout=1"
)

func (b *bench) venvBin(name string) string { return filepath.Join(b.venv, "bin", name) }

// startLaunchers starts system's launchers on h1..h<hosts> (and torchft's
// lighthouse on h0). Beyond 3 hosts, torchrun and ft_launcher keep the
// others as spares (--nnodes=...:3: a node past max_nodes waits in the
// rendezvous's redundancy list until a participant is lost).
func (b *bench) startLaunchers(t *testing.T, system string, net *netns.Cluster, d runDirs, hosts, steps, restarts int) *launchers {
	env := b.launcherEnv(d)
	switch system {
	case "nvrx":
		env = append(env, "BENCH_NVRX=1")
	case "torchft":
		env = append(env, "TORCHFT_LIGHTHOUSE=http://"+net.Host(0).IP+":"+torchftLighthousePort,
			"NUM_REPLICA_GROUPS="+strconv.Itoa(nodeHosts))
	}
	l := &launchers{system: system, hosts: hosts, procs: map[int]*netns.Proc{}, faulted: map[int]bool{}}
	if system == "torchft" {
		l.aux = append(l.aux, net.Host(0).Start(t, "lighthouse", nil, b.venvBin("torchft_lighthouse"),
			"--bind", "[::]:"+torchftLighthousePort, "--min_replicas", strconv.Itoa(torchftMinReplicas),
			"--heartbeat_timeout_ms", strconv.FormatInt(torchftHeartbeatTimeout.Milliseconds(), 10),
			"--join_timeout_ms", strconv.FormatInt(torchftJoinTimeout.Milliseconds(), 10),
			"--quorum_tick_ms", strconv.FormatInt(torchftQuorumTick.Milliseconds(), 10)))
	}
	l.start = func(i int) *netns.Proc {
		hostEnv := env
		if system == "torchft" {
			hostEnv = append(append([]string(nil), env...), "REPLICA_GROUP_ID="+strconv.Itoa(i-1))
		}
		p := net.Host(i).Start(t, system, hostEnv, b.launcherArgv(system, net, d, i, steps, restarts)...)
		l.procs[i] = p
		return p
	}
	for i := 1; i <= hosts; i++ {
		l.start(i)
	}
	return l
}

// gaveUp reports the launchers exiting: before the fault any of them, after
// it every one but the victim's.
func (l *launchers) gaveUp() string {
	var exited []string
	live := 0
	for i := 1; i <= l.hosts; i++ {
		if l.faulted[i] {
			continue
		}
		live++
		select {
		case <-l.procs[i].Exited():
			exited = append(exited, fmt.Sprintf("%s: %v", l.procs[i].Host.Name, l.procs[i].Wait()))
		default:
		}
	}
	if (len(l.faulted) == 0 && len(exited) > 0) || len(exited) == live {
		return l.system + " launcher exited (" + strings.Join(exited, "; ") + ")"
	}
	for _, p := range l.aux {
		select {
		case <-p.Exited():
			return fmt.Sprintf("%s on %s exited: %v", p.Name, p.Host.Name, p.Wait())
		default:
		}
	}
	return ""
}

func (l *launchers) diagnose(t *testing.T) {
	for i := 1; i <= l.hosts; i++ {
		t.Logf("bench: last lines of %s:\n%s", l.procs[i].LogPath(), sim.TailFile(l.procs[i].LogPath(), 20))
	}
	for _, p := range l.aux {
		t.Logf("bench: last lines of %s:\n%s", p.LogPath(), sim.TailFile(p.LogPath(), 20))
	}
}

// runLaunchers is one per-fault run of torchrun elastic, ft_launcher or
// torchft.
func (b *bench) runLaunchers(t *testing.T, r *result) {
	d := b.dirs(t, r)
	net := netns.NewCluster(t, 1+nodeHosts, filepath.Join(d.root, "proc-logs"))
	defer killAll(net)
	l := b.startLaunchers(t, r.system, net, d, nodeHosts, trainSteps, maxRestarts)
	before, err := waitUnderWay(d.ticks, l.gaveUp)
	if err != nil {
		r.failed = err.Error()
		t.Errorf("bench: %s", r.failed)
		l.diagnose(t)
		return
	}
	l.faulted[victim] = true
	t0, what, err := b.inject(net, r.fault, d, before, victim)
	if err != nil {
		r.failed = fmt.Sprintf("injecting %s: %v", r.fault, err)
		t.Errorf("bench: %s", r.failed)
		l.diagnose(t)
		return
	}
	t.Logf("bench: injected %s at %s: %s (h3 was at step %d)", r.fault, t0.Format("15:04:05.000"), what, before[net.Host(victim).Name].step)
	var first tick
	var ok bool
	var why string
	if r.system == "torchft" {
		first, ok, why = waitFor(d.ticks, t0, b.cap, l.gaveUp, firstQuorumTickAfter)
	} else {
		first, ok, why = waitRecovery(d.ticks, t0, b.cap, l.gaveUp)
	}
	r.recovered, r.first, r.note = ok, first, why
	if !ok {
		t.Logf("bench: %s did not recover from %s: %s", r.system, r.fault, why)
		l.diagnose(t)
		return
	}
	r.recovery = first.time().Sub(t0)
	r.setRecomputed(readTicks(d.ticks), t0)
	if r.system != "torchft" {
		r.phases = append(workerPhases(readPhases(d.ticks), t0), phase{"step", r.recovery})
		r.timeline = fmt.Sprintf("+%ss first step (step %d, restart %s, %s)", secs(r.recovery), first.step, strings.TrimPrefix(first.gen, "r"), first.host)
		return
	}
	// torchft: the survivors' first step in a new quorum is the recovery;
	// the victim's replica group rejoining (a new worker's first committed
	// step, after healing from a peer) comes later, if at all, and training
	// does not wait for it. Wait a little for it so the run can report it.
	r.phases = []phase{{"step", r.recovery}}
	r.timeline = fmt.Sprintf("+%ss first step in a new quorum (step %d, quorum %d, %d participants, %s)", secs(r.recovery), first.step, first.quorum, first.participants, first.host)
	if k, ok, _ := waitFor(d.ticks, t0, rejoinWait, l.gaveUp, firstTickAfter); ok {
		// python, torch, pg: the rejoining worker's start-up.
		r.phases = append(append(r.phases, workerPhases(readPhases(d.ticks), t0)...), phase{"rejoin", k.time().Sub(t0)})
		r.timeline += fmt.Sprintf(", +%ss %s rejoined (step %d, %d participants)", secs(k.time().Sub(t0)), k.host, k.step, k.participants)
	} else {
		r.timeline += fmt.Sprintf(", %s's replica group did not rejoin within %s", net.Host(victim).Name, rejoinWait)
	}
}

// rejoinWait bounds how long a torchft run waits, after its survivors
// recovered, for the victim's replica group to rejoin.
const rejoinWait = 30 * time.Second

// firstQuorumTickAfter is torchft's first step after recovery: the earliest
// step committed after t0 in a quorum newer than every quorum a step was
// committed in before t0. A step in flight at the fault that still commits
// in the old quorum does not count.
func firstQuorumTickAfter(ticks []tick, t0 time.Time) (tick, bool) {
	t0s := unixSeconds(t0)
	last := -1
	for _, k := range ticks {
		if k.t <= t0s && k.quorum > last {
			last = k.quorum
		}
	}
	var best tick
	found := false
	for _, k := range ticks {
		if k.hang || k.t <= t0s || k.quorum <= last {
			continue
		}
		if !found || k.t < best.t {
			best, found = k, true
		}
	}
	return best, found
}

// waitFor polls the ticks until first finds the recovery.
func waitFor(tickDir string, t0 time.Time, limit time.Duration, gaveUp func() string, first func([]tick, time.Time) (tick, bool)) (tick, bool, string) {
	for {
		if k, ok := first(readTicks(tickDir), t0); ok {
			return k, true, ""
		}
		if why := gaveUp(); why != "" {
			return tick{}, false, why
		}
		if time.Since(t0) > limit {
			return tick{}, false, fmt.Sprintf("no recovery within %s", limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// setRecomputed counts the steps done again after the resume: the furthest
// step any worker had finished before the fault minus the step the first
// step after recovery continues from.
func (r *result) setRecomputed(ticks []tick, t0 time.Time) {
	t0s := unixSeconds(t0)
	reached := 0
	for _, k := range ticks {
		if k.t <= t0s && k.step > reached {
			reached = k.step
		}
	}
	r.hasRecomputed, r.recomputed = true, max(0, reached-(r.first.step-1))
}
