package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra/doc"
	"github.com/stretchr/testify/require"
)

// docsDir holds the generated CLI reference (make docs).
const docsDir = "../../docs/cli"

// The committed CLI reference is what the command tree says now.
func TestCLIDocs(t *testing.T) {
	stableEnv(t)
	c := &command{globals: defaultGlobals()}
	root := c.root()
	root.DisableAutoGenTag = true
	dir := t.TempDir()
	require.NoError(t, doc.GenMarkdownTree(root, dir))
	generated, err := os.ReadDir(dir)
	require.NoError(t, err)
	if *update {
		require.NoError(t, os.RemoveAll(docsDir))
		require.NoError(t, os.MkdirAll(docsDir, 0o755))
	}
	committed, err := os.ReadDir(docsDir)
	require.NoError(t, err)
	if !*update {
		var want, got []string
		for _, e := range generated {
			want = append(want, e.Name())
		}
		for _, e := range committed {
			got = append(got, e.Name())
		}
		require.Equal(t, want, got, "docs/cli is stale: run make docs")
	}
	for _, e := range generated {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		path := filepath.Join(docsDir, e.Name())
		if *update {
			require.NoError(t, os.WriteFile(path, data, 0o644))
			continue
		}
		onDisk, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, string(data), string(onDisk), "%s is stale: run make docs", path)
	}
}
