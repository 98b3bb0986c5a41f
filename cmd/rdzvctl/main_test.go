package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/internal/testaddr"
)

func writeJob(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "job.yaml")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

// runOK runs rdzvctl and requires success.
func runOK(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	code, err := run(context.Background(), args, &out, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 0, code)
	return out.String()
}

func TestRun(t *testing.T) {
	down := testaddr.Free(t)
	// An operator's TLS directory, made with rdzvctl's own pki commands.
	caDir, tlsDir := t.TempDir(), t.TempDir()
	runOK(t, "pki", "init", "--dir", caDir)
	runOK(t, "pki", "issue", "operator", "alice", "--dir", caDir, "--out", filepath.Join(tlsDir, "rdzvctl"))
	data, err := os.ReadFile(filepath.Join(caDir, "ca.crt"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(tlsDir, "ca.crt"), data, 0o644))
	badJob := writeJob(t, "name: x\nnodes: {min: 3, max: 1}\ncommand: [train.py]\n")
	unknownField := writeJob(t, "name: x\nnodes: {min: 1}\ncommand: [train.py]\nnodez: 2\n")
	goodJob := writeJob(t, "name: x\nnodes: {min: 1}\ncommand: [train.py]\n")
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"no command", nil, 2, ""},
		{"unknown command", []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"help", []string{"help"}, 0, ""},
		{"start without file", []string{"start"}, 2, "start takes one job file"},
		{"start missing file", []string{"start", "/nonexistent/job.yaml"}, 1, "reading job file"},
		{"start invalid job names the field", []string{"--controller", down, "start", badJob}, 1, "nodes.max: must be at least nodes.min (3)"},
		{"start unknown field names it", []string{"--controller", down, "start", badJob + "x"}, 1, "reading job file"},
		{"start unknown yaml field", []string{"--controller", down, "start", unknownField}, 1, "nodez: unknown field; did you mean nodes?"},
		{"bad output format", []string{"-o", "xml", "nodes"}, 2, `-o: want table, wide, json, yaml, name or jsonpath=EXPR, got "xml"`},
		{"bad jsonpath", []string{"-o", "jsonpath={.nodes[}", "nodes"}, 2, "is not a JSONPath expression"},
		{"status too many args", []string{"status", "a", "b"}, 2, "at most one job name"},
		{"list takes no arguments", []string{"list", "junk"}, 2, "list takes no arguments"},
		{"list checks the output format", []string{"list", "-o", "bogus"}, 2, "-o: want table"},
		{"logs needs a job", []string{"logs"}, 2, "logs takes one job name"},
		{"unknown flag", []string{"nodes", "--bogus"}, 2, "unknown flag: --bogus"},
		{"unreachable controller", []string{"--tls-dir", tlsDir, "--controller", down, "--timeout", "2s", "nodes"}, 1, "cannot reach the controller at " + down},
		{"flags after the file", []string{"start", goodJob, "--controller", down, "--timeout", "2s", "--tls-dir", tlsDir}, 1, "cannot reach the controller"},
		{"no client certificate", []string{"--tls-dir", t.TempDir(), "--controller", down, "nodes"}, 1, "rdzvctl needs a valid client certificate"},
		{"one file overridden", []string{"--tls-dir", tlsDir, "--tls-key", filepath.Join(caDir, "ca.key"), "--controller", down, "nodes"}, 1, "private key does not match public key"},
		{"insecure against a TLS controller says so", []string{"--insecure", "--controller", down, "--timeout", "2s", "nodes"}, 1, "is the controller using TLS?"},
		{"pki without a command", []string{"pki"}, 2, "pki takes init, issue, show, revoke or revocations"},
		{"pki revoke nothing", []string{"pki", "revoke"}, 2, "pki revoke takes one of ROLE/NAME"},
		{"pki revoke two things", []string{"pki", "revoke", "agent/gpu-01", "--serial", "1f"}, 2, "pki revoke takes one of ROLE/NAME"},
		{"pki revoke two identities", []string{"pki", "revoke", "agent/gpu-01", "agent/gpu-02"}, 2, "pki revoke takes one of ROLE/NAME"},
		{"pki revoke bad identity", []string{"pki", "revoke", "gpu-01"}, 2, "identity: want ROLE/NAME (e.g. agent/gpu-01)"},
		{"pki revoke bad role", []string{"pki", "revoke", "root/gpu-01"}, 2, `role: want controller, agent, operator, viewer or relay, got "root"`},
		{"pki revoke bad serial", []string{"pki", "revoke", "--serial", "xyz"}, 2, "--serial: want a certificate serial number in hex"},
		{"pki revoke missing cert", []string{"pki", "revoke", "--cert", "/nonexistent/agent.crt"}, 1, "/nonexistent/agent.crt"},
		{"pki revocations takes no arguments", []string{"pki", "revocations", "x"}, 2, "pki revocations takes no arguments"},
		{"pki revoke talks to the controller", []string{"--tls-dir", tlsDir, "--controller", down, "--timeout", "2s", "pki", "revoke", "agent/gpu-01"}, 1, "revoking: cannot reach the controller at " + down},
		{"pki init refuses to replace the CA", []string{"pki", "init", "--dir", caDir}, 1, "ca.crt already exists; pass --force to replace it"},
		{"pki issue bad role", []string{"pki", "issue", "admin", "bob", "--dir", caDir}, 2, `role: want controller, agent, operator, viewer or relay, got "admin"`},
		{"pki issue bad name", []string{"pki", "issue", "agent", "GPU_01", "--dir", caDir}, 2, "name: must be a DNS-1123 label"},
		{"pki issue without a name", []string{"pki", "issue", "agent", "--dir", caDir}, 2, "pki issue takes ROLE NAME"},
		{"pki issue without a CA", []string{"pki", "issue", "agent", "gpu-01", "--dir", t.TempDir()}, 1, "create it with `rdzvctl pki init"},
		{"pki issue agent with an address", []string{"pki", "issue", "agent", "gpu-01", "--dir", caDir, "--ip", "10.0.0.1"}, 1, "only controller and relay certificates name hosts"},
		{"pki issue bad ip", []string{"pki", "issue", "controller", "ctl", "--dir", caDir, "--ip", "10.0.0"}, 2, `--ip: "10.0.0" is not an IP address`},
		{"pki issue refuses to overwrite", []string{"pki", "issue", "operator", "alice", "--dir", caDir, "--out", filepath.Join(tlsDir, "rdzvctl")}, 1, "already exists; pass --force"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			code, err := run(context.Background(), tt.args, &out, io.Discard)
			require.Equal(t, tt.wantCode, code, "err: %v", err)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestPKIIssueAndShow(t *testing.T) {
	dir := t.TempDir()
	require.Contains(t, runOK(t, "pki", "init", "--dir", dir), "created CA")
	out := runOK(t, "pki", "issue", "controller", "ctl-1", "--dir", dir, "--ip", "10.0.0.1,10.0.0.2", "--dns", "ctl.example", "--valid-for", "24h")
	require.Contains(t, out, "issued controller/ctl-1")
	out = runOK(t, "pki", "show", filepath.Join(dir, "controller-ctl-1.crt"), filepath.Join(dir, "ca.crt"))
	require.Contains(t, out, "controller-ctl-1.crt: controller/ctl-1")
	require.Contains(t, out, "hosts ctl-1,ctl.example,10.0.0.1,10.0.0.2")
	require.Contains(t, out, "ca.crt: CA")
	fi, err := os.Stat(filepath.Join(dir, "controller-ctl-1.key"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	before, err := os.ReadFile(filepath.Join(dir, "controller-ctl-1.crt"))
	require.NoError(t, err)
	runOK(t, "pki", "issue", "controller", "ctl-1", "--dir", dir, "--ip", "10.0.0.1", "--force")
	after, err := os.ReadFile(filepath.Join(dir, "controller-ctl-1.crt"))
	require.NoError(t, err)
	require.NotEqual(t, before, after, "--force rotates the certificate")
}
