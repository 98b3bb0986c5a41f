package doccheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// markdownFiles lists README.md and every Markdown file under docs/,
// relative to root.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	require.NoError(t, err)
	return files
}

// TestDocLinks fails on any relative link or #anchor in README.md and
// docs/ that does not resolve; `make lint` runs it.
func TestDocLinks(t *testing.T) {
	files := markdownFiles(t)
	require.Greater(t, len(files), 10, "README.md and docs/*.md")
	for _, err := range Check(root, files) {
		t.Error(err)
	}
}

// TestReadmeIsShort keeps README.md an introduction: everything else
// belongs in docs/.
func TestReadmeIsShort(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	n := strings.Count(string(data), "\n")
	require.LessOrEqual(t, n, 250, "README.md has %d lines; move detail into docs/ (index: docs/README.md)", n)
}

func TestSlug(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"Why did my job restart?", "why-did-my-job-restart"},
		{"Workers' user and sandboxing", "workers-user-and-sandboxing"},
		{"FSDP (torch 2.x `fully_shard`)", "fsdp-torch-2x-fully_shard"},
		{"The agent's sandbox: checkpoint and dataset directories", "the-agents-sandbox-checkpoint-and-dataset-directories"},
		{"DeepSpeed ZeRO-2 and ZeRO-3 (`launcher.kind: deepspeed`)", "deepspeed-zero-2-and-zero-3-launcherkind-deepspeed"},
		{"Soak benchmark: false positives of the failure detector", "soak-benchmark-false-positives-of-the-failure-detector"},
		{"A [linked](x.md) **bold** heading", "a-linked-bold-heading"},
		{"rdzv-controller", "rdzv-controller"},
	} {
		t.Run(tc.heading, func(t *testing.T) {
			require.Equal(t, tc.want, Slug(tc.heading))
		})
	}
}

func TestAnchorsNumberRepeatedHeadings(t *testing.T) {
	doc := "# Title\n## Tests\n```\n## not a heading\n```\n### Tests\n<a name=\"custom\"></a>\n"
	require.Equal(t, map[string]bool{"title": true, "tests": true, "tests-1": true, "custom": true}, Anchors(doc))
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	write("docs/a.md", "# A\n## Part one\n")
	write("docs/pic.png", "")
	for _, tc := range []struct {
		name, doc string
		errs      []string
	}{
		{"good", "[a](docs/a.md) [p](docs/a.md#part-one) [self](#top) [web](https://example.com/x#y) ![i](docs/pic.png) [d](docs)\n# Top\n", nil},
		{"missing file", "[x](docs/b.md)\n", []string{`link "docs/b.md": docs/b.md does not exist`}},
		{"missing anchor", "[x](docs/a.md#part-two)\n", []string{"no heading in a.md has the anchor #part-two"}},
		{"missing own anchor", "[x](#nowhere)\n", []string{"anchor #nowhere"}},
		{"anchor into a non-Markdown file", "[x](docs/pic.png#a)\n", []string{"not a Markdown file"}},
		{"code is not a link", "`[x](nowhere.md)`\n```\n[x](nowhere.md)\n```\n", nil},
		{"reference definition", "[x]: docs/none.md\n", []string{"docs/none.md does not exist"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			write("README.md", tc.doc)
			errs := Check(dir, []string{"README.md"})
			require.Len(t, errs, len(tc.errs), "%v", errs)
			for i, want := range tc.errs {
				require.ErrorContains(t, errs[i], want)
			}
		})
	}
}
