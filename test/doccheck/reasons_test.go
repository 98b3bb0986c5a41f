package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTroubleshootingExplainsEveryReason fails when the controller can
// record an event kind, or fail an attempt or a job with a reason, that
// docs/troubleshooting.md does not explain in one of its tables. The kinds
// and reasons are read from where the code declares them:
//   - event kinds: controller's Event* constants (rdzvv1.Event.kind);
//   - failure reasons: controller's cause* constants, the reason label of
//     rdzv_attempts_failed_total and the cause in attempt_failed;
//   - failure classes: wire's Failure* constants, which an agent reports
//     and the controller fails the job with.
func TestTroubleshootingExplainsEveryReason(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(root, "docs", "troubleshooting.md"))
	require.NoError(t, err)
	documented := TableKeys(string(doc))

	for _, tc := range []struct {
		what    string
		dirs    []string
		pattern string
		// section is the heading of docs/troubleshooting.md whose table
		// lists them, and nothing else.
		section string
		// atLeast guards against the declarations moving or being renamed,
		// which would make this test check nothing.
		atLeast int
	}{
		// A job's lifecycle events are declared in controller/lifecycle;
		// controller's constants of the same names only refer to them.
		{"event kind", []string{"controller", "controller/lifecycle"}, `^Event[A-Z]`, "Event kinds", 28},
		{"failure reason", []string{"controller"}, `^cause[A-Z]`, "Failure reasons", 6},
		{"failure class", []string{"wire"}, `^Failure[A-Z]`, "Failure classes: a job that cannot start on a node", 4},
	} {
		t.Run(tc.what, func(t *testing.T) {
			consts := map[string]string{}
			for _, dir := range tc.dirs {
				found, err := StringConsts(filepath.Join(root, dir), regexp.MustCompile(tc.pattern))
				require.NoError(t, err)
				for value, name := range found {
					consts[value] = dir + "." + name
				}
			}
			require.GreaterOrEqual(t, len(consts), tc.atLeast, "%s constants matching %s in %v", tc.what, tc.pattern, tc.dirs)
			var missing []string
			for value, name := range consts {
				if !documented[value] {
					missing = append(missing, value+" ("+name+")")
				}
			}
			sort.Strings(missing)
			require.Empty(t, missing, "each %s needs a row `| `kind` | what it means | what to do |` in docs/troubleshooting.md", tc.what)

			// The other way round: the section's table lists only what the
			// code records, so a removed kind leaves no stale row behind.
			var stale []string
			for key := range TableKeys(Section(string(doc), tc.section)) {
				if _, ok := consts[key]; !ok {
					stale = append(stale, key)
				}
			}
			sort.Strings(stale)
			require.Empty(t, stale, "docs/troubleshooting.md, %q, lists what no %s constant in %v declares", tc.section, tc.what, tc.dirs)
		})
	}
}

func TestStringConsts(t *testing.T) {
	dir := t.TempDir()
	src := "package p\n\nconst (\n\tEventA = \"a\"\n\tEventB, other = \"b\", \"x\"\n\tnotEvent = \"c\"\n\tEventN = 3\n)\n\nconst EventD = `d`\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "p_test.go"), []byte("package p\n\nconst EventT = \"t\"\n"), 0o644))
	got, err := StringConsts(dir, regexp.MustCompile(`^Event[A-Z]`))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"a": "EventA", "b": "EventB", "d": "EventD"}, got)
}

func TestSection(t *testing.T) {
	doc := "# T\n## A\na1\n### A.1\na2\n```\n## code\n```\n## B\nb\n"
	require.Equal(t, "a1", Section(doc, "A"))
	require.Equal(t, "a2\n```\n## code\n```", Section(doc, "A.1"))
	require.Equal(t, "b\n", Section(doc, "B"))
	require.Empty(t, Section(doc, "C"))
}

func TestTableKeys(t *testing.T) {
	doc := "| kind | meaning |\n| --- | --- |\n| `node_lost` | a node was lost |\n|`job_failed`| failed |\nprose `worker_exit` |\n| plain | no code |\n"
	require.Equal(t, map[string]bool{"node_lost": true, "job_failed": true}, TableKeys(doc))
}
