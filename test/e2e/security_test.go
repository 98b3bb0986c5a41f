package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSecurity runs the real binaries over mutual TLS, with certificates
// from `rdzvctl pki`, and checks who is let in and what they may do.
func TestSecurity(t *testing.T) {
	c := newCluster(t)
	defer c.report()
	c.startEmbeddedController()
	c.startAgents()
	// Each agent registered under its hostname with its own certificate.
	c.waitReady(t)

	caCert, err := os.ReadFile(filepath.Join(c.pkiDir, "ca.crt"))
	require.NoError(t, err)
	// tlsDir makes an rdzvctl --tls-dir holding ca (PEM) and a
	// certificate issued with args.
	tlsDir := func(name string, ca []byte, args ...string) string {
		dir := filepath.Join(c.dir, name)
		c.pki(t, append([]string{"issue"}, append(args, "--out", filepath.Join(dir, "rdzvctl"))...)...)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o644))
		return dir
	}
	viewer := tlsDir("viewer", caCert, "viewer", "auditor", "--dir", c.pkiDir)
	expired := tlsDir("expired", caCert, "operator", "old", "--dir", c.pkiDir, "--valid-for", "1s")
	// Another CA's operator, trusting both CAs so that rdzvctl accepts the
	// controller and the controller is the one to refuse.
	foreignCA := filepath.Join(c.dir, "foreign-ca")
	c.pki(t, "init", "--dir", foreignCA)
	foreignCert, err := os.ReadFile(filepath.Join(foreignCA, "ca.crt"))
	require.NoError(t, err)
	foreign := tlsDir("foreign", append(caCert, foreignCert...), "operator", "mallory", "--dir", foreignCA)
	jobPath := filepath.Join(c.dir, "probe.yaml")
	require.NoError(t, os.WriteFile(jobPath, []byte("name: probe\nnodes: {min: 1}\ncommand: [train.py]\n"), 0o644))
	time.Sleep(2 * time.Second) // the expired certificate's --valid-for, and some

	node := c.agentHost(0).Name
	tests := []struct {
		name string
		args []string
		// wantErr is empty when the command must succeed.
		wantErr string
	}{
		{"no client certificate", []string{"--tls-dir", t.TempDir(), "nodes"}, "rdzvctl needs a valid client certificate"},
		{"plaintext", []string{"--insecure", "--timeout", "5s", "nodes"}, "is the controller using TLS?"},
		{"another CA's operator", []string{"--tls-dir", foreign, "nodes"}, "certificate not signed by the cluster CA"},
		{"expired certificate", []string{"--tls-dir", expired, "nodes"}, "expired at"},
		{"viewer lists nodes", []string{"--tls-dir", viewer, "nodes"}, ""},
		{"viewer lists jobs", []string{"--tls-dir", viewer, "list"}, ""},
		{"viewer cannot start", []string{"--tls-dir", viewer, "start", jobPath}, "viewer/auditor (role viewer) may not call /rdzv.v1.JobService/StartJob: it needs a certificate of role operator"},
		{"viewer cannot stop", []string{"--tls-dir", viewer, "stop", "probe"}, "may not call /rdzv.v1.JobService/StopJob"},
		{"viewer cannot cordon", []string{"--tls-dir", viewer, "nodes", "cordon", node}, "may not call /rdzv.v1.NodeService/CordonNode"},
		{"operator cordons", []string{"nodes", "cordon", node, "--reason", "e2e"}, ""},
		{"operator uncordons", []string{"nodes", "uncordon", node}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := c.ctlWith(commandTimeout, append([]string{"--controller", c.controllerAddr}, tt.args...)...)
			if tt.wantErr == "" {
				require.NoError(t, r.err, "%s", r)
				return
			}
			require.Equal(t, 1, r.exitCode(), "%s", r)
			require.Contains(t, r.stderr, tt.wantErr, "%s", r)
		})
	}
	var list struct {
		Jobs []jobJSON `json:"jobs"`
	}
	c.ctlJSON(t, &list, "list")
	require.Empty(t, list.Jobs, "no refused command started a job")
	for _, n := range c.waitReady(t) {
		require.False(t, n.Cordoned, "node %s", n.Info.Name)
	}

	t.Run("an agent with another node's certificate", func(t *testing.T) {
		other := c.agentHost(1).Name
		argv := append([]string{c.agentBin, "--controller", c.controllerAddr, "--node-name", other,
			"--state-dir", filepath.Join(c.dir, "impostor"), "--gossip-port", "-1"}, c.tlsArgs("agent", node)...)
		p := c.agentHost(0).Start(t, "impostor", nil, argv...)
		select {
		case <-p.Exited():
		case <-time.After(stopTimeout):
			t.Fatalf("the agent with %s's certificate posing as %s is still running", node, other)
		}
		require.Error(t, p.Wait())
		data, err := os.ReadFile(p.LogPath())
		require.NoError(t, err)
		require.Contains(t, string(data), "is the certificate of agent/"+node+`, but this is node "`+other+`"`)
	})
}
