package agent

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func TestWarmHandoffEnv(t *testing.T) {
	a := &rdzvv1.Assignment{Spec: &rdzvv1.JobSpec{Name: "llm"}, Generation: 7, NodeRank: 1, Nnodes: 3, ProcsPerNode: 2,
		MasterAddr: "10.0.0.1", MasterPort: 29500}
	tests := []struct {
		name     string
		env      []string
		wantOMP  string
		wantNCCL string
	}{
		{"torchrun's defaults", []string{"PATH=/usr/bin", "RDZV_RESUME_FROM=/ck/step-5"}, "1", "1"},
		{"the job's own values", []string{"OMP_NUM_THREADS=8", "NCCL_ASYNC_ERROR_HANDLING=0"}, "8", "0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := warmHandoff(a, tt.env, []string{"-m", "pkg.train", "--lr", "1"}, nil, "/errs")
			require.Equal(t, []string{"-m", "pkg.train", "--lr", "1"}, h.Argv)
			require.Len(t, h.Workers, 2)
			for local, w := range h.Workers {
				rank := fmt.Sprint(2 + local)
				for k, v := range map[string]string{
					"RANK": rank, "LOCAL_RANK": fmt.Sprint(local), "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2",
					"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "3", "ROLE_RANK": rank, "ROLE_WORLD_SIZE": "6", "ROLE_NAME": "default",
					"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "0",
					"TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "llm-7", "TORCHELASTIC_USE_AGENT_STORE": "True",
					"OMP_NUM_THREADS": tt.wantOMP, "NCCL_ASYNC_ERROR_HANDLING": tt.wantNCCL,
				} {
					require.Equal(t, v, w.Env[k], "local rank %d: %s", local, k)
				}
				require.Equal(t, fmt.Sprintf("/errs/%d/error.json", local), w.Env["TORCHELASTIC_ERROR_FILE"])
				for _, kv := range tt.env {
					k, v, _ := strings.Cut(kv, "=")
					require.Equal(t, v, w.Env[k], "the launcher's environment is the worker's too")
				}
			}
		})
	}
}

// With an answer from the node's torch, the workers get what that
// torchrun adds, no more (no 1.13 NCCL_ASYNC_ERROR_HANDLING on 2.x), with
// rdzv's assignment in place of the probe's own run.
func TestWarmHandoffProbedEnv(t *testing.T) {
	a := &rdzvv1.Assignment{Spec: &rdzvv1.JobSpec{Name: "llm"}, Generation: 7, NodeRank: 1, Nnodes: 3, ProcsPerNode: 2,
		MasterAddr: "10.0.0.1", MasterPort: 29500}
	h := warmHandoff(a, []string{"PATH=/usr/bin", "TORCH_NCCL_ASYNC_ERROR_HANDLING=3"}, []string{"train.py"}, torch215, "/errs")
	require.Equal(t, "/errs", h.ErrorDir)
	for local, w := range h.Workers {
		require.Equal(t, map[string]string{
			"PATH": "/usr/bin", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "OMP_NUM_THREADS": "1",
			"TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
			"TORCHELASTIC_ERROR_FILE":        fmt.Sprintf("/errs/%d/error.json", local),
			"RANK":                           fmt.Sprint(2 + local), "LOCAL_RANK": fmt.Sprint(local), "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2",
			"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "3", "ROLE_RANK": fmt.Sprint(2 + local), "ROLE_WORLD_SIZE": "6", "ROLE_NAME": "default",
			"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "0",
			"TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "llm-7", "TORCHELASTIC_USE_AGENT_STORE": "True",
		}, w.Env, "local rank %d", local)
	}
}

// Node rank 0's standby serves the generation's store; the others wait
// for it.
func TestWarmHandoffStore(t *testing.T) {
	for _, tt := range []struct {
		node  uint32
		serve bool
	}{{0, true}, {1, false}, {2, false}} {
		a := &rdzvv1.Assignment{Spec: &rdzvv1.JobSpec{Name: "llm"}, Generation: 7, NodeRank: tt.node, Nnodes: 3, ProcsPerNode: 1,
			MasterAddr: "10.0.0.1", MasterPort: 29500}
		require.Equal(t, handoffStore{Addr: "10.0.0.1", Port: 29500, Serve: tt.serve}, warmHandoff(a, nil, []string{"train.py"}, nil, "/errs").Store, "node rank %d", tt.node)
	}
}

