package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/cmd/internal/cli/clitest"
	"github.com/rdzv/rdzv/controller"
)

func TestMain(m *testing.M) { clitest.Main(m, main) }

func TestHelpAndVersion(t *testing.T) { clitest.HelpAndVersion(t, "rdzv-controller") }

// docs/daemons.md is this daemon's --help; make docs rewrites it.
func TestFlagReference(t *testing.T) { clitest.FlagReference(t, "rdzv-controller") }

// A misspelt field, a value of the wrong kind and one Validate refuses
// are each reported at their line and column, with the exit status
// systemd does not restart (cli.ExitConfig); a good config is "ok".
func TestCheckConfig(t *testing.T) {
	clitest.CheckConfig(t)
}

// docs/daemons.md has a row for every field of the config file: its flag
// or "file only", its default and meaning; make docs rewrites it.
func TestConfigReference(t *testing.T) {
	_, _, f, err := config([]string{"--insecure"})
	require.NoError(t, err)
	clitest.ConfigReference(t, "rdzv-controller", controller.DefaultConfig(), f)
}
