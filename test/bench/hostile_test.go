//go:build bench

package bench

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/test/hostile"
)

// TestBenchHostile (make bench-hostile) runs each hostile peer of package
// hostile for HOSTILE_DURATION (default 30s) against the real controller
// and relay on loopback, and prints what each cost: both daemons' memory
// before, at its peak and after, and the real agents' heartbeat round
// trips during it. Figures only.
func TestBenchHostile(t *testing.T) {
	binDir := os.Getenv("RDZV_BIN_DIR")
	if binDir == "" {
		t.Skip("RDZV_BIN_DIR is not set: run make bench-hostile")
	}
	abs, err := filepath.Abs(binDir)
	require.NoError(t, err)
	d := 30 * time.Second
	if v := os.Getenv("HOSTILE_DURATION"); v != "" {
		d, err = time.ParseDuration(v)
		require.NoError(t, err, "HOSTILE_DURATION")
	}
	conns := 1000
	if v := os.Getenv("HOSTILE_CONNS"); v != "" {
		conns, err = strconv.Atoi(v)
		require.NoError(t, err, "HOSTILE_CONNS")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	c, err := hostile.Start(ctx, hostile.Config{BinDir: abs, Dir: t.TempDir(), Duration: d, Conns: conns, Calls: 50})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	var figs []hostile.Figures
	for _, a := range c.Attacks() {
		f, err := c.Run(ctx, a)
		require.NoError(t, err, "%s\n%s", a.Name, c.Logs())
		t.Logf("%s done", a.Name)
		figs = append(figs, f)
	}
	t.Logf("hostile peers, %s each:\n%s", d, hostile.Table(figs))
}
