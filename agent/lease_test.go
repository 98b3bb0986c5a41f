package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/rdzv/rdzv/health"
)

// leasedShim runs a shim over `sleep 60` under lease (boot clock), with a
// fake clock for its checks and boot, the boot clock, set by the test.
type leasedShim struct {
	dir   string
	pid   int
	clock *clockwork.FakeClock
	boot  *atomic.Int64
	done  chan error
	conn  net.Conn
	lines *bufio.Scanner
}

func startLeasedShim(t *testing.T, lease time.Duration) *leasedShim {
	t.Helper()
	return startShimWith(t, shimStart{lease: lease})
}

// shimStart is how a test starts a leased shim.
type shimStart struct {
	lease time.Duration
	// boot is the boot clock at its start.
	boot time.Duration
	// stdin is the shim's stdin, its spawning agent's end.
	stdin io.Reader
	// unattached: no agent attaches to it.
	unattached bool
}

func startShimWith(t *testing.T, start shimStart) *leasedShim {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, writeJSON(filepath.Join(dir, shimSpecFile), shimSpec{
		Path: "/bin/sleep", Args: []string{"60"}, Dir: dir, LogPath: filepath.Join(dir, "job.log"), OrphanTimeout: time.Hour, Lease: int64(start.lease),
	}))
	readyR, readyW, err := os.Pipe()
	require.NoError(t, err)
	defer readyR.Close()
	s := &leasedShim{dir: dir, clock: clockwork.NewFakeClock(), boot: &atomic.Int64{}, done: make(chan error, 1)}
	s.boot.Store(int64(start.boot))
	go func() {
		s.done <- Shim{Dir: dir, Ready: readyW, Spawner: start.stdin, Log: zaptest.NewLogger(t), Clock: s.clock,
			Boot: func() time.Duration { return time.Duration(s.boot.Load()) }}.Run(context.Background())
	}()
	line, err := bufio.NewReader(readyR).ReadString('\n')
	require.NoError(t, err)
	_, err = fmt.Sscanf(line, shimReady+" %d", &s.pid)
	require.NoError(t, err, "ready line %q", line)
	if start.unattached {
		return s
	}
	require.NoError(t, viaDirFD(dir, shimSocket, func(path string) (err error) {
		s.conn, err = net.Dial("unix", path)
		return err
	}))
	t.Cleanup(func() { s.conn.Close() })
	s.lines = bufio.NewScanner(s.conn)
	s.request(t, shimRequest{Op: "attach"})
	return s
}

// request sends req and waits for the shim's answer.
func (s *leasedShim) request(t *testing.T, req shimRequest) {
	t.Helper()
	b, _ := json.Marshal(req)
	_, err := s.conn.Write(append(b, '\n'))
	require.NoError(t, err)
	require.True(t, s.lines.Scan(), "the shim answers %+v", req)
}

// check runs the shim's next lease check.
func (s *leasedShim) check(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	require.NoError(t, s.clock.BlockUntilContext(ctx, 1))
	s.clock.Advance(health.LeaseCheckEvery)
}

// draining waits for the shim to wait out health.LeaseDrain, for the
// renewals on their way, before it fences: its lease ticker and the
// drain's timer wait on the clock.
func (s *leasedShim) draining(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	require.NoError(t, s.clock.BlockUntilContext(ctx, 2))
}

// fenced lets the shim's drain run out and waits for it to end with the
// lease's reason.
func (s *leasedShim) fenced(t *testing.T) {
	t.Helper()
	s.draining(t)
	s.clock.Advance(health.LeaseDrain)
	select {
	case err := <-s.done:
		require.NoError(t, err)
	case <-time.After(waitTimeout):
		t.Fatal("the shim did not fence its workers")
	}
	require.Empty(t, groupMembers(s.pid))
	var st shimStatus
	require.NoError(t, readJSON(filepath.Join(s.dir, shimExitFile), &st))
	require.Contains(t, st.Reason, "lease lapsed")
	require.Equal(t, "SIGKILL", st.Exit.Signal)
}

// The shim holds the workers to their lease on its own, whatever its agent
// does: renewed, they run on; lapsed, they are killed at the next check.
func TestShimKillsWorkersOnceTheLeaseLapses(t *testing.T) {
	s := startLeasedShim(t, 10*time.Second)
	s.boot.Store(int64(9 * time.Second))
	s.check(t)
	require.NotEmpty(t, groupMembers(s.pid), "within the first lease")

	s.request(t, shimRequest{Op: "lease", Lease: int64(20 * time.Second)})
	s.boot.Store(int64(15 * time.Second))
	s.check(t)
	require.NotEmpty(t, groupMembers(s.pid), "renewed")

	s.boot.Store(int64(20 * time.Second))
	s.check(t)
	s.fenced(t)
}

// A shim that was stopped with its agent (a frozen cgroup) may find a
// renewal waiting when it runs again: one sent after the lease lapsed (the
// agent ran again first), or of unknown age, does not count, and the
// workers die before anything is served.
func TestShimRefusesARenewalSentAfterTheLapse(t *testing.T) {
	tests := []struct {
		name string
		sent time.Duration
	}{
		{"age unknown", 0},
		{"sent as it lapsed", 10 * time.Second},
		{"sent after", 10500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startLeasedShim(t, 10*time.Second)
			s.boot.Store(int64(11 * time.Second))
			b, _ := json.Marshal(shimRequest{Op: "lease", Lease: int64(time.Minute), Sent: int64(tt.sent)})
			_, err := s.conn.Write(append(b, '\n'))
			require.NoError(t, err)
			s.fenced(t)
		})
	}
}

