package main

import (
	"testing"

	"github.com/rdzv/rdzv/cmd/internal/cli/clitest"
)

func TestMain(m *testing.M) { clitest.Main(m, main) }

func TestHelpAndVersion(t *testing.T) { clitest.HelpAndVersion(t, "rdzv-controller") }

// docs/daemons.md is this daemon's --help; make docs rewrites it.
func TestFlagReference(t *testing.T) { clitest.FlagReference(t, "rdzv-controller") }

// A misspelt field, a value of the wrong kind and one Validate refuses
// are each reported at their line and column, with the exit status
// systemd does not restart (cli.ExitConfig); a good config is "ok".
func TestCheckConfig(t *testing.T) {
	clitest.CheckConfig(t, []clitest.ConfigCase{
		{"good", "--check-config --config testdata/good.yaml"},
		{"misspelt", "--check-config --config testdata/misspelt.yaml"},
		{"types", "--check-config --config testdata/types.yaml"},
		{"invalid", "--check-config --config testdata/invalid.yaml"},
		{"missing-file", "--check-config --config testdata/no-such.yaml"},
		{"bad-flag", "--check-config --config testdata/good.yaml --log-level=loud"},
		{"without-check-config", "--config testdata/misspelt.yaml"},
	})
}
