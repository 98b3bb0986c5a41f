package agent

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func preflightAssignment(nnodes uint32) *rdzvv1.Assignment {
	return &rdzvv1.Assignment{
		Spec: &rdzvv1.JobSpec{Name: "j", HealthPreflight: &rdzvv1.PreflightSpec{
			MinBandwidthMbps: 1000, Bytes: 1 << 20, Timeout: durationpb.New(30 * time.Second),
		}},
		Generation: 3, NodeRank: 1, Nnodes: nnodes, MasterAddr: "10.0.0.1", MasterPort: 29500,
	}
}

// The wrapper runs the test with the round's parameters, and the launcher,
// with its arguments intact, only when the test passes.
func TestPreflightCommand(t *testing.T) {
	bin := t.TempDir()
	out := filepath.Join(t.TempDir(), "out")
	// A python3 that records its arguments and exits with $PF_EXIT.
	require.NoError(t, os.WriteFile(filepath.Join(bin, "python3"), []byte("#!/bin/sh\necho \"python3 $*\" >> "+out+"\nps -o pgid= $$ | tr -d ' ' > "+out+".pgid\necho 'rdzv preflight: rank 1 of 2: excluded: links below 1000 Mbit/s'\nexit \"$PF_EXIT\"\n"), 0o755))
	launcher := filepath.Join(bin, "torchrun")
	require.NoError(t, os.WriteFile(launcher, []byte("#!/bin/sh\nfor a in \"$@\"; do echo \"arg=$a\" >> "+out+"; done\n"), 0o755))

	path, args := preflightCommand(preflightAssignment(2), "/state/preflight.py", launcher, []string{"--nnodes", "2", "train.py", "two words", `"$HOME" ;`})
	require.Equal(t, "/bin/sh", path)
	for _, tc := range []struct {
		exit string
		code int
		want []string
	}{
		{"0", 0, []string{"python3 /state/preflight.py --rank 1 --world 2 --addr 10.0.0.1 --port 29500 --bytes 1048576 --min-mbps 1000 --timeout 30",
			"arg=--nnodes", "arg=2", "arg=train.py", "arg=two words", `arg="$HOME" ;`}},
		{"87", preflightExcluded, []string{"python3 /state/preflight.py"}},
		{"1", 1, []string{"python3 /state/preflight.py"}},
	} {
		t.Run("exit "+tc.exit, func(t *testing.T) {
			require.NoError(t, os.RemoveAll(out))
			cmd := exec.Command(path, args...)
			cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "PF_EXIT=" + tc.exit}
			// As the shim starts the launcher: leading its own group.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			stdout, err := cmd.Output()
			pgid, rerr := os.ReadFile(out + ".pgid")
			require.NoError(t, rerr)
			require.Equal(t, strconv.Itoa(cmd.Process.Pid), strings.TrimSpace(string(pgid)), "the test stays in the launcher's process group")
			code := 0
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				code = exitErr.ExitCode()
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, tc.code, code)
			require.Contains(t, string(stdout), preflightPrefix)
			got, err := os.ReadFile(out)
			require.NoError(t, err)
			lines := strings.Split(strings.TrimSpace(string(got)), "\n")
			require.Len(t, lines, len(tc.want), "%q", lines)
			for i, w := range tc.want {
				require.True(t, strings.HasPrefix(lines[i], w), "line %d: %q, want %q", i, lines[i], w)
			}
		})
	}
}

func TestPreflightCommandOnlyForRounds(t *testing.T) {
	path, args := preflightCommand(preflightAssignment(1), "/s/preflight.py", "/usr/bin/torchrun", []string{"train.py"})
	require.Equal(t, "/usr/bin/torchrun", path, "one node has no links to test")
	require.Equal(t, []string{"train.py"}, args)
	a := preflightAssignment(4)
	a.Spec.HealthPreflight = nil
	path, _ = preflightCommand(a, "/s/preflight.py", "/usr/bin/torchrun", nil)
	require.Equal(t, "/usr/bin/torchrun", path, "off unless the job asks")
}

func TestPreflightVerdict(t *testing.T) {
	log := filepath.Join(t.TempDir(), "j.log")
	line := "rdzv preflight: rank 1 of 3: excluded: links below 1000 Mbit/s; took 2.1 s"
	require.NoError(t, os.WriteFile(log, []byte(strings.Repeat("x", 10000)+"\n=== rdzv: started\n"+line+"\n"), 0o644))
	got, ok := preflightVerdict(log, Exit{Code: preflightExcluded})
	require.True(t, ok)
	require.Equal(t, line, got)
	_, ok = preflightVerdict(log, Exit{Code: 1})
	require.False(t, ok, "only the test's own exit code leaves the node out")
	require.NoError(t, os.WriteFile(log, []byte(line+"\ntraining output\n"), 0o644))
	_, ok = preflightVerdict(log, Exit{Code: preflightExcluded})
	require.False(t, ok, "the launcher ran after the test: its exit code is its own")
	_, ok = preflightVerdict(filepath.Join(t.TempDir(), "missing"), Exit{Code: preflightExcluded})
	require.False(t, ok)
}

func TestWritePreflight(t *testing.T) {
	dir := t.TempDir()
	path, err := writePreflight(dir)
	require.NoError(t, err)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, preflightScript, got)
	info, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), info.Mode().Perm(), "every worker user runs it")
	again, err := writePreflight(dir)
	require.NoError(t, err)
	require.Equal(t, path, again)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary files left")
}
