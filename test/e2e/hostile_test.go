package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/test/hostile"
	"github.com/rdzv/rdzv/test/netns"
)

// Resident memory an attack may add to a daemon, at its peak, over what
// it held before. Without a valid certificate: the pre-authentication
// bounds of docs/security.md (at the controller, 256 unverified
// connections of about 200 KiB each), with room for the Go runtime's own.
// With one (an oversized register): a few messages of the API's 16 MiB in
// flight, decoded, and what the garbage collector has yet to reclaim.
const (
	hostileUnauthBound = 128 << 20
	hostileAuthBound   = 384 << 20
)

// TestHostilePeers runs each hostile peer of package hostile for a few
// seconds against the real controller and relay on loopback, prints the
// figures (make bench-hostile runs them longer), and checks that neither
// daemon's memory grew past its bound. Heartbeat latency is printed, not
// asserted: this machine's load is not the daemons'.
func TestHostilePeers(t *testing.T) {
	binDir := os.Getenv("RDZV_BIN_DIR")
	if binDir == "" {
		netns.SkipOrFail(t, "e2e: RDZV_BIN_DIR is not set: run `make e2e`, or `make build` and set RDZV_BIN_DIR to the bin directory")
	}
	abs, err := filepath.Abs(binDir)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := hostile.Start(ctx, hostile.Config{BinDir: abs, Dir: t.TempDir(), Duration: 3 * time.Second, Conns: 1000, Calls: 50})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	var figs []hostile.Figures
	for _, a := range c.Attacks() {
		f, err := c.Run(ctx, a)
		require.NoError(t, err, "%s\n%s", a.Name, c.Logs())
		figs = append(figs, f)
	}
	t.Logf("hostile peers, %s each:\n%s", 3*time.Second, hostile.Table(figs))
	for _, f := range figs {
		bound := uint64(hostileUnauthBound)
		if f.Authenticated {
			bound = hostileAuthBound
		}
		require.LessOrEqual(t, f.CtlPeak, f.CtlBefore+bound, "the controller's memory during %q", f.Attack)
		require.LessOrEqual(t, f.RelayPeak, f.RelayBefore+bound, "the relay's memory during %q", f.Attack)
	}
}
