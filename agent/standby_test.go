package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const spareKeep = 90 * time.Second

// spare makes h's supervisor a spare's on a fake clock; its assignments
// are of one run of the job.
func (h *warmHarness) spare() *clockwork.FakeClock {
	clock := clockwork.NewFakeClock()
	h.setClock(clock)
	return clock
}

// spareAssign is assign with the job's creation time, as the controller
// sends it.
func (h *warmHarness) spareAssign(gen uint64, code int) *rdzvv1.Assignment {
	a := h.assign(gen, code)
	a.JobCreatedAt = timestamppb.New(time.Unix(1700000000, 0))
	return a
}

// hanging is a warm job other than the spare's whose workers run until
// stopped.
func (h *warmHarness) hanging(name string) *rdzvv1.Assignment {
	require.NoError(h.t, os.WriteFile(filepath.Join(h.workdir, "hang.py"), []byte("import time\ntime.sleep(300)\n"), 0o644))
	a := h.spareAssign(1, 0)
	a.Spec.Name, a.Spec.Command = name, []string{"hang.py"}
	return a
}

func prepareFor(a *rdzvv1.Assignment) *rdzvv1.PrepareStandby {
	return &rdzvv1.PrepareStandby{Spec: a.GetSpec(), JobCreatedAt: a.GetJobCreatedAt(), KeepFor: durationpb.New(spareKeep)}
}

func (h *warmHarness) currentStandby() *standby {
	return h.sup.view.Load().standby
}

// An idle spare told to prepare a standby starts one that runs nothing of
// the job's; told again, it keeps that one; the job's next assignment is
// handed to it.
func TestSpareStandbyTaken(t *testing.T) {
	h := newWarmHarness(t)
	h.spare()
	a := h.spareAssign(1, 0)
	require.Empty(t, h.sup.ReadyStandby(), "no standby")
	h.sup.PrepareStandby(prepareFor(a))
	h.sync()
	sb := h.readyStandby()
	require.Equal(t, a.GetSpec().GetName(), h.sup.ReadyStandby(), "listening, the spare's standby is ready for the controller")
	require.Empty(t, h.readMarkers(), "the standby ran none of the job's code")
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", sb.proc.Pid()))
	require.NoError(t, err)
	require.Regexp(t, fmt.Sprintf(`(?m)^Uid:\s+%d\s`, nobodyID), string(status), "the standby runs as the job's user")

	h.sup.PrepareStandby(prepareFor(a))
	h.sync()
	require.Same(t, sb, h.currentStandby(), "told again, the spare keeps its standby")

	h.sup.Assign(a)
	h.expect("warm", 1, wRunning)
	pid := h.sup.view.Load().cur.proc.Pid()
	require.Equal(t, sb.proc.Pid(), pid, "the generation is handed to the prepared standby")
	require.Empty(t, h.sup.ReadyStandby(), "a node running the job keeps no idle standby")
	h.expect("warm", 1, wSucceeded)
	require.ElementsMatch(t, []string{"2: 65534 0 4 True 1 --lr 1", "3: 65534 1 4 True 1 --lr 1"}, h.readMarkers())
}