func TestStandbyEnvOMP(t *testing.T) {
	require.Equal(t, []string{"A=1", "OMP_NUM_THREADS=1"}, standbyEnv(&rdzvv1.JobSpec{ProcsPerNode: 2}, []string{"A=1"}))
	require.Equal(t, []string{"A=1"}, standbyEnv(&rdzvv1.JobSpec{ProcsPerNode: 1}, []string{"A=1"}))
	require.Equal(t, []string{"OMP_NUM_THREADS=4"}, standbyEnv(&rdzvv1.JobSpec{ProcsPerNode: 2}, []string{"OMP_NUM_THREADS=4"}))
}

// warmScript records, at import, each worker's view: the marker of a
// standby that ran the job's code before its assignment would have no
// RANK.
// A worker exits only once every worker of its generation on the node
// has written its marker (the first to fail has the others stopped), and
// the file HOLD, if set, is gone.
const warmScript = `import glob, os, sys, time
d, gen = os.environ["MARKERS"], os.environ.get("RDZV_GENERATION")
name = os.path.join(d, "%d-%s" % (os.getpid(), os.environ.get("RANK", "none")))
with open(name + ".tmp", "w") as f:
    f.write("%d %s %s %s %s %s" % (os.getuid(), os.environ.get("LOCAL_RANK"), os.environ.get("WORLD_SIZE"),
        os.environ.get("TORCHELASTIC_USE_AGENT_STORE"), gen, " ".join(sys.argv[1:])))
os.rename(name + ".tmp", name)
while sum(1 for p in glob.glob(os.path.join(d, "*-*")) if not p.endswith(".tmp") and open(p).read().split()[4] == gen) < int(os.environ["LOCAL_WORLD_SIZE"]):
    time.sleep(0.01)
while os.path.exists(os.environ.get("HOLD", "")):
    time.sleep(0.01)
sys.exit(int(os.environ.get("EXIT_CODE_" + gen, os.environ.get("EXIT_CODE"))))
`

// warmHarness runs warm jobs as nobody, whose workers record what they
// saw in markers. Its assignments are node rank 1's, whose standby forks
// the workers once node rank 0's store listens: store stands for it.
type warmHarness struct {
	*supHarness
	markers string
	store   *net.TCPAddr
}

func newWarmHarness(t *testing.T, edits ...func(*Config)) *warmHarness {
	t.Helper()
	if _, err := os.Stat(warmPython); err != nil {
		t.Skip("needs " + warmPython)
	}
	h := newSupervisor(t, append([]func(*Config){func(c *Config) { c.RunAs = fmt.Sprintf("%d:%d", nobodyID, nobodyID) }}, edits...)...)
	// The job's user reads the agent's script and the job's.
	for _, d := range []string{h.stateDir, filepath.Dir(h.stateDir), h.workdir, filepath.Dir(h.workdir)} {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	markers := t.TempDir()
	require.NoError(t, os.Chmod(markers, 0o777))
	require.NoError(t, os.Chmod(filepath.Dir(markers), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(h.workdir, "train.py"), []byte(warmScript), 0o644))
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(h.stateDir, "logs", "warm.log"))
			t.Logf("job log:\n%s", b)
		}
	})
	store, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	return &warmHarness{supHarness: h, markers: markers, store: store.Addr().(*net.TCPAddr)}
}

const (
	warmPython = "/usr/bin/python3"
	nobodyID   = 65534
)

// assign is generation gen of job warm, whose workers exit with code.
func (h *warmHarness) assign(gen uint64, code int) *rdzvv1.Assignment {
	a := h.assignment("warm", gen, "--lr", "1")
	a.Spec.LauncherTorchrun = ""
	// An optional module that is not installed (as torch._dynamo is not
	// under torch 1.x) leaves the standby up.
	a.Spec.LauncherKind, a.Spec.LauncherPython, a.Spec.LauncherPreload = "warm", warmPython, []string{"json", "rdzv_not_installed?"}
	a.Spec.Env = map[string]string{"MARKERS": h.markers, "EXIT_CODE": fmt.Sprint(code)}
	a.MasterAddr, a.MasterPort = h.store.IP.String(), uint32(h.store.Port)
	return a
}

