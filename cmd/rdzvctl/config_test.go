package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/internal/testaddr"
)

// Contexts: made, listed and chosen with rdzvctl config; a setting comes
// from its flag, its environment variable, the context, the default, in
// that order; a bad config file is refused at its line and column.
func TestConfigGolden(t *testing.T) {
	stableEnv(t)
	_, addr := startPagedServer(t)
	down := testaddr.Free(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "rdzv", "config.yaml")
	t.Setenv("RDZV_CONFIG", path)
	step := func(name string, args ...string) {
		t.Helper()
		out := runGoldenIO(nil, args...)
		for from, to := range map[string]string{dir: "CONFIG_DIR", addr: "ADDR", down: "DOWN"} {
			out = strings.ReplaceAll(out, from, to)
		}
		golden(t, filepath.Join("config", name+".golden"), out)
	}
	file := func(name string) {
		t.Helper()
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		golden(t, filepath.Join("config", name+".golden"), strings.NewReplacer(dir, "CONFIG_DIR", addr, "ADDR", down, "DOWN").Replace(string(data)))
	}

	step("no-file-get-contexts", "config", "get-contexts")
	step("no-file-current-context", "config", "current-context")
	step("set-context-nothing", "config", "set-context", "lab")
	step("set-context-lab", "config", "set-context", "lab", "--controller", "127.0.0.1:7070", "--insecure", "--timeout", "30s")
	step("set-context-prod", "config", "set-context", "prod", "--controller", "ctl-1.example:7070,ctl-2.example:7070", "--tls-dir", "~/.rdzv/prod")
	step("use-context-unknown", "config", "use-context", "staging")
	step("use-context-lab", "config", "use-context", "lab")
	file("file-after-set")
	step("get-contexts", "config", "get-contexts")
	step("get-contexts-wide", "config", "get-contexts", "-o", "wide")
	step("get-contexts-json", "config", "get-contexts", "-o", "json")
	step("get-contexts-name", "config", "get-contexts", "-o", "name")
	step("current-context", "config", "current-context")

	// The context in use answers; each stronger source wins over it.
	step("set-context-change", "config", "set-context", "lab", "--controller", addr)
	step("list-from-context", "list", "-o", "name")
	step("flag-overrides-context", "--controller", down, "list", "-o", "name")
	t.Run("env", func(t *testing.T) {
		t.Setenv("RDZV_CONTROLLER", down)
		step("env-overrides-context", "list", "-o", "name")
	})
	step("context-flag", "--context", "prod", "--timeout", "1s", "list", "-o", "name")
	t.Run("context-env", func(t *testing.T) {
		t.Setenv("RDZV_CONTEXT", "prod")
		step("context-env", "config", "current-context")
	})
	step("context-unknown", "--context", "staging", "list")

	// A relative --tls-dir is made absolute: the file's own relative paths
	// are relative to the file.
	t.Chdir(dir)
	step("set-context-relative-tls-dir", "config", "set-context", "prod", "--tls-dir", "certs/prod2")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Contains(t, string(data), "tls_dir: "+filepath.Join(dir, "certs", "prod2")+"\n")

	// use-context keeps the file's comments.
	require.NoError(t, os.WriteFile(path, []byte("# my clusters\ncurrent_context: lab # the lab\ncontexts:\n  # the lab box\n  - name: lab\n    controller: "+addr+"\n    insecure: true\n  - name: prod\n    controller: "+down+"\n"), 0o600))
	step("use-context-prod", "config", "use-context", "prod")
	file("file-comments-kept")

	for _, tt := range []struct{ name, body string }{
		{"bad-unknown-field", "current_context: lab\ncontexts:\n  - name: lab\n    controler: 10.0.0.1:7070\n"},
		{"bad-controller", "contexts:\n  - name: lab\n    controller: 10.0.0.1\n"},
		{"bad-duplicate", "contexts:\n  - name: lab\n  - name: lab\n"},
		{"bad-current", "current_context: prod\ncontexts:\n  - name: lab\n"},
		{"bad-type", "contexts:\n  - name: lab\n    insecure: maybe\n"},
		{"bad-name", "contexts:\n  - name: Lab_1\n"},
		{"bad-yaml", "contexts: [\n"},
	} {
		require.NoError(t, os.WriteFile(path, []byte(tt.body), 0o600))
		step(tt.name, "list")
	}
}
