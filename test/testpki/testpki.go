// Package testpki makes the certificates of the multi-host tests the way an
// operator makes them, with the real `rdzvctl pki`, and names the files
// each daemon is given.
package testpki

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Run runs `rdzvctl pki ARGS` with ctlBin and returns its output; it only
// writes files.
func Run(t *testing.T, ctlBin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(ctlBin, append([]string{"pki"}, args...)...).CombinedOutput()
	require.NoError(t, err, "rdzvctl pki %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// DaemonArgs are a daemon's flags for the certificate of role and name
// that `rdzvctl pki issue` wrote into dir.
func DaemonArgs(dir, role, name string) []string {
	prefix := filepath.Join(dir, role+"-"+name)
	return []string{"--tls-cert", prefix + ".crt", "--tls-key", prefix + ".key", "--tls-ca", filepath.Join(dir, "ca.crt")}
}
