package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// logStart skips older runs of a reused job name, starts --since at the
// generation running then, and counts --tail in lines.
func TestLogStart(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 600_000_000, time.UTC)
	marker := func(gen int, at time.Time) string {
		return "=== rdzv: job train generation " + string(rune('0'+gen)) + " node n rank 0/1 started " + at.Format(time.RFC3339Nano) + ": torchrun x\n"
	}
	oldRun := marker(1, t0) + "old a\nold b\n"
	gen1 := marker(1, t0.Add(time.Minute)) + "new a\nnew b\n"
	gen2 := marker(2, t0.Add(2*time.Minute)) + "new c\n" + strings.Repeat("x", 3*logChunkBytes) + "\nnew d"
	body := oldRun + gen1 + gen2
	path := filepath.Join(t.TempDir(), "train.log")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	ts := timestamppb.New
	tests := []struct {
		name string
		req  *rdzvv1.LogTail
		want string
	}{
		{"whole log", &rdzvv1.LogTail{}, body},
		{"current run only", &rdzvv1.LogTail{RunCreatedAt: ts(t0.Add(time.Second))}, gen1 + gen2},
		{"run created within the old run's second", &rdzvv1.LogTail{RunCreatedAt: ts(t0.Add(time.Millisecond))}, gen1 + gen2},
		{"run with no generation here yet", &rdzvv1.LogTail{RunCreatedAt: ts(t0.Add(time.Hour))}, ""},
		{"since inside generation 1", &rdzvv1.LogTail{Since: ts(t0.Add(90 * time.Second))}, gen1 + gen2},
		{"since after generation 2 started", &rdzvv1.LogTail{Since: ts(t0.Add(time.Hour))}, gen2},
		{"since before everything", &rdzvv1.LogTail{Since: ts(t0.Add(-time.Hour))}, body},
		{"tail lines, unterminated last line", &rdzvv1.LogTail{TailLines: 2}, strings.Repeat("x", 3*logChunkBytes) + "\nnew d"},
		{"tail lines bounded by the run", &rdzvv1.LogTail{TailLines: 100, RunCreatedAt: ts(t0.Add(time.Second))}, gen1 + gen2},
		{"tail bytes", &rdzvv1.LogTail{TailBytes: 5}, "new d"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := os.Open(path)
			require.NoError(t, err)
			defer f.Close()
			start, err := logStart(f, tt.req)
			require.NoError(t, err)
			require.Equal(t, tt.want, body[start:])
		})
	}

	terminated := filepath.Join(t.TempDir(), "t.log")
	require.NoError(t, os.WriteFile(terminated, []byte("a\nb\nc\n"), 0o600))
	f, err := os.Open(terminated)
	require.NoError(t, err)
	defer f.Close()
	start, err := logStart(f, &rdzvv1.LogTail{TailLines: 2})
	require.NoError(t, err)
	require.Equal(t, int64(2), start, "a final newline ends the last line")
}
