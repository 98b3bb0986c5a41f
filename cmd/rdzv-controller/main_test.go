package main

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/cmd/internal/cli"
)

var update = flag.Bool("update", false, "rewrite this daemon's section of docs/daemons.md")

// helpEnv makes the test binary act as the daemon, for the exit status and
// streams of --help and --version.
const helpEnv = "RDZV_TEST_DAEMON_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(helpEnv) != "" {
		os.Args = append([]string{os.Args[0]}, strings.Fields(os.Getenv(helpEnv))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// --help and --version answer on stdout and exit 0; a wrong flag exits 1
// on stderr, pointing to --help.
func TestHelpAndVersion(t *testing.T) {
	tests := []struct {
		args   string
		code   int
		stdout string
		stderr string
	}{
		{"--help", 0, "Usage: rdzv-controller [flags]\n\nrdzv-controller ", ""},
		{"-h", 0, "Usage: rdzv-controller [flags]", ""},
		{"--version", 0, "rdzv-controller dev (commit ", ""},
		{"--no-such-flag", 1, "", "rdzv-controller: flag provided but not defined: -no-such-flag (see rdzv-controller --help)\n"},
		{"stray", 1, "", "rdzv-controller: unexpected argument \"stray\": rdzv-controller takes flags only"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), helpEnv+"="+tt.args, "RDZV_CONTROLLER=")
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			require.Equal(t, tt.code, cmd.ProcessState.ExitCode(), "%v: stdout %q stderr %q", err, stdout.String(), stderr.String())
			if tt.stdout == "" {
				require.Empty(t, stdout.String())
			} else {
				require.True(t, strings.HasPrefix(stdout.String(), tt.stdout), "stdout %q", stdout.String())
			}
			if tt.stderr == "" {
				require.Empty(t, stderr.String())
			} else {
				require.True(t, strings.HasPrefix(stderr.String(), tt.stderr), "stderr %q", stderr.String())
			}
		})
	}
}

// docs/daemons.md holds exactly this daemon's --help.
func TestFlagReference(t *testing.T) {
	t.Setenv("RDZV_CONTROLLER", "") // a default taken from the environment
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helpEnv+"=--help")
	out, err := cmd.Output()
	require.NoError(t, err)
	require.NoError(t, cli.CheckDoc(filepath.Join("..", "..", cli.DaemonsDoc), "rdzv-controller", string(out), *update))
}
