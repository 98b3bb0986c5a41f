package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
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
	crash(t, c) // dies without leaving: a crash or a cut link
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

// A member joining is a view change: the view's alive count is what makes
// the controller count a node's word on its peers, and the view a session
// sends first usually leaves before the join is done.
func TestGossipJoinChangesView(t *testing.T) {
	a, b := startGossip(t, "node-a"), startGossip(t, "node-b")
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	// Drained: what starting signalled is not what is tested.
	select {
	case <-a.Changed():
	default:
	}
	_, alive := a.View()
	require.Equal(t, 1, alive)
	b.Join([]string{a.Addr()})
	select {
	case <-a.Changed():
	case <-time.After(10 * time.Second):
		require.FailNow(t, "b joining was not signalled to a")
	}
	require.Eventually(t, func() bool { _, alive := a.View(); return alive == 2 }, 10*time.Second, 50*time.Millisecond)
}

// crash stops a member without a word to its peers, as a killed agent or a
// cut link does.
func crash(t *testing.T, g *Gossip) {
	t.Helper()
	g.out.closed.Store(true)
	require.NoError(t, g.ml.Shutdown())
	close(g.stop)
	<-g.done
}

// A node probes the peers it watches itself and reports one that stops
// answering, without waiting for memberlist (the three are not even
// members of one cluster here, so only the watch can tell). A peer that
// answers is never reported, and a node that reaches none of its watched
// peers counts itself isolated.
func TestGossipWatchReportsDeadPeer(t *testing.T) {
	a, b, c := startGossip(t, "node-a"), startGossip(t, "node-b"), startGossip(t, "node-c")
	t.Cleanup(a.Close)
	a.Watch("train", 3, []*rdzvv1.WatchedPeer{{Node: "node-b", GossipAddr: b.Addr()}, {Node: "node-c", GossipAddr: c.Addr()}, {Node: "node-a", GossipAddr: a.Addr()}})
	job, gen, down := a.WatchView()
	require.Equal(t, "train", job)
	require.EqualValues(t, 3, gen)
	require.Empty(t, down, "not probed yet")

	crash(t, c)
	require.Eventually(t, func() bool {
		u, _ := a.View()
		return len(u) > 0
	}, 30*time.Second, 20*time.Millisecond)
	u, _ := a.View()
	require.Equal(t, []string{"node-c"}, u, "node-b answered every probe that found node-c gone")
	_, _, down = a.WatchView()
	require.Equal(t, []string{"node-c"}, down)
	require.False(t, a.Unwatched(), "node-b answers")
	<-a.Changed()
	// Alone in its memberlist, a counts itself isolated whatever the watch
	// says; what the watch adds shows once a has a memberlist peer.
	d := startGossip(t, "node-d")
	t.Cleanup(d.Close)
	d.Join([]string{a.Addr()})
	require.Eventually(t, func() bool { _, alive := a.View(); return alive >= 2 }, 10*time.Second, 20*time.Millisecond)
	require.False(t, a.Isolated(), "a reaches node-b, one of its watched peers, and node-d")

	crash(t, b)
	require.Eventually(t, a.Isolated, 30*time.Second, 20*time.Millisecond)
	require.True(t, a.Unwatched(), "no watched peer answers")
	u, _ = a.View()
	require.Equal(t, []string{"node-b", "node-c"}, u)
	_, _, down = a.WatchView()
	require.Equal(t, []string{"node-b", "node-c"}, down)

	a.Watch("", 0, nil)
	u, _ = a.View()
	require.Empty(t, u, "no longer watched, no longer reported")
	require.False(t, a.Isolated(), "node-d still answers")
	require.False(t, a.Unwatched(), "watching nobody is not being cut off from them")
}
