package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/types/known/durationpb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// fakeProc is a launcher the test ends: Wait returns once end or Kill was
// called, with the first one's exit.
type fakeProc struct {
	pid    int
	exited chan struct{}
	once   sync.Once
	exit   Exit

	mu    sync.Mutex
	kills []time.Duration
}

func (p *fakeProc) Pid() int                   { return p.pid }
func (p *fakeProc) Wait() Exit                 { <-p.exited; return p.exit }
func (p *fakeProc) Reason() string             { return "" }
func (p *fakeProc) Detach(time.Duration) error { return nil }

// end makes the launcher exit with e, unless it already has.
func (p *fakeProc) end(e Exit) {
	p.once.Do(func() {
		p.exit = e
		close(p.exited)
	})
}

// Kill records grace; a launcher still running dies of SIGTERM (grace >
// 0) or SIGKILL.
func (p *fakeProc) Kill(grace time.Duration) error {
	p.mu.Lock()
	p.kills = append(p.kills, grace)
	p.mu.Unlock()
	sig := "SIGKILL"
	if grace > 0 {
		sig = "SIGTERM"
	}
	p.end(Exit{Code: -1, Signal: sig})
	return nil
}

// firstKill is the grace of the first Kill, which ended the launcher
// unless it had exited by itself.
func (p *fakeProc) firstKill(t *testing.T) time.Duration {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.NotEmpty(t, p.kills, "the launcher was killed")
	return p.kills[0]
}

// fakeSpawner hands every launcher it starts to the test.
type fakeSpawner struct {
	started chan *fakeProc
}

func (s *fakeSpawner) Spawn(ProcessSpec) (Process, error) {
	p := &fakeProc{pid: 1000 + len(s.started), exited: make(chan struct{})}
	s.started <- p
	return p, nil
}

func (s *fakeSpawner) HandsOver() bool           { return false }
func (s *fakeSpawner) Adopt() ([]Adopted, error) { return nil, nil }

// ownerHarness is a Supervisor on a fake clock whose launchers are
// fakeProcs.
type ownerHarness struct {
	*supHarness
	clock   *clockwork.FakeClock
	spawner *fakeSpawner
}

func newOwnerHarness(t *testing.T) *ownerHarness {
	t.Helper()
	// Whatever the supervisor starts has ended once it has stopped.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	h := &ownerHarness{supHarness: &supHarness{t: t, workdir: t.TempDir()}, clock: clockwork.NewFakeClock(),
		spawner: &fakeSpawner{started: make(chan *fakeProc, 8)}}
	h.torchrun = filepath.Join(t.TempDir(), "torchrun")
	require.NoError(t, os.WriteFile(h.torchrun, []byte(fakeTorchrun), 0o755))
	cfg := DefaultConfig()
	cfg.StateDir = t.TempDir()
	cfg.MemoryCheckpointDir = t.TempDir()
	cfg.StopGrace.Duration = 2 * time.Second
	runAsSelf(&cfg)
	h.cfg = cfg
	h.sup = NewSupervisor(cfg, "node-a", "eth9", "127.0.0.1:7071", h.spawner, zaptest.NewLogger(t))
	h.sup.torch = sharedTorch
	h.sup.clock = h.clock
	h.start()
	return h
}

// launched is the launcher the supervisor started last.
func (h *ownerHarness) launched() *fakeProc {
	h.t.Helper()
	select {
	case p := <-h.spawner.started:
		return p
	case <-time.After(waitTimeout):
		require.FailNow(h.t, "no launcher started")
		return nil
	}
}

