package main

import (
	"bytes"
	"context"
	"flag"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func writeJob(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "job.yaml")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

// closedAddr is an address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func TestRun(t *testing.T) {
	down := closedAddr(t)
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
		{"start unknown yaml field", []string{"--controller", down, "start", unknownField}, 1, `unknown field "nodez"`},
		{"bad output format", []string{"-o", "yaml", "nodes"}, 2, "-o must be table or json"},
		{"status too many args", []string{"status", "a", "b"}, 2, "at most one job name"},
		{"list takes no arguments", []string{"list", "junk"}, 2, "list takes no arguments"},
		{"list checks the output format", []string{"list", "-o", "bogus"}, 2, "-o must be table or json"},
		{"logs needs a job", []string{"logs"}, 2, "logs takes one job name"},
		{"unknown flag", []string{"nodes", "--bogus"}, 2, "flag provided but not defined"},
		{"unreachable controller", []string{"--controller", down, "--timeout", "2s", "nodes"}, 1, "cannot reach the controller at " + down},
		{"flags after the file", []string{"start", goodJob, "--controller", down, "--timeout", "2s"}, 1, "cannot reach the controller"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			code, err := run(context.Background(), tt.args, &out)
			require.Equal(t, tt.wantCode, code, "err: %v", err)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestParseInterleavesFlagsAndArguments(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	wait := fs.Bool("wait", false, "")
	node := fs.String("node", "", "")
	pos, err := parse(fs, []string{"a", "--wait", "b", "--node", "h1", "c"})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c"}, pos)
	require.True(t, *wait)
	require.Equal(t, "h1", *node)
}
