package netns

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	// The python3 first on PATH may lack torch; Debian's has it.
	python   = "/usr/bin/python3"
	torchrun = "/usr/bin/torchrun"
)

// fetch GETs url from h, giving up on a silent peer after a few seconds.
func fetch(h *Host, url string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, _, err := h.Run(ctx, nil, python, "-c",
		"import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())", url)
	return out, err
}

func TestCluster(t *testing.T) {
	c := NewCluster(t, 2, "")
	h0, h1 := c.Host(0), c.Host(1)

	t.Run("identity", func(t *testing.T) {
		tests := []struct {
			name string
			argv []string
			want string
		}{
			{"hostname", []string{"hostname"}, "h1"},
			{"hostname file", []string{"cat", "/etc/hostname"}, "h1"},
			{"own name resolves", []string{"getent", "hosts", "h1"}, "10.77.0.11 h1"},
			{"peer name resolves", []string{"getent", "hosts", "h0"}, "10.77.0.10 h0"},
			{"only its own interfaces", []string{"ls", "/sys/class/net"}, "eth0 lo"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				out, _, err := h1.Run(t.Context(), nil, tt.argv...)
				require.NoError(t, err)
				require.Equal(t, tt.want, strings.Join(strings.Fields(out), " "))
			})
		}
	})

	root := t.TempDir()
	const token = "served by h0"
	require.NoError(t, os.WriteFile(filepath.Join(root, "token"), []byte(token), 0o644))
	h0.Start(t, "http", nil, python, "-m", "http.server", "--bind", h0.IP, "--directory", root, "8000")
	url := fmt.Sprintf("http://%s:8000/token", h0.IP)
	reachable := func() bool {
		body, err := fetch(h1, url)
		return err == nil && body == token
	}

	t.Run("tcp from h1 to h0", func(t *testing.T) {
		require.Eventually(t, reachable, 20*time.Second, 200*time.Millisecond, "h1 never got %s", url)
	})

	t.Run("cut and restore link", func(t *testing.T) {
		require.Eventually(t, reachable, 20*time.Second, 200*time.Millisecond, "h1 never got %s", url)
		require.NoError(t, c.CutLink(1))
		t.Cleanup(func() { assert.NoError(t, c.RestoreLink(1)) })

		_, err := fetch(h1, url)
		require.Error(t, err, "h1 reached h0 with its link cut")

		require.NoError(t, c.RestoreLink(1))
		require.Eventually(t, reachable, 20*time.Second, 200*time.Millisecond, "h1 did not reach h0 again after the link came back")
	})

	t.Run("torchrun gloo all_reduce across hosts", func(t *testing.T) {
		if _, err := os.Stat(torchrun); err != nil {
			SkipOrFail(t, "%s is missing (apt-get install python3-torch)", torchrun)
		}
		script, err := filepath.Abs("testdata/allreduce.py")
		require.NoError(t, err)
		logDir := t.TempDir()
		env := []string{"GLOO_SOCKET_IFNAME=eth0", "OMP_NUM_THREADS=1"}

		start := time.Now()
		var procs []*Proc
		for i := range 2 {
			h := c.Host(i)
			procs = append(procs, h.Start(t, "torchrun", env, torchrun,
				"--nnodes", "2", "--node_rank", strconv.Itoa(i), "--nproc_per_node", "1",
				"--master_addr", h0.IP, "--master_port", "29500",
				// Debian's torch 1.13 torchrun crashes on Python 3.11 unless
				// both are 1 or 2.
				"--redirects", "2", "--tee", "2", "--log_dir", filepath.Join(logDir, h.Name),
				// torchrun notices its workers have exited only when it next
				// polls them, by default every 5s.
				"--monitor_interval", "1",
				script))
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		for i, p := range procs {
			select {
			case <-p.Exited():
			case <-ctx.Done():
				t.Fatalf("torchrun on %s still running after 2m", p.Host.Name)
			}
			require.NoError(t, p.Wait(), "torchrun on %s", p.Host.Name)
			log, err := os.ReadFile(p.LogPath())
			require.NoError(t, err)
			require.Contains(t, string(log), fmt.Sprintf("ALLREDUCE rank=%d world_size=2 host=h%d sum=3", i, i))
		}
		t.Logf("two-node torchrun + gloo all_reduce took %s", time.Since(start).Round(time.Millisecond))
	})
}

