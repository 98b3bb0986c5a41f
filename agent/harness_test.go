package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/rdzv/rdzv/agent/launchertest"
	"github.com/rdzv/rdzv/agent/torchprobe"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// shimTestEnv makes the test binary act as `rdzv-agent shim`, so the
// supervisor tests run workers under real shims.
const shimTestEnv = "RDZV_TEST_AS_SHIM"

func TestMain(m *testing.M) {
	if os.Getenv(shimTestEnv) == "1" {
		os.Exit(runTestShim(os.Args[1:]))
	}
	// memberlist does not wait for its probes when it shuts down: one may
	// wait out its probe interval and then its TCP fallback (seconds) after
	// a test's member is gone, longer than goleak retries when the gossip
	// tests run alone. It ends by itself.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

func runTestShim(args []string) int {
	if len(args) != 2 || args[0] != "--dir" {
		fmt.Fprintf(os.Stderr, "test shim: want --dir DIR, got %q\n", args)
		return 2
	}
	log, err := zap.NewDevelopment()
	if err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := (Shim{Dir: args[1], Ready: os.Stdout, Log: log, Subreaper: true}).Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// testShims runs shims from the test binary, in dir. The race detector
// would hold each exiting shim for a second.
func testShims(t *testing.T, dir string) ShimSpawner {
	return ShimSpawner{Dir: dir, Command: []string{"/usr/bin/env", shimTestEnv + "=1", "GORACE=atexit_sleep_ms=0", os.Args[0]}, Log: zaptest.NewLogger(t)}
}

// waitTimeout only keeps a broken test from hanging.
const waitTimeout = 30 * time.Second

// fakeTorchrun stands in for torchrun. It records how it was launched in
// its working directory, in a file named <job>-<generation>, then acts out
// the job's command (after the ten rendezvous arguments and "train.py"):
//
//	ok        print a greeting and exit 0
//	exit CODE exit CODE
//	hang      sleep until killed
//	py ARGS   run /usr/bin/python3 ARGS in its place (see needPython)
var fakeTorchrun = `#!/bin/sh
rec="$PWD/$RDZV_JOB-$RDZV_GENERATION"
` + launchertest.Preamble("[A-Za-z_][A-Za-z0-9_]*") + `shift 11
echo "hello from $RDZV_NODE generation $RDZV_GENERATION"
case "$1" in
ok) exit 0 ;;
exit) exit "$2" ;;
hang) sleep 300 ;;
py) shift; exec /usr/bin/python3 "$@" ;;
*) echo "unknown mode $1" >&2; exit 99 ;;
esac
`

// sharedTorch is every test supervisor's: a real torch is asked once per
// interpreter and user for the whole run.
var sharedTorch = torchprobe.NewCache(torchprobe.Run, "")

// supHarness is a running Supervisor for node-a, whose NCCL interface is
// eth9, launching fakeTorchrun.
type supHarness struct {
	t        *testing.T
	sup      *Supervisor
	stateDir string
	workdir  string
	torchrun string
	spawner  ShimSpawner
	cfg      Config
	// stop ends the supervisor as an agent shutdown would.
	stop func()
}

// newSupervisor runs a supervisor whose workers run under real shims; its
// restart_grace is 0 (workers stop with it) unless cfg edits say otherwise.
func newSupervisor(t *testing.T, edits ...func(*Config)) *supHarness {
	t.Helper()
	h := &supHarness{t: t, workdir: t.TempDir()}
	h.torchrun = filepath.Join(t.TempDir(), "torchrun")
	require.NoError(t, os.WriteFile(h.torchrun, []byte(fakeTorchrun), 0o755))

	cfg := DefaultConfig()
	cfg.Controller = "127.0.0.1:7070"
	cfg.StateDir = t.TempDir()
	h.stateDir = cfg.StateDir
	// Not the node's /dev/shm: an agent's start frees what it finds there.
	cfg.MemoryCheckpointDir = t.TempDir()
	cfg.StopGrace.Duration = 2 * time.Second
	cfg.RestartGrace.Duration = 0
	runAsSelf(&cfg)
	for _, edit := range edits {
		edit(&cfg)
	}
	h.cfg = cfg
	h.spawner = testShims(t, filepath.Join(cfg.StateDir, "workers"))
	h.sup = NewSupervisor(cfg, "node-a", "eth9", "127.0.0.1:7071", h.spawner, zaptest.NewLogger(t))
	h.sup.torch = sharedTorch
	// Tests wait on the scanner; one may set it again before its first
	// Assign, which orders the write before the scanner reads it.
	h.sup.scanEvery = 20 * time.Millisecond
	h.start()
	return h
}

// successor is the next agent's supervisor on the same node, having adopted
// what h left running.
func (h *supHarness) successor() *supHarness {
	h.t.Helper()
	next := *h
	next.sup = NewSupervisor(h.cfg, "node-a", "eth9", "127.0.0.1:7071", h.spawner, zaptest.NewLogger(h.t))
	next.sup.scanEvery = h.sup.scanEvery
	next.sup.torch = sharedTorch
	found, err := h.spawner.Adopt()
	require.NoError(h.t, err)
	next.sup.Adopt(found)
	next.start()
	return &next
}

func (h *supHarness) start() {
	t := h.t
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.sup.Run(ctx) }()
	var once sync.Once
	h.stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(h.stop)
}

// setClock has the supervisor run on clock: Run reads it as it starts, so
// it is stopped (with nothing running yet) and started again on it.
func (h *supHarness) setClock(clock clockwork.Clock) {
	h.stop()
	h.sup.clock = clock
	h.start()
}

// assignment is rank 1 of 2 on GPUs 2 and 3, running fakeTorchrun with
// command.
func (h *supHarness) assignment(job string, gen uint64, command ...string) *rdzvv1.Assignment {
	return &rdzvv1.Assignment{
		Spec: &rdzvv1.JobSpec{
			Name: job, NodesMin: 2, NodesMax: 2, ProcsPerNode: 2,
			Command: append([]string{"train.py"}, command...), Workdir: h.workdir,
			Env: map[string]string{"JOB_VAR": "from-job"}, LauncherTorchrun: h.torchrun,
		},
		Generation: gen, NodeRank: 1, Nnodes: 2, ProcsPerNode: 2,
		MasterAddr: "10.0.0.1", MasterPort: 29500, GpuIndices: []uint32{2, 3},
	}
}

// next is the supervisor's next status update.
func (h *supHarness) next() *rdzvv1.WorkerStatus {
	h.t.Helper()
	select {
	case st := <-h.sup.Updates():
		return st
	case <-time.After(waitTimeout):
		require.FailNow(h.t, "no status update")
		return nil
	}
}

// expect reads the next update and checks it is job's generation in state.
func (h *supHarness) expect(job string, gen uint64, state rdzvv1.WorkerState) *rdzvv1.WorkerStatus {
	h.t.Helper()
	st := h.next()
	require.Equal(h.t, job, st.GetJob(), "update %v", st)
	require.Equal(h.t, gen, st.GetGeneration(), "update %v", st)
	require.Equal(h.t, state, st.GetState(), "update %v", st)
	return st
}

// sync returns once every command queued before it has been applied: a
// stop for a generation nothing runs is answered at once.
func (h *supHarness) sync() {
	h.t.Helper()
	h.sup.Stop("sync-marker", 1, "sync")
	h.expect("sync-marker", 1, rdzvv1.WorkerState_WORKER_STATE_STOPPED)
}

func (h *supHarness) recordPath(job string, gen uint64) string {
	return filepath.Join(h.workdir, fmt.Sprintf("%s-%d", job, gen))
}

// record waits for fakeTorchrun's record: RUNNING is reported as soon as
// the launcher is started, before it has written anything.
func (h *supHarness) record(job string, gen uint64) launchertest.Record {
	h.t.Helper()
	require.Eventually(h.t, func() bool {
		_, err := os.Stat(h.recordPath(job, gen))
		return err == nil
	}, waitTimeout, 10*time.Millisecond, "%s never written", h.recordPath(job, gen))
	r, err := launchertest.Read(h.recordPath(job, gen))
	require.NoError(h.t, err)
	return r
}

// requireProto compares protobuf messages (or slices of them) by content;
// reflect.DeepEqual also compares their internal state.
func requireProto(t *testing.T, want, got any, msgAndArgs ...any) {
	t.Helper()
	require.Empty(t, cmp.Diff(want, got, protocmp.Transform()), msgAndArgs...)
}

// groupMembers lists the live processes in process group pgid, read from
// /proc independently of the code under test. Zombies do not count: they
// hold nothing, and whether they are reaped depends on the init process of
// the machine running the tests.
func groupMembers(pgid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		panic(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) >= 3 && fields[0] != "Z" && fields[0] != "X" && fields[2] == strconv.Itoa(pgid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// python is the interpreter the examples are checked with; fakeTorchrun's
// py mode runs it too.
const python = "/usr/bin/python3"

// needPython skips tests of the Python helper where there is no Python.
func needPython(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(python); err != nil {
		t.Skipf("%s not found: %v", python, err)
	}
}

// runAsSelf has workers run as the test's own user, as most tests need:
// they write records into directories only that user may write.
func runAsSelf(cfg *Config) {
	cfg.RunAs = fmt.Sprintf("%d:%d", os.Geteuid(), os.Getegid())
	cfg.AllowRoot = true
}
