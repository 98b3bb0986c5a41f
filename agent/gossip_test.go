package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
)

func startGossip(t *testing.T, name string) *Gossip {
	t.Helper()
	g, err := StartGossip(name, "127.0.0.1", 0, zaptest.NewLogger(t).Named(name))
	require.NoError(t, err)
	return g
}

// Three members find each other through one seed; when one dies without a
// word, the others report it unreachable within seconds, and only the
// member cut off from the rest counts itself isolated.
func TestGossipDetectsDeadMember(t *testing.T) {
	a, b, c := startGossip(t, "node-a"), startGossip(t, "node-b"), startGossip(t, "node-c")
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	require.True(t, a.Isolated(), "a lone member has no one to vouch for it")

	b.Join([]string{a.Addr()})
	c.Join([]string{a.Addr()})
	require.Eventually(t, func() bool {
		_, aliveA := a.View()
		_, aliveB := b.View()
		return aliveA == 3 && aliveB == 3
	}, 10*time.Second, 50*time.Millisecond)
	require.False(t, a.Isolated())

	started := time.Now()
	c.out.closed.Store(true)
	require.NoError(t, c.ml.Shutdown()) // dies without leaving: a crash or a cut link
	require.Eventually(t, func() bool {
		ua, _ := a.View()
		ub, _ := b.View()
		return len(ua) == 1 && ua[0] == "node-c" && len(ub) == 1 && ub[0] == "node-c"
	}, 15*time.Second, 50*time.Millisecond)
	t.Logf("dead member detected by both peers after %s", time.Since(started).Round(10*time.Millisecond))
	require.False(t, a.Isolated(), "a still reaches b: one of two peers")
	select {
	case <-a.Changed():
	default:
		require.Fail(t, "a view change is signalled")
	}
}
