// Package systemd holds the daemons' systemd units; its test scores their
// sandboxing with systemd-analyze. test/e2e (TestSystemdUnitSandbox) runs the
// daemons and a job in the sandboxes the units declare.
package systemd

import (
	"os/exec"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// exposure is systemd-analyze security's summary line.
var exposure = regexp.MustCompile(`Overall exposure level for (\S+): ([0-9.]+) (\S+)`)

// TestSecurityExposure prints each unit's systemd-analyze security score
// and holds the controller to "OK" (at most 4.0). The agent starts every
// job's workers, as their users, with GPUs and the network: it cannot be
// locked down like the controller, and its score is printed only.
func TestSecurityExposure(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed (apt-get install systemd; .ci/run installs it)")
	}
	for _, tt := range []struct {
		unit string
		max  float64
	}{
		{"rdzv-controller.service", 4.0},
		{"rdzv-agent.service", 10},
		{"rdzv-relay.service", 4.0},
	} {
		t.Run(tt.unit, func(t *testing.T) {
			// --offline reads the file alone: no systemd needs to run.
			out, err := exec.Command("systemd-analyze", "security", "--offline=yes", "--no-pager", tt.unit).CombinedOutput()
			require.NoError(t, err, "%s", out)
			m := exposure.FindSubmatch(out)
			require.NotNil(t, m, "no exposure level in:\n%s", out)
			score, err := strconv.ParseFloat(string(m[2]), 64)
			require.NoError(t, err)
			t.Logf("systemd-analyze security %s: %s %s", tt.unit, m[2], m[3])
			require.LessOrEqual(t, score, tt.max, "%s", out)
		})
	}
}

// TestVerify checks the units' syntax and directives as systemd would load
// them (unknown directives, bad values).
func TestVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed (apt-get install systemd; .ci/run installs it)")
	}
	for _, unit := range []string{"rdzv-controller.service", "rdzv-agent.service", "rdzv-relay.service"} {
		// --man=no: the Documentation= URL is not a man page. The binaries
		// need not be installed here: "not executable" is the only finding
		// allowed.
		out, _ := exec.Command("systemd-analyze", "verify", "--man=no", "./"+unit).CombinedOutput()
		for _, line := range regexp.MustCompile(`(?m)^.+$`).FindAll(out, -1) {
			require.Regexp(t, `^rdzv-(agent|controller|relay)\.service: Command /usr/local/bin/rdzv-(agent|controller|relay) is not executable: No such file or directory$`, string(line), "systemd-analyze verify %s:\n%s", unit, out)
		}
	}
}