// readMarkers is "<rank>: <what the worker saw>" for every worker so far.
func (h *warmHarness) readMarkers() []string {
	entries, err := os.ReadDir(h.markers)
	require.NoError(h.t, err)
	var out []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(h.markers, e.Name()))
		require.NoError(h.t, err)
		out = append(out, strings.SplitN(e.Name(), "-", 2)[1]+": "+string(b))
	}
	return out
}

// workerPids are the pids of generation gen's workers that wrote their
// marker.
func (h *warmHarness) workerPids(gen string) []int {
	entries, err := os.ReadDir(h.markers)
	require.NoError(h.t, err)
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d-", &pid); err != nil || strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(h.markers, e.Name()))
		require.NoError(h.t, err)
		if strings.Fields(string(b))[4] == gen {
			pids = append(pids, pid)
		}
	}
	return pids
}

// readyStandby is the standby started for the next generation, once it
// listens (its imports done).
func (h *warmHarness) readyStandby() *standby {
	h.t.Helper()
	// The standby is kept after the generation's RUNNING is reported.
	var sb *standby
	require.Eventually(h.t, func() bool {
		sb = h.sup.view.Load().standby
		return sb != nil
	}, waitTimeout, 10*time.Millisecond, "a standby is started for the next generation")
	<-sb.ready
	require.NoError(h.t, sb.err)
	require.Eventually(h.t, func() bool {
		_, err := os.Stat(filepath.Join(sb.dir, sb.sock))
		return err == nil
	}, waitTimeout, 10*time.Millisecond)
	return sb
}

// A standby runs as the job's user and runs nothing of the job's before its
// assignment; each hand-off forks one worker per local rank with torchrun's
// environment, and the used standby is replaced.
func TestWarmStandby(t *testing.T) {
	h := newWarmHarness(t)
	// Generation 2's workers wait while hold exists; generation 1's find
	// none.
	// The same spec for both, as a job's generations have: a standby
	// serves only the spec it was started for.
	hold := filepath.Join(h.workdir, "hold")
	assign := func(gen uint64, _ int) *rdzvv1.Assignment {
		a := h.assign(gen, 0)
		delete(a.Spec.Env, "EXIT_CODE")
		a.Spec.Env["EXIT_CODE_1"], a.Spec.Env["EXIT_CODE_2"], a.Spec.Env["HOLD"] = "3", "0", hold
		return a
	}

	// Generation 1 finds no standby and starts a fresh one at once.
	h.sup.Assign(assign(1, 3))
	h.expect("warm", 1, wRunning)
	h.expect("warm", 1, wFailed)
	require.ElementsMatch(t, []string{
		"2: 65534 0 4 True 1 --lr 1",
		"3: 65534 1 4 True 1 --lr 1",
	}, h.readMarkers())

	// The next standby is up, importing done, listening: still no code of
	// the job's has run.
	sb := h.readyStandby()
	require.Len(t, h.readMarkers(), 2, "the standby ran none of the job's code")
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", sb.proc.Pid()))
	require.NoError(t, err)
	require.Regexp(t, fmt.Sprintf(`(?m)^Uid:\s+%d\s`, nobodyID), string(status), "the standby runs as the job's user")
	info, err := os.Stat(sb.dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), info.Mode().Perm(), "only the job's user and root reach the standby's socket")
	raises := canRaisePriority()
	if raises {
		require.Equal(t, standbyNice, procStatField(t, sb.proc.Pid(), 16), "a standby prepares at the lowest priority")
	}

	// Generation 2 is handed to it, and succeeds: the job's last, so no
	// standby is left once its exit is reported, not even the one started
	// for a generation 3.
	standbyPid := sb.proc.Pid()
	require.NoError(t, os.WriteFile(hold, nil, 0o644))
	h.sup.Assign(assign(2, 0))
	h.expect("warm", 2, wRunning)
	nextPid := h.readyStandby().proc.Pid()
	// Generation 2's workers hold, the standby's children: their pids name
	// their markers.
	var workers []int
	require.Eventually(t, func() bool {
		workers = h.workerPids("2")
		return len(workers) == 2
	}, waitTimeout, 10*time.Millisecond)
	for _, pid := range workers {
		require.Equal(t, standbyPid, procStatField(t, pid, 1), "generation 2 is handed to the standby")
		if raises {
			require.Equal(t, workerNice, procStatField(t, pid, 16), "generation 2's worker %d runs at the workers' priority", pid)
		}
	}
	if raises {
		require.Equal(t, workerNice, procStatField(t, standbyPid, 16), "the used standby is raised at its hand-off")
		require.Equal(t, standbyNice, procStatField(t, nextPid, 16), "the next standby prepares at the lowest priority")
	}
	require.NoError(t, os.Remove(hold))
	st := h.expect("warm", 2, wSucceeded)
	require.Equal(t, int32(0), st.GetExitCode())
	require.ElementsMatch(t, []string{
		"2: 65534 0 4 True 1 --lr 1", "3: 65534 1 4 True 1 --lr 1",
		"2: 65534 0 4 True 2 --lr 1", "3: 65534 1 4 True 2 --lr 1",
	}, h.readMarkers())
	left := h.sup.view.Load().standby
	require.Nil(t, left, "the standby of a finished job is killed before its exit is reported")
	require.Empty(t, groupMembers(nextPid), "nothing of the next standby is left when the exit is reported")
	require.Empty(t, groupMembers(standbyPid), "nothing of the used standby is left")
}

