package e2e

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/controller"
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
			"--state-dir", filepath.Join(c.dir, "impostor"), "--gossip-port", "-1", "--peer-port", "-1"}, c.tlsArgs("agent", node)...)
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

	t.Run("a revoked agent is disconnected and lost", func(t *testing.T) {
		out := c.ctlOK(t, "pki", "revoke", "agent/"+node, "--reason", "e2e")
		require.Contains(t, out, "revoked every certificate of agent/"+node+" issued until now")
		c.waitNodes(t, node+" lost, the others ready", func(nodes []nodeJSON) bool {
			for _, n := range nodes {
				if (n.Info.Name == node) != (n.State == "NODE_STATE_LOST") {
					return false
				}
			}
			return true
		})
		require.Contains(t, c.ctlOK(t, "pki", "revocations"), "agent/"+node)
		data, err := os.ReadFile(c.controller.LogPath())
		require.NoError(t, err)
		require.Contains(t, string(data), `"msg":"closing connection: client certificate no longer accepted"`)
		require.Contains(t, string(data), `"error":"certificate agent/`+node+` (serial `, "the controller says which certificate and why")
	})
}

// TestLocalAttacker: an unprivileged user on the controller's host can
// neither read nor write the embedded etcd (nor its files, nor the secrets
// key), and the controller opens no network port but its API. Root can,
// which shows the attempts themselves work; and what root plants in etcd
// is not acted on.
func TestLocalAttacker(t *testing.T) {
	const secret = "hf_local-attacker-target"
	c := newCluster(t)
	defer c.report()
	// The test's directories are private to root (t.TempDir): open the way
	// down to the controller's data dir, so that only the controller's own
	// permissions stand between the attacker and etcd.
	for _, dir := range []string{filepath.Dir(c.dir), c.dir} {
		require.NoError(t, os.Chmod(dir, 0o755))
	}
	c.startEmbeddedController()
	jobPath := filepath.Join(c.dir, "secret.yaml")
	require.NoError(t, os.WriteFile(jobPath, []byte("name: secret\nnodes: {min: 1}\ncommand: [train.py]\nsecret_env: {HF_TOKEN: "+secret+"}\n"), 0o644))
	var last ctlResult
	require.Eventually(t, func() bool { last = c.ctl("start", jobPath); return last.err == nil }, readyTimeout, pollEvery,
		"the job was never accepted; last: %s", &last)

	// The test binary is the attacker's program; root's build directory is
	// private, so it runs from a copy.
	self, err := os.Executable()
	require.NoError(t, err)
	bin, err := os.ReadFile(self)
	require.NoError(t, err)
	attacker := filepath.Join(c.dir, "attacker")
	require.NoError(t, os.WriteFile(attacker, bin, 0o755))
	data := c.controllerDataDir()
	paths := []string{c.dir, data, filepath.Join(data, "member", "snap", "db"), filepath.Join(data, "secrets.key")}
	attack := func(t *testing.T, asUser ...string) attackResult {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
		defer cancel()
		argv := append(append(asUser, attacker, filepath.Join(data, "etcd.sock")), paths...)
		out, _, err := c.controllerHost().Run(ctx, []string{helperEnv + "=local-attacker"}, argv...)
		require.NoError(t, err)
		var r attackResult
		require.NoError(t, json.Unmarshal([]byte(out), &r), out)
		return r
	}

	t.Run("nobody", func(t *testing.T) {
		r := attack(t, "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--inh-caps=-all", "--")
		require.True(t, r.ConnectDenied, "connecting to the etcd socket: %q", r.Connect)
		require.NotEmpty(t, r.Get, "nobody listed etcd's keys: %v", r.Keys)
		require.NotEmpty(t, r.Put, "nobody wrote a job record")
		require.Empty(t, r.Read[c.dir], "the way to the data dir is open, so the data dir is what refuses")
		for _, p := range paths[1:] {
			require.Contains(t, r.Read[p], "permission denied", "nobody reading %s", p)
		}
	})

	t.Run("no network port but the API", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
		defer cancel()
		out, _, err := c.controllerHost().Run(ctx, nil, "ss", "-H", "-l", "-n", "-t", "-u")
		require.NoError(t, err)
		// Metrics and health listen too, on loopback only by default.
		metrics, err := netip.ParseAddrPort(controller.DefaultHTTPListen)
		require.NoError(t, err)
		var ports []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if fields := strings.Fields(line); len(fields) >= 5 {
				if fields[4] == metrics.String() {
					continue
				}
				ports = append(ports, fields[4][strings.LastIndexByte(fields[4], ':')+1:])
			}
		}
		require.Equal(t, []string{controllerPort}, ports, "listening on %s:\n%s", c.controllerHost().Name, out)
	})

	t.Run("root", func(t *testing.T) {
		r := attack(t)
		require.Empty(t, r.Connect)
		require.Empty(t, r.Get)
		require.Contains(t, r.Keys, "/rdzv/v1/jobs/secret")
		for _, v := range r.Values {
			require.NotContains(t, v, secret, "a job's secret is stored in plaintext")
		}
		require.Empty(t, r.Put)
		for _, p := range paths {
			require.Empty(t, r.Read[p], "root reading %s", p)
		}

		// What root planted is not a job: after a restart the controller
		// refuses it and says why.
		c.restartController()
		var job jobJSON
		require.Eventually(t, func() bool {
			r := c.ctl("-o", "json", "status", "planted")
			return r.err == nil && json.Unmarshal([]byte(r.stdout), &job) == nil
		}, readyTimeout, pollEvery)
		require.Equal(t, "JOB_STATE_FAILED", job.State)
		require.Contains(t, job.Reason, "is invalid and was not acted on")
	})
}