// A spare's standby is dropped when the controller says to keep none, when
// the node is assigned another job, when another job's standby is asked
// for, and when it is not told again in time; a request that is not valid,
// or comes while workers run, changes nothing.
func TestSpareStandbyDropped(t *testing.T) {
	for _, tt := range []struct {
		name string
		// release does it; it returns whether a standby is left and
		// whose.
		release func(h *warmHarness, clock *clockwork.FakeClock) string
	}{
		{"told to keep none", func(h *warmHarness, _ *clockwork.FakeClock) string {
			h.sup.PrepareStandby(&rdzvv1.PrepareStandby{})
			h.sync()
			return ""
		}},
		{"assigned another job", func(h *warmHarness, _ *clockwork.FakeClock) string {
			h.sup.Assign(h.hanging("other"))
			h.expect("other", 1, wRunning)
			// RUNNING is reported before the assignment's own standby
			// is kept: wait for the whole command.
			h.sync()
			return "other" // its own, for its next generation
		}},
		{"asked for another job's", func(h *warmHarness, _ *clockwork.FakeClock) string {
			b := h.spareAssign(1, 0)
			b.Spec.Name = "warm-b"
			h.sup.PrepareStandby(prepareFor(b))
			h.sync()
			return "warm-b"
		}},
		{"memory runs low", func(h *warmHarness, _ *clockwork.FakeClock) string {
			// Read on the run goroutine, after the command is sent.
			h.sup.meminfo = func() ([]byte, error) { return []byte("MemTotal: 8000000 kB\nMemAvailable: 1024 kB\n"), nil }
			h.sup.PrepareStandby(prepareFor(h.spareAssign(1, 0)))
			h.sync()
			return ""
		}},
		{"not told again in time", func(h *warmHarness, clock *clockwork.FakeClock) string {
			clock.Advance(spareKeep)
			require.Eventually(h.t, func() bool { return h.currentStandby() == nil }, waitTimeout, 10*time.Millisecond)
			return ""
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newWarmHarness(t)
			clock := h.spare()
			h.sup.PrepareStandby(prepareFor(h.spareAssign(1, 0)))
			h.sync()
			sb := h.readyStandby()
			pid := sb.proc.Pid()
			left := tt.release(h, clock)
			<-sb.exited
			require.Empty(t, groupMembers(pid), "nothing of the dropped standby is left")
			if left == "" {
				require.Nil(t, h.currentStandby())
			} else {
				sb := h.currentStandby()
				require.NotNil(t, sb, "a standby is left")
				require.Equal(t, left, sb.job)
			}
			require.Empty(t, h.readMarkers(), "no code of the job's ran")
		})
	}
}

func TestSpareStandbyIgnored(t *testing.T) {
	h := newWarmHarness(t)
	h.spare()
	valid := prepareFor(h.spareAssign(1, 0))
	torchrun := prepareFor(h.assignment("plain", 1))
	torchrun.JobCreatedAt = valid.GetJobCreatedAt()
	for _, tt := range []struct {
		name string
		p    *rdzvv1.PrepareStandby
	}{
		{"no keep_for", &rdzvv1.PrepareStandby{Spec: valid.GetSpec(), JobCreatedAt: valid.GetJobCreatedAt()}},
		{"keep_for too long", &rdzvv1.PrepareStandby{Spec: valid.GetSpec(), JobCreatedAt: valid.GetJobCreatedAt(), KeepFor: durationpb.New(time.Hour)}},
		{"no job_created_at", &rdzvv1.PrepareStandby{Spec: valid.GetSpec(), KeepFor: valid.GetKeepFor()}},
		{"not a warm job", torchrun},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.Error(t, validPrepare(tt.p))
			h.sup.PrepareStandby(tt.p)
			h.sync()
			require.Nil(t, h.currentStandby())
		})
	}
	require.NoError(t, validPrepare(valid))

	// A node running workers is no spare: its standby stays its job's.
	h.sup.Assign(h.hanging("other"))
	h.expect("other", 1, wRunning)
	h.sup.PrepareStandby(valid)
	h.sync()
	require.Equal(t, "other", h.currentStandby().job)
}

// The memory policy: MemAvailable read from /proc/meminfo, in bytes, held
// against the floor; a floor of 0, or a MemAvailable the agent cannot
// read, never counts as pressure.
func TestStandbyMemoryPolicy(t *testing.T) {
	const gib = 1 << 30
	for _, tt := range []struct {
		name    string
		meminfo string
		floor   uint64
		avail   uint64
		found   bool
		ok      bool
	}{
		{"above the floor", "MemTotal: 16000000 kB\nMemFree: 100 kB\nMemAvailable: 8388608 kB\n", 4 * gib, 8 * gib, true, true},
		{"at the floor", "MemAvailable: 4194304 kB\n", 4 * gib, 4 * gib, true, true},
		{"below the floor", "MemAvailable: 4194303 kB\n", 4 * gib, 4*gib - 1024, true, false},
		{"no floor", "MemAvailable: 1 kB\n", 0, 1024, true, true},
		{"no MemAvailable line", "MemTotal: 1 kB\nMemFree: 1 kB\n", 4 * gib, 0, false, true},
		{"malformed", "MemAvailable: lots\n", 4 * gib, 0, false, true},
		{"another unit", "MemAvailable: 4 MB\n", 4 * gib, 0, false, true},
		{"overflows", "MemAvailable: 18446744073709551615 kB\n", 4 * gib, 0, false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			avail, found := memAvailable([]byte(tt.meminfo))
			require.Equal(t, tt.avail, avail)
			require.Equal(t, tt.found, found)
			require.Equal(t, tt.ok, standbyMemoryOK(avail, found, tt.floor))
		})
	}
}
