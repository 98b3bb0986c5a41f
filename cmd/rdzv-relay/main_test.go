package main

import (
	"testing"

	"github.com/rdzv/rdzv/cmd/internal/cli/clitest"
)

func TestMain(m *testing.M) { clitest.Main(m, main) }

func TestHelpAndVersion(t *testing.T) { clitest.HelpAndVersion(t, "rdzv-relay") }

// docs/daemons.md is this daemon's --help; make docs rewrites it.
func TestFlagReference(t *testing.T) { clitest.FlagReference(t, "rdzv-relay") }
