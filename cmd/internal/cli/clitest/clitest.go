// Package clitest checks what the daemons' command lines promise: --help
// and --version on stdout with exit 0, a wrong flag or argument on stderr
// with exit 78 (cli.ExitConfig), --check-config's answers, and
// docs/daemons.md equal to --help. The test binary runs
// itself as the daemon, so the checks see real exit statuses and streams.
package clitest

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/cmd/internal/cli"
)

var update = flag.Bool("update", false, "rewrite this daemon's section of docs/daemons.md")

// mainEnv makes the test binary act as the daemon, with these arguments.
const mainEnv = "RDZV_TEST_DAEMON_MAIN"

// Main is a daemon test package's TestMain: daemonMain is its main.
func Main(m *testing.M, daemonMain func()) {
	if args := os.Getenv(mainEnv); args != "" {
		os.Args = append([]string{os.Args[0]}, strings.Fields(args)...)
		daemonMain()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// run runs the daemon with args, with no controller address taken from the
// environment (a default that would otherwise show in --help).
func run(args string) (*exec.Cmd, *strings.Builder, *strings.Builder, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), mainEnv+"="+args, "RDZV_CONTROLLER=")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return cmd, &stdout, &stderr, err
}

// HelpAndVersion: --help and --version answer on stdout and exit 0; a
// wrong flag or a stray argument exits cli.ExitConfig on stderr, pointing
// to --help.
func HelpAndVersion(t *testing.T, name string) {
	tests := []struct {
		args   string
		code   int
		stdout string
		stderr string
	}{
		{"--help", 0, "Usage: " + name + " [flags]\n\n" + name + " ", ""},
		{"-h", 0, "Usage: " + name + " [flags]", ""},
		{"--version", 0, name + " dev (commit ", ""},
		{"--no-such-flag", cli.ExitConfig, "", name + ": flag provided but not defined: -no-such-flag (see " + name + " --help)\n"},
		{"stray", cli.ExitConfig, "", name + ": unexpected argument \"stray\": " + name + " takes flags only"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			cmd, stdout, stderr, err := run(tt.args)
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

// FlagReference: docs/daemons.md holds exactly the daemon's --help (with
// -update, it is rewritten to).
func FlagReference(t *testing.T, name string) {
	cmd, stdout, stderr, err := run("--help")
	require.NoError(t, err, "stderr %q", stderr.String())
	require.Zero(t, cmd.ProcessState.ExitCode())
	require.NoError(t, cli.CheckDoc(filepath.Join("..", "..", cli.DaemonsDoc), name, "```\n"+stdout.String()+"```\n", *update))
}

// ConfigCase runs a daemon with Args (in its package directory, whose
// testdata holds the config files) and compares its exit status, stdout
// and stderr with testdata/check-config/Name.golden.
type ConfigCase struct {
	Name string
	Args string
}

// configCases are the cases every daemon's --check-config answers, each
// reading the daemon's own testdata/<name>.yaml: a good config, a misspelt
// field, values of the wrong kind, one Validate refuses, a missing file, a
// bad flag, and a config read without --check-config (which must fail
// before the daemon starts anything).
var configCases = []ConfigCase{
	{Name: "good", Args: "--check-config --config testdata/good.yaml"},
	{Name: "misspelt", Args: "--check-config --config testdata/misspelt.yaml"},
	{Name: "types", Args: "--check-config --config testdata/types.yaml"},
	{Name: "invalid", Args: "--check-config --config testdata/invalid.yaml"},
	{Name: "missing-file", Args: "--check-config --config testdata/no-such.yaml"},
	{Name: "bad-flag", Args: "--check-config --config testdata/good.yaml --log-level=loud"},
	{Name: "without-check-config", Args: "--config testdata/misspelt.yaml"},
}

// CheckConfig runs the cases every daemon shares, then the daemon's own
// extra ones, and compares what each answers with its golden file (with
// -update, it is rewritten to).
func CheckConfig(t *testing.T, extra ...ConfigCase) {
	for _, tt := range append(slices.Clone(configCases), extra...) {
		t.Run(tt.Name, func(t *testing.T) {
			cmd, stdout, stderr, _ := run(tt.Args)
			got := fmt.Sprintf("$ %s\nexit status %d\n--- stdout\n%s--- stderr\n%s", tt.Args, cmd.ProcessState.ExitCode(), stdout, stderr)
			golden := filepath.Join("testdata", "check-config", tt.Name+".golden")
			if *update {
				require.NoError(t, os.MkdirAll(filepath.Dir(golden), 0o755))
				require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "run go test -update to write it")
			require.Equal(t, string(want), got)
		})
	}
}
