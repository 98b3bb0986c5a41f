package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The shell scripts built on examples/localcluster.sh, run as users run
// them, on this machine's loopback (not in network namespaces), with the
// torch 2.x of RDZV_VENV: make demo's examples/demo.sh (a worker, then a
// node, killed; the job must succeed) and the GPU check in its CPU mode
// (test/gpu/check.sh with GPU_CHECK_CPU=1). They only have to exit 0: each
// checks its own recoveries and fails otherwise.

// scriptTimeout bounds a script's run: each takes 1 to 2 minutes on two
// busy cores, and bounds its own waits.
const scriptTimeout = 8 * time.Minute

func TestScripts(t *testing.T) {
	venv := os.Getenv("RDZV_VENV")
	if venv == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("e2e: RDZV_VENV is not set: CI must run the demo and the GPU check's CPU mode on torch 2.x (make e2e sets it)")
		}
		t.Skip("e2e: RDZV_VENV is not set: run `make venv` and `make e2e`, or set RDZV_VENV to a venv with torch 2.x")
	}
	binDir := os.Getenv("RDZV_BIN_DIR")
	if binDir == "" {
		t.Skip("e2e: RDZV_BIN_DIR is not set: run `make e2e`, or `make build` and set RDZV_BIN_DIR")
	}
	venv, err := filepath.Abs(venv)
	require.NoError(t, err)
	binDir, err = filepath.Abs(binDir)
	require.NoError(t, err)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)

	for _, tc := range []struct {
		name   string
		script string
		env    func(port, httpPort int) []string
	}{
		{"demo", "examples/demo.sh", func(port, httpPort int) []string {
			return []string{"RDZV_VENV=" + venv, "LC_BIN=" + binDir,
				"LC_PORT=" + strconv.Itoa(port), "LC_HTTP_PORT=" + strconv.Itoa(httpPort)}
		}},
		{"gpu-check-cpu", "test/gpu/check.sh", func(port, _ int) []string {
			// check.sh puts its HTTP listeners at port+2331 and above.
			return []string{"GPU_CHECK_CPU=1", "GPU_CHECK_PYTHON=" + filepath.Join(venv, "bin", "python"),
				"GPU_CHECK_BIN=" + binDir, "GPU_CHECK_PORT=" + strconv.Itoa(port)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, tc.script))
			cmd.Dir = root
			cmd.Env = append(os.Environ(), tc.env(freeLoopbackPort(t), freeLoopbackPort(t))...)
			// SIGTERM on the timeout, so that the script's cleanup runs.
			cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
			cmd.WaitDelay = time.Minute
			out, err := cmd.CombinedOutput()
			t.Logf("%s:\n%s", tc.script, out)
			require.NoError(t, err, "%s failed", tc.script)
		})
	}
}

// freeLoopbackPort is a TCP port on 127.0.0.1 free a moment ago.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