// The run goroutine alone applies commands and handles the workers' exits,
// in order: each case's steps are followed by exactly the updates it
// lists, on the supervisor's clock.
func TestSupervisorOwner(t *testing.T) {
	const job = "train"
	type update struct {
		gen   uint64
		state rdzvv1.WorkerState
		msg   string
	}
	for _, tc := range []struct {
		name string
		// steps drives h and returns the launcher whose kill grace it
		// expects to be wantGrace (nil: none).
		steps     func(h *ownerHarness) *fakeProc
		wantGrace time.Duration
		want      []update
		// busy is whether workers run at the end.
		busy bool
	}{
		{
			name: "workers that exit by themselves are recorded on the run goroutine",
			steps: func(h *ownerHarness) *fakeProc {
				h.sup.Assign(h.assignment(job, 1, "ok"))
				h.launched().end(Exit{Code: 0})
				return nil
			},
			want: []update{{1, wRunning, ""}, {1, wSucceeded, ""}},
		},
		{
			name: "a stop order kills with the configured grace and waits for the exit",
			steps: func(h *ownerHarness) *fakeProc {
				h.sup.Assign(h.assignment(job, 1, "hang"))
				p := h.launched()
				h.sup.Stop(job, 1, "stopped by the controller")
				return p
			},
			wantGrace: 2 * time.Second,
			want:      []update{{1, wRunning, ""}, {1, wStopped, "stopped by the controller"}},
		},
		{
			name: "a stop order's shorter grace is kept",
			steps: func(h *ownerHarness) *fakeProc {
				h.sup.Assign(h.assignment(job, 1, "hang"))
				p := h.launched()
				h.sup.Ordered(&rdzvv1.StopWorkers{Job: job, Generation: 1, Reason: "job ended", Grace: durationpb.New(time.Second), JobEnded: true})
				return p
			},
			wantGrace: time.Second,
			want:      []update{{1, wRunning, ""}, {1, wStopped, "job ended"}},
		},
		{
			name: "the next generation replaces the running one",
			steps: func(h *ownerHarness) *fakeProc {
				h.sup.Assign(h.assignment(job, 1, "hang"))
				p := h.launched()
				h.sup.Assign(h.assignment(job, 2, "hang"))
				h.launched()
				return p
			},
			wantGrace: 2 * time.Second,
			want:      []update{{1, wRunning, ""}, {1, wStopped, "replaced by generation 2 of job train"}, {2, wRunning, ""}},
			busy:      true,
		},
		{
			name: "a stale assignment is rejected",
			steps: func(h *ownerHarness) *fakeProc {
				h.sup.Assign(h.assignment(job, 2, "hang"))
				h.launched()
				h.sup.Assign(h.assignment(job, 1, "hang"))
				return nil
			},
			want: []update{{2, wRunning, ""}},
			busy: true,
		},
		{
			name: "a stop fences a generation never started here",
			steps: func(h *ownerHarness) *fakeProc {
				h.sup.Stop(job, 3, "gone")
				h.sup.Assign(h.assignment(job, 3, "hang"))
				return nil
			},
			want: []update{{3, wStopped, "not running on this node: gone"}},
		},
		{
			name: "a fence kills at once, whatever runs",
			steps: func(h *ownerHarness) *fakeProc {
				h.sup.Assign(h.assignment(job, 1, "hang"))
				p := h.launched()
				fenced := make(chan struct{})
				h.sup.Fence("controller unreachable", func() { close(fenced) })
				<-fenced
				return p
			},
			wantGrace: 0,
			want:      []update{{1, wRunning, ""}, {1, wStopped, "controller unreachable"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newOwnerHarness(t)
			killed := tc.steps(h)
			var got []update
			for range tc.want {
				st := h.next()
				require.Equal(t, job, st.GetJob(), "update %v", st)
				got = append(got, update{st.GetGeneration(), st.GetState(), st.GetMessage()})
				if st.GetState() != wRunning && !strings.HasPrefix(st.GetMessage(), "not running") {
					require.True(t, st.GetExitedAt().AsTime().Equal(h.clock.Now()), "the exit is timed on the supervisor's clock")
				}
			}
			require.Equal(t, tc.want, got)
			// Nothing else was reported.
			h.sync()
			if killed != nil {
				require.Equal(t, tc.wantGrace, killed.firstKill(t))
			}
			require.Equal(t, tc.busy, h.sup.Busy())
			require.Equal(t, tc.busy, h.sup.Running(job))
		})
	}
}

// The run goroutine handles a generation's exit with the standby kept for
// the next: a success drops it before the exit is reported, a failure
// leaves it for standbyLinger on the supervisor's clock, unless a later
// generation is assigned meanwhile.
func TestSupervisorOwnerStandby(t *testing.T) {
	const job = "train"
	for _, tc := range []struct {
		name string
		exit Exit
		// next assigns a later generation before the linger is over.
		next bool
		// kept is whether the standby is kept at the exit's report, and
		// after standbyLinger.
		keptAtExit, keptAfter bool
	}{
		{name: "a success drops the standby at once", exit: Exit{Code: 0}},
		{name: "a failure keeps it for standbyLinger", exit: Exit{Code: 3}, keptAtExit: true},
		{name: "the next generation keeps it", exit: Exit{Code: 3}, next: true, keptAtExit: true, keptAfter: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newOwnerHarness(t)
			ready := make(chan struct{})
			close(ready)
			sb := &standby{job: job, ready: ready, exited: make(chan struct{})}
			// Written before the Assign that has the run goroutine read it.
			h.sup.standby = sb
			h.sup.Assign(h.assignment(job, 1, "hang"))
			h.expect(job, 1, wRunning)
			h.launched().end(tc.exit)
			h.next()
			require.Equal(t, tc.keptAtExit, h.sup.view.Load().standby == sb, "the standby at the exit's report")
			if tc.next {
				h.sup.Assign(h.assignment(job, 2, "hang"))
				h.expect(job, 2, wRunning)
				h.launched()
			}
			if tc.keptAtExit {
				ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
				defer cancel()
				require.NoError(t, h.clock.BlockUntilContext(ctx, 1), "the linger waits on the supervisor's clock")
				h.clock.Advance(standbyLinger - time.Nanosecond)
				h.sync()
				require.Same(t, sb, h.sup.view.Load().standby, "the standby lingers")
				h.clock.Advance(time.Nanosecond)
			}
			require.Eventually(t, func() bool {
				h.sync()
				return (h.sup.view.Load().standby == sb) == tc.keptAfter
			}, waitTimeout, time.Millisecond, "the standby after standbyLinger")
		})
	}
}

// Workers that exited before the agent stopped are reported as they
// ended, not as stopped by the shutdown.
func TestSupervisorOwnerExitBeforeShutdown(t *testing.T) {
	h := newOwnerHarness(t)
	h.sup.Assign(h.assignment("train", 1, "hang"))
	h.expect("train", 1, wRunning)
	w := h.sup.view.Load().cur
	h.launched().end(Exit{Code: 3})
	<-w.exited
	h.stop()
	st := h.expect("train", 1, wFailed)
	require.EqualValues(t, 3, st.GetExitCode())
	require.Empty(t, st.GetMessage())
}