// A shim that ran late (a loaded node) takes a renewal sent before its
// lease lapsed, as it would have in time: read before its next check, or
// while it drains its socket after the check found the lease lapsed.
func TestShimTakesALateRenewalSentInTime(t *testing.T) {
	renewal := shimRequest{Op: "lease", Lease: int64(time.Minute), Sent: int64(9 * time.Second)}
	tests := []struct {
		name string
		read func(t *testing.T, s *leasedShim)
	}{
		{"read before the check", func(t *testing.T, s *leasedShim) {
			s.request(t, renewal)
			s.check(t)
		}},
		{"read while draining", func(t *testing.T, s *leasedShim) {
			s.check(t)
			s.draining(t)
			s.request(t, renewal)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startLeasedShim(t, 10*time.Second)
			s.boot.Store(int64(11 * time.Second))
			tt.read(t, s)
			s.request(t, shimRequest{Op: "attach"})
			require.NotEmpty(t, groupMembers(s.pid), "renewed")
			s.boot.Store(int64(time.Minute))
			s.check(t)
			s.fenced(t)
		})
	}
}

// Handed over for a restart the controller was told of, the workers' lease
// runs to the end of the hold; a hold without a lease grants none.
func TestShimHoldExtendsTheLease(t *testing.T) {
	s := startLeasedShim(t, 10*time.Second)
	s.request(t, shimRequest{Op: "hold", Hold: time.Minute, Lease: int64(70 * time.Second)})
	s.request(t, shimRequest{Op: "hold", Hold: time.Minute})
	s.boot.Store(int64(30 * time.Second))
	s.check(t)
	require.NotEmpty(t, groupMembers(s.pid), "held")
	s.boot.Store(int64(70 * time.Second))
	s.check(t)
	s.fenced(t)
}

// The next agent's first grant replaces the lease of a hold, however much
// shorter: the controller's bound goes by its heartbeats again.
func TestShimLeaseAfterAHoldIsTheNextAgents(t *testing.T) {
	s := startLeasedShim(t, 10*time.Second)
	s.request(t, shimRequest{Op: "hold", Hold: time.Minute, Lease: int64(70 * time.Second)})
	s.request(t, shimRequest{Op: "lease", Lease: int64(12 * time.Second)})
	s.request(t, shimRequest{Op: "lease", Lease: int64(11 * time.Second)})
	s.boot.Store(int64(11 * time.Second))
	s.check(t)
	require.NotEmpty(t, groupMembers(s.pid), "the latest deadline granted counts")
	s.boot.Store(int64(12 * time.Second))
	s.check(t)
	s.fenced(t)
}

// A shim slow to start (a loaded node) finds the lease it was started with
// lapsed: the renewals its agent wrote to its stdin meanwhile count if they
// were sent before the lapse, and an older agent's, of unknown age, if
// read before it.
func TestShimTakesRenewalsThroughStdinWhileStarting(t *testing.T) {
	tests := []struct {
		name    string
		line    string // renews to 30 s
		boot    time.Duration
		renewed bool
	}{
		{"sent in time", fmt.Sprintf("%d %d", 30*time.Second, 9*time.Second), 20 * time.Second, true},
		{"sent after the lapse", fmt.Sprintf("%d %d", 30*time.Second, 15*time.Second), 20 * time.Second, false},
		{"an older agent's, read in time", fmt.Sprintf("%d", 30*time.Second), 5 * time.Second, true},
		{"an older agent's, read after the lapse", fmt.Sprintf("%d", 30*time.Second), 20 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, w := io.Pipe()
			t.Cleanup(func() { w.Close() })
			go func() { _, _ = fmt.Fprintln(w, tt.line) }()
			s := startShimWith(t, shimStart{lease: 10 * time.Second, boot: tt.boot, stdin: r, unattached: !tt.renewed})
			if tt.renewed {
				s.check(t)
				s.boot.Store(int64(25 * time.Second)) // past the first lease
				s.check(t)
				require.NotEmpty(t, groupMembers(s.pid), "renewed through stdin")
				s.boot.Store(int64(30 * time.Second))
				s.check(t)
			}
			s.fenced(t)
		})
	}
}

func TestParseRenewal(t *testing.T) {
	tests := []struct {
		line string
		want renewal
		ok   bool
	}{
		{line: "30000000000 9000000000", want: renewal{lease: 30e9, sent: 9e9}, ok: true},
		{line: " 30 9 ", want: renewal{lease: 30, sent: 9}, ok: true},
		{line: "30", want: renewal{lease: 30}, ok: true},
		{line: ""},
		{line: "30 9 1"},
		{line: "-30 9"},
		{line: "30 -9"},
		{line: "30s"},
		{line: "LEASE 30"},
		{line: "99999999999999999999"},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			got, ok := parseRenewal(tt.line)
			require.Equal(t, tt.ok, ok)
			require.Equal(t, tt.want, got)
		})
	}
}
