package launchertest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPreambleRoundTrip(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "torchrun")
	rec := filepath.Join(dir, "record")
	require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\nrec=\""+rec+"\"\n"+Preamble("KEEP_[A-Z]*")), 0o755))
	cmd := exec.Command(script, "--nnodes", "2", "train.py", "a b")
	cmd.Env = []string{"KEEP_ME=yes", "DROP_ME=no", "PATH=/usr/bin:/bin"}
	require.NoError(t, cmd.Run())

	r, err := Read(rec)
	require.NoError(t, err)
	require.Positive(t, r.PID)
	require.Equal(t, []string{"--nnodes", "2", "train.py", "a b"}, r.Args)
	require.Equal(t, map[string]string{"KEEP_ME": "yes"}, r.Env)
	require.Equal(t, "2", r.Arg("--nnodes"))
	require.Empty(t, r.Arg("--missing"))

	_, err = Read(filepath.Join(dir, "absent"))
	require.Error(t, err)
}