// A failed generation leaves a standby for the next one. The stop that
// says the job ended takes it at once; a stop of the generation alone
// leaves it for the restart, for standbyLinger on the supervisor's clock.
func TestWarmStandbyEndsWithTheJob(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ended bool
	}{
		{name: "the job ended", ended: true},
		{name: "the generation stopped", ended: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newWarmHarness(t)
			clock := clockwork.NewFakeClock()
			h.setClock(clock)
			h.sup.Assign(h.assign(1, 3))
			h.expect("warm", 1, wRunning)
			h.expect("warm", 1, wFailed)
			sb := h.readyStandby()

			h.sup.Ordered(&rdzvv1.StopWorkers{Job: "warm", Generation: 1, Reason: "restart limit reached", JobEnded: tc.ended})
			// Nothing of generation 1 runs: the stop is answered with its
			// status again.
			h.expect("warm", 1, wFailed)
			h.sync()
			left := h.sup.view.Load().standby
			if tc.ended {
				require.Nil(t, left, "no standby is kept for a job that ended")
				require.Empty(t, groupMembers(sb.proc.Pid()), "nothing of the standby is left")
				return
			}
			require.Same(t, sb, left, "the standby waits for the next generation")
			require.NotEmpty(t, groupMembers(sb.proc.Pid()))

			// No generation came: it goes once it has lingered.
			clock.Advance(standbyLinger - time.Second)
			h.sync()
			left = h.sup.view.Load().standby
			require.Same(t, sb, left, "the standby lingers for standbyLinger")
			clock.Advance(time.Second)
			require.Eventually(t, func() bool {
				h.sync()
				return h.sup.view.Load().standby == nil
			}, waitTimeout, 10*time.Millisecond, "the standby is dropped after standbyLinger")
			require.Eventually(t, func() bool { return len(groupMembers(sb.proc.Pid())) == 0 }, waitTimeout, 10*time.Millisecond,
				"nothing of the standby is left")
		})
	}
}

// The linger of an earlier generation's exit never drops the standby a
// later generation left: with a fault a minute, the timer armed at one
// exit used to fire between the next generation's exit and the following
// assignment, which then waited for a fresh standby's imports.
func TestWarmStandbyOutlivesAnEarlierLinger(t *testing.T) {
	h := newWarmHarness(t)
	clock := clockwork.NewFakeClock()
	h.setClock(clock)
	standby := func() *standby {
		h.sync()
		return h.sup.view.Load().standby
	}
	h.sup.Assign(h.assign(1, 3))
	h.expect("warm", 1, wRunning)
	h.expect("warm", 1, wFailed)
	h.readyStandby()

	clock.Advance(standbyLinger / 2)
	h.sup.Assign(h.assign(2, 3))
	h.expect("warm", 2, wRunning)
	h.expect("warm", 2, wFailed)
	sb := h.readyStandby()

	// Generation 1's linger is over; generation 2's is not. The timer's
	// function runs on a goroutine of its own: a drop would follow within
	// moments.
	clock.Advance(standbyLinger / 2)
	require.Never(t, func() bool { return standby() != sb }, time.Second, 10*time.Millisecond,
		"generation 2's standby waits for generation 3")
	require.NotEmpty(t, groupMembers(sb.proc.Pid()))
	clock.Advance(standbyLinger / 2)
	require.Eventually(t, func() bool { return standby() == nil }, waitTimeout, 10*time.Millisecond,
		"the standby is dropped once generation 2's exit has lingered")
}

