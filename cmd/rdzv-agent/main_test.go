package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/agent"
	"github.com/rdzv/rdzv/cmd/internal/cli/clitest"
)

func TestMain(m *testing.M) { clitest.Main(m, main) }

func TestHelpAndVersion(t *testing.T) { clitest.HelpAndVersion(t, "rdzv-agent") }

// docs/daemons.md is this daemon's --help; make docs rewrites it.
func TestFlagReference(t *testing.T) { clitest.FlagReference(t, "rdzv-agent") }

// A misspelt field, a value of the wrong kind and one Validate refuses
// are each reported at their line and column, with the exit status
// systemd does not restart (cli.ExitConfig); a good config is "ok".
func TestCheckConfig(t *testing.T) {
	clitest.CheckConfig(t,
		clitest.ConfigCase{Name: "flag-over-file", Args: "--check-config --config testdata/invalid.yaml --restart-grace=1m --stop-grace=-1s"},
	)
}

// docs/daemons.md has a row for every field of the config file: its flag
// or "file only", its default and meaning; make docs rewrites it.
func TestConfigReference(t *testing.T) {
	_, f, err := config([]string{"--node-name", "n1", "--insecure", "--controller", "10.0.0.1:7070"})
	require.NoError(t, err)
	clitest.ConfigReference(t, "rdzv-agent", agent.DefaultConfig(), f)
}