func TestCleanupRemovesEverything(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "escapee.pid")
	var (
		c        *Cluster
		stubborn *Proc
	)
	require.True(t, t.Run("cluster", func(t *testing.T) {
		c = NewCluster(t, 2, "")
		// Ignores SIGTERM, so stopping it takes SIGKILL.
		stubborn = c.Host(0).Start(t, "stubborn", nil, "sh", "-c", "trap '' TERM; echo ready; sleep 1000")
		// Leaves the process group, so only the sweep of the namespace can
		// find it.
		c.Host(1).Start(t, "escapee", nil, "sh", "-c",
			`setsid sh -c 'echo $$ > "$1"; exec sleep 1000' sh "$1" & wait`, "sh", pidFile)
		require.Eventually(t, func() bool {
			log, _ := os.ReadFile(stubborn.LogPath())
			pid, _ := os.ReadFile(pidFile)
			return bytes.Contains(log, []byte("ready")) && len(bytes.TrimSpace(pid)) > 0
		}, 10*time.Second, 50*time.Millisecond)
	}))

	select {
	case <-stubborn.Exited():
	default:
		t.Fatal("stubborn process still running after cleanup")
	}
	var exitErr *exec.ExitError
	require.ErrorAs(t, stubborn.Wait(), &exitErr)
	require.Equal(t, syscall.SIGKILL, exitErr.Sys().(syscall.WaitStatus).Signal())

	b, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	escapee, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	require.NoError(t, err)
	require.False(t, alive(escapee), "escaped process %d survived cleanup", escapee)

	namespaces, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	for i := range 2 {
		h := c.Host(i)
		require.NotContains(t, string(namespaces), h.NS)
		require.NoDirExists(t, filepath.Join("/sys/class/net", h.Veth))
		require.NoDirExists(t, filepath.Join(etcDir, h.NS))
	}
	require.NoDirExists(t, filepath.Join("/sys/class/net", c.Bridge))
	require.NoFileExists(t, filepath.Join(lockDir, c.Prefix+".lock"))
}

func TestCleanupStale(t *testing.T) {
	live := NewCluster(t, 1, "")

	// What a crashed run leaves behind: a cluster with a process in it and
	// nobody holding its lock.
	prefix, lock, err := reservePrefix()
	require.NoError(t, err)
	require.NoError(t, unlock(lock))
	t.Cleanup(func() { assert.NoError(t, removeResources(prefix, t.Logf)) })
	stale := &Cluster{Prefix: prefix, Bridge: prefix + "-br"}
	require.NoError(t, stale.create(2))
	cmd := stale.Host(1).command(context.Background(), nil, []string{"sleep", "1000"})
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait() // killed, by design
		close(exited)
	}()
	// A lock file whose cluster is gone.
	orphanLock := filepath.Join(lockDir, Family+"0000.lock")
	require.NoError(t, os.WriteFile(orphanLock, nil, 0o644))

	require.NoError(t, CleanupStale(Family))

	names, err := resourceNames()
	require.NoError(t, err)
	for _, name := range names {
		require.False(t, strings.HasPrefix(name, prefix+"-"), "stale %s survived", name)
	}
	require.NoFileExists(t, orphanLock)
	select {
	case <-exited:
	case <-time.After(settleTimeout):
		t.Fatal("process in a stale namespace survived")
	}

	// The live cluster's lock kept it out of reach.
	require.FileExists(t, filepath.Join(lockDir, live.Prefix+".lock"))
	out, _, err := live.Host(0).Run(t.Context(), nil, "hostname")
	require.NoError(t, err)
	require.Equal(t, "h0", strings.TrimSpace(out))
}

func TestSkipOrFail(t *testing.T) {
	tests := []struct {
		skipEnv     string
		wantSkipped bool
		wantMsg     string
	}{
		{"1", true, "needs root (skipped because RDZV_E2E_SKIP=1)"},
		{"", false, "needs root; set RDZV_E2E_SKIP=1 to skip these tests instead"},
		{"0", false, "needs root; set RDZV_E2E_SKIP=1 to skip these tests instead"},
	}
	for _, tt := range tests {
		t.Run("RDZV_E2E_SKIP="+tt.skipEnv, func(t *testing.T) {
			t.Setenv("RDZV_E2E_SKIP", tt.skipEnv)
			rec := &recorder{TB: t}
			SkipOrFail(rec, "needs %s", "root")
			require.Equal(t, tt.wantSkipped, rec.skipped)
			require.Equal(t, !tt.wantSkipped, rec.failed)
			require.Equal(t, tt.wantMsg, rec.msg)
		})
	}
}

// recorder notes how a test was ended instead of ending it.
type recorder struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (r *recorder) Helper() {}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, fmt.Sprintf(format, args...)
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
}

// alive reports whether pid is running; a zombie has exited.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name, which may hold spaces.
	rest := stat[bytes.LastIndexByte(stat, ')')+1:]
	state := strings.Fields(string(rest))[0]
	return state != "Z" && state != "X"
}