// A standby that died waiting never fails a generation: a fresh one takes
// the assignment.
func TestWarmStandbyCrashed(t *testing.T) {
	h := newWarmHarness(t)
	h.sup.Assign(h.assign(1, 3))
	h.expect("warm", 1, wRunning)
	h.expect("warm", 1, wFailed)
	sb := h.readyStandby()
	require.NoError(t, syscall.Kill(sb.proc.Pid(), syscall.SIGKILL))
	<-sb.exited

	h.sup.Assign(h.assign(2, 3))
	h.expect("warm", 2, wRunning)
	st := h.expect("warm", 2, wFailed)
	require.Equal(t, int32(3), st.GetExitCode(), "the workers' code, not a failed start")
	require.ElementsMatch(t, []string{
		"2: 65534 0 4 True 1 --lr 1", "3: 65534 1 4 True 1 --lr 1",
		"2: 65534 0 4 True 2 --lr 1", "3: 65534 1 4 True 2 --lr 1",
	}, h.readMarkers())
}

// A standby killed before its hand-off (its shim fences it when the
// agent's lease lapses on a starved node) does not fail the generation: a
// fresh one takes the assignment.
func TestWarmStandbyKilledBeforeHandoff(t *testing.T) {
	h := newWarmHarness(t)
	// Each standby's preload records its pid in starts, then waits there
	// for "go": the test kills the first before it can listen.
	starts := t.TempDir()
	require.NoError(t, os.Chmod(starts, 0o777))
	require.NoError(t, os.WriteFile(filepath.Join(h.workdir, "gated.py"), []byte(`import os, time
d = os.environ["STARTS"]
open(os.path.join(d, str(os.getpid())), "w").close()
while not os.path.exists(os.path.join(d, "go")):
    time.sleep(0.01)
`), 0o644))
	a := h.assign(1, 0)
	a.Spec.LauncherPreload = []string{"gated"}
	a.Spec.Env["STARTS"] = starts
	a.Spec.Env["PYTHONPATH"] = h.workdir
	h.sup.Assign(a)
	started := func(n int) []os.DirEntry {
		var entries []os.DirEntry
		require.Eventually(t, func() bool {
			var err error
			entries, err = os.ReadDir(starts)
			require.NoError(t, err)
			return len(entries) >= n
		}, waitTimeout, 10*time.Millisecond, "standby %d imports its preload", n)
		return entries
	}
	first, err := strconv.Atoi(started(1)[0].Name())
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(first, syscall.SIGKILL))
	// Each wait bounded on its own: the agent sees the death once the
	// node's torch has been probed, then starts the fresh standby.
	started(2)
	require.NoError(t, os.WriteFile(filepath.Join(starts, "go"), nil, 0o644))
	h.expect("warm", 1, wRunning)
	h.expect("warm", 1, wSucceeded)
	require.ElementsMatch(t, []string{"2: 65534 0 4 True 1 --lr 1", "3: 65534 1 4 True 1 --lr 1"}, h.readMarkers())
}

