package agent

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// preflightScript is the round smoke test (job.yaml health.preflight),
// run by every node of a round before torchrun.
//
//go:embed preflight/preflight.py
var preflightScript []byte

const (
	// preflightFile holds the script under state_dir, readable by every
	// worker user, written by the agent only.
	preflightFile = "preflight.py"
	// preflightExcluded is the script's exit code for "this node is too
	// slow": the round is planned again without it.
	preflightExcluded = 87
	// preflightPrefix starts the script's verdict line.
	preflightPrefix = "rdzv preflight: "
	// preflightTail is how much of the job log is read for the verdict.
	preflightTail = 4096
)

// writePreflight puts the script where workers can run it.
func writePreflight(stateDir string) (string, error) {
	return writeScript(stateDir, preflightFile, preflightScript)
}

// writeScript puts an embedded script of the agent's in stateDir, where
// every worker user can read it; renamed into place, so a process starting
// it never reads a half-written one.
func writeScript(stateDir, name string, script []byte) (string, error) {
	path := filepath.Join(stateDir, name)
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, script) {
		return path, nil
	}
	tmp, err := os.CreateTemp(stateDir, "."+name+"-*")
	if err != nil {
		return "", fmt.Errorf("writing %s: %w", name, err)
	}
	_, werr := tmp.Write(script)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr, os.Chmod(tmp.Name(), 0o644)); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("writing %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("writing %s: %w", name, err)
	}
	return path, nil
}

// preflightCommand wraps the launcher: with health.preflight on and more
// than one node, the smoke test runs first among the round's nodes (on the
// master's address and port, which torchrun takes over once it is done),
// within its timeout, and the launcher starts only if it passes. The shell
// execs the launcher, so the shim's process group and exit status are the
// launcher's as without a test. timeout runs in the foreground: otherwise
// it moves the test to a process group of its own, out of reach of the
// shim that stops the workers.
func preflightCommand(a *rdzvv1.Assignment, script, launcher string, args []string) (string, []string) {
	pf := a.GetSpec().GetHealthPreflight()
	if pf == nil || a.GetNnodes() < 2 {
		return launcher, args
	}
	timeout := pf.GetTimeout().AsDuration()
	test := []string{
		"timeout", "--foreground", "--kill-after=5", strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64),
		"python3", script, "--rank", fmt.Sprint(a.GetNodeRank()), "--world", fmt.Sprint(a.GetNnodes()),
		"--addr", a.GetMasterAddr(), "--port", fmt.Sprint(a.GetMasterPort()), "--bytes", fmt.Sprint(pf.GetBytes()),
		"--min-mbps", strconv.FormatFloat(pf.GetMinBandwidthMbps(), 'f', -1, 64),
		"--timeout", strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64),
	}
	// Positional parameters carry every argument, so nothing is quoted.
	n := len(test)
	sh := fmt.Sprintf(`%s || exit "$?"; shift %d; exec "$@"`, shPositional(n), n)
	argv := append([]string{"-c", sh, "rdzv-preflight"}, test...)
	return "/bin/sh", append(append(argv, launcher), args...)
}

// shPositional is "$1" "$2" ... "$n" for a POSIX shell.
func shPositional(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"${%d}"`, i+1)
	}
	return strings.Join(parts, " ")
}

// preflightVerdict is the smoke test's verdict line when it left this
// node out: it exited preflightExcluded and its line is the log's last.
func preflightVerdict(logPath string, exit Exit) (string, bool) {
	if exit.Code != preflightExcluded {
		return "", false
	}
	f, err := os.Open(logPath)
	if err != nil {
		return "", false
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > preflightTail {
		_, _ = f.Seek(st.Size()-preflightTail, io.SeekStart)
	}
	tail, err := io.ReadAll(f)
	if err != nil {
		return "", false
	}
	lines := strings.Split(strings.TrimRight(string(tail), "\n"), "\n")
	last := lines[len(lines)-1]
	return last, strings.HasPrefix(last, preflightPrefix) && strings.Contains(last, ": excluded: ")
}