// storeScript is a worker of the store tests. probe: it connects to
// MASTER_PORT at its start and records the line it reads there, "refused"
// if nothing listened. env, tcp: it waits for
// the test's gate, then rendezvouses as an unchanged torchrun script would
// (init_process_group with env://, or tcp:// from MASTER_ADDR and
// MASTER_PORT), all-reduces a one, and records its process group, what
// TORCHELASTIC_USE_AGENT_STORE it saw and the sum. Markers are
// store-<rank>; the gate is in the workdir.
const storeScript = `import os, socket, sys, time
d, rank = os.environ["MARKERS"], os.environ["RANK"]
addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
def record(what):
    name = os.path.join(d, "store-" + rank)
    with open(name + ".tmp", "w") as f:
        f.write(what)
    os.rename(name + ".tmp", name)
if sys.argv[1] == "probe":
    try:
        with socket.create_connection((addr, int(port)), timeout=5) as c:
            record(c.makefile().readline().strip())
    except OSError:
        record("refused")
    sys.exit(0)
while not os.path.exists("gate"):
    time.sleep(0.01)
# The agent's interface (the harness's eth9) is not on the test's host.
os.environ["GLOO_SOCKET_IFNAME"] = "lo"
import torch, torch.distributed as dist
if sys.argv[1] == "env":
    dist.init_process_group("gloo")
else:
    dist.init_process_group("gloo", init_method="tcp://%s:%s" % (addr, port), rank=int(rank), world_size=int(os.environ["WORLD_SIZE"]))
x = torch.ones(1)
dist.all_reduce(x)
dist.destroy_process_group()
record("%d %s %d" % (os.getpgid(0), os.environ["TORCHELASTIC_USE_AGENT_STORE"], x.item()))
`

// storeJob is a one-generation job of storeScript in mode, with torch
// preloaded.
func (h *warmHarness) storeJob(mode string) *rdzvv1.Assignment {
	require.NoError(h.t, os.WriteFile(filepath.Join(h.workdir, "store.py"), []byte(storeScript), 0o644))
	a := h.assign(1, 0)
	a.Spec.Command = []string{"store.py", mode}
	a.Spec.LauncherPreload = []string{"torch", "torch.distributed"}
	return a
}

// Node rank 0's standby serves the generation's TCPStore on MASTER_PORT
// from the hand-off on, before any worker rendezvouses, and the workers,
// told TORCHELASTIC_USE_AGENT_STORE=True, all use it as clients, through
// torch's env:// and tcp:// alike. Nothing of the store outlives the
// generation, whether it ends or is stopped (the store ignores SIGTERM).
func TestWarmStoreServed(t *testing.T) {
	for _, tt := range []struct {
		name, mode string
		stop       bool
	}{
		{"env:// rendezvous", "env", false},
		{"tcp:// rendezvous from MASTER_ADDR and MASTER_PORT", "tcp", false},
		{"stopped before the rendezvous", "env", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newWarmHarness(t)
			a := h.storeJob(tt.mode)
			a.NodeRank, a.Nnodes, a.MasterAddr, a.MasterPort = 0, 1, "127.0.0.1", freePort(t)
			addr := net.JoinHostPort(a.MasterAddr, fmt.Sprint(a.MasterPort))
			h.sup.Assign(a)
			h.expect("warm", 1, wRunning)
			pgid := h.sup.view.Load().cur.proc.Pid()
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err, "the store listens once the hand-off is answered, while the workers wait at the gate")
			require.NoError(t, conn.Close())
			require.Eventually(t, func() bool { return len(groupMembers(pgid)) == 4 }, waitTimeout, 10*time.Millisecond,
				"the standby's group: the standby, its store and the two workers")

			if tt.stop {
				h.sup.Stop("warm", 1, "stopped by the test")
				h.expect("warm", 1, wStopped)
			} else {
				require.NoError(t, os.WriteFile(filepath.Join(h.workdir, "gate"), nil, 0o644))
				h.expect("warm", 1, wSucceeded)
				for _, rank := range []string{"0", "1"} {
					b, err := os.ReadFile(filepath.Join(h.markers, "store-"+rank))
					require.NoError(t, err)
					var group, sum int
					var agentStore string
					_, err = fmt.Sscanf(string(b), "%d %s %d", &group, &agentStore, &sum)
					require.NoError(t, err, "rank %s recorded %q", rank, b)
					require.Equal(t, pgid, group, "rank %s is the standby's", rank)
					require.Equal(t, "True", agentStore, "rank %s is the store's client, not its host", rank)
					require.Equal(t, 2, sum, "rank %s rendezvoused with the other", rank)
				}
			}
			// Not a refused connection to the port: on a shared host another
			// process may take it as soon as it is free.
			require.Empty(t, groupMembers(pgid), "the standby's group, store included, is gone with the generation")
		})
	}
}

// The other nodes' standbys fork their workers only once node rank 0's
// store accepts connections: torch's client would retry a refused one only
// a second later. The stand-in store starts listening after the hand-off
// and numbers the connections it accepts: the standby's own comes first.
func TestWarmStoreAwaited(t *testing.T) {
	h := newWarmHarness(t)
	a := h.storeJob("probe")
	a.Spec.LauncherPreload = []string{"json"} // no torch: the workers probe, and no store is served here
	a.MasterAddr, a.MasterPort = "127.0.0.1", freePort(t)
	h.sup.Assign(a)
	h.expect("warm", 1, wRunning)
	store, err := net.Listen("tcp", net.JoinHostPort(a.MasterAddr, fmt.Sprint(a.MasterPort)))
	require.NoError(t, err)
	served := make(chan struct{})
	go func() {
		defer close(served)
		for n := 1; ; n++ {
			conn, err := store.Accept()
			if err != nil {
				return
			}
			_, _ = fmt.Fprintf(conn, "%d\n", n) // the standby's probe may have gone
			_ = conn.Close()
		}
	}()
	h.expect("warm", 1, wSucceeded)
	require.NoError(t, store.Close())
	<-served
	var seen []string
	for _, m := range h.readMarkers() {
		seen = append(seen, strings.SplitN(m, ": ", 2)[1])
	}
	require.ElementsMatch(t, []string{"2", "3"}, seen, "the workers connect after their standby did")
}

// A store that cannot listen (its port taken since the agent probed it)
// fails the generation's start, naming the port, as a torchrun whose store
// cannot listen fails; the next generation gets another port.
func TestWarmStorePortTaken(t *testing.T) {
	h := newWarmHarness(t)
	a := h.storeJob("env")
	a.NodeRank, a.Nnodes, a.MasterAddr, a.MasterPort = 0, 1, "127.0.0.1", heldPort(t)
	h.sup.Assign(a)
	st := h.expect("warm", 1, wFailed)
	require.Contains(t, st.GetMessage(), fmt.Sprintf("starting the store on port %d", a.MasterPort))
	require.Empty(t, h.readMarkers(), "no worker was started")
}

// An agent that restarts while a warm generation trains adopts it and, as
// after any start, starts the next standby (its predecessor killed its
// own): the next generation is handed to a standby kept ready, not to a
// fresh one.
func TestWarmStandbyAfterAgentRestart(t *testing.T) {
	h := newWarmHarness(t, withRestartGrace(time.Minute))
	hold := filepath.Join(h.workdir, "hold")
	require.NoError(t, os.WriteFile(hold, nil, 0o644))
	assign := func(gen uint64) *rdzvv1.Assignment {
		a := h.assign(gen, 0)
		a.Spec.Env["HOLD"] = hold
		return a
	}
	h.sup.Assign(assign(1))
	h.expect("warm", 1, wRunning)
	h.readyStandby()
	handOver(t, h.supHarness, true)

	next := &warmHarness{supHarness: h.successor(), markers: h.markers}
	require.True(t, next.sup.Running("warm"), "generation 1 is adopted")
	sb := next.readyStandby()
	// Its shim's directory is its own, not the adopted generation's (the
	// previous agent's standby for it had the same number).
	shims, err := os.ReadDir(filepath.Join(h.stateDir, "workers"))
	require.NoError(t, err)
	require.Len(t, shims, 2, "shim directories: the adopted generation's and the new standby's")

	next.sup.Assign(assign(2))
	next.expect("warm", 1, wStopped)
	next.expect("warm", 2, wRunning)
	launcher := next.sup.view.Load().cur.proc.Pid()
	require.Equal(t, sb.proc.Pid(), launcher, "generation 2 is handed to the standby started after the adoption")
	require.NoError(t, os.Remove(hold))
	next.expect("warm", 2, wSucceeded)
	require.ElementsMatch(t, []string{
		"2: 65534 0 4 True 1 --lr 1", "3: 65534 1 4 True 1 --lr 1",
		"2: 65534 0 4 True 2 --lr 1", "3: 65534 1 4 True 2 --lr 1",
	}, next.readMarkers())
}

// procStatField is field i, counted from 0 after the parenthesised
// command (0 the state, 1 the ppid, 16 the nice value), of
// /proc/<pid>/stat.
func procStatField(t *testing.T, pid, i int) int {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	s := string(stat)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	v, err := strconv.Atoi(fields[i])
	require.NoError(t, err)
	return v
}
