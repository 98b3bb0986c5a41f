//go:build bench

package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The measurements the report is made of, on hand-made ticks (no hosts, no
// root): what counts as torchft's recovery, as useful steps, and as steps
// recomputed.
func TestMeasures(t *testing.T) {
	t0 := time.Unix(100, 0)
	k := func(line string) tick {
		t.Helper()
		got, ok := parseTick(line)
		require.True(t, ok, line)
		return got
	}

	t.Run("parse", func(t *testing.T) {
		got := k("TICK host=h2 pid=7 started=90.5 gen=r0 rank=1 world=3 step=51 t=101.25 quorum=3 participants=2")
		require.Equal(t, tick{host: "h2", pid: 7, started: 90.5, gen: "r0", rank: "1", world: 3, step: 51, t: 101.25, quorum: 3, participants: 2}, got)
		require.Equal(t, 2, got.width())
		old := k("TICK host=h1 pid=7 started=90 gen=1 rank=0 step=5 t=99")
		require.Equal(t, -1, old.quorum)
		require.Equal(t, nodeHosts, old.width())
		_, ok := parseTick("TICK host=h1 step=x t=1")
		require.False(t, ok)
	})

	t.Run("torchft recovery is the first step of a newer quorum", func(t *testing.T) {
		ticks := []tick{
			k("TICK host=h1 pid=1 started=90 gen=r0 rank=0 step=50 t=99.9 quorum=2 participants=3"),
			k("TICK host=h1 pid=1 started=90 gen=r0 rank=0 step=51 t=100.2 quorum=2 participants=3"), // in flight at the fault
			k("TICK host=h2 pid=2 started=90 gen=r0 rank=0 step=52 t=101.5 quorum=3 participants=2"),
			k("TICK host=h1 pid=1 started=90 gen=r0 rank=0 step=52 t=101.4 quorum=3 participants=2"),
		}
		got, ok := firstQuorumTickAfter(ticks, t0)
		require.True(t, ok)
		require.Equal(t, 101.4, got.t)
		_, ok = firstQuorumTickAfter(ticks[:2], t0)
		require.False(t, ok)
	})

	t.Run("recomputed steps", func(t *testing.T) {
		ticks := []tick{
			k("TICK host=h1 pid=1 started=90 gen=1 rank=0 step=50 t=99.5"),
			k("TICK host=h2 pid=2 started=90 gen=1 rank=1 step=51 t=99.9"),
			k("TICK host=h2 pid=3 started=101 gen=2 rank=1 step=41 t=104"),
		}
		r := result{first: ticks[2]}
		r.setRecomputed(ticks, t0)
		require.True(t, r.hasRecomputed)
		require.Equal(t, 11, r.recomputed) // 41..51 done again
	})

	t.Run("useful steps weigh width and count a redone step once", func(t *testing.T) {
		ticks := []tick{
			k("TICK host=h1 pid=1 started=90 gen=1 rank=0 world=3 step=10 t=99"),
			k("TICK host=h1 pid=1 started=90 gen=1 rank=0 world=3 step=11 t=101"),
			k("TICK host=h1 pid=1 started=90 gen=1 rank=0 world=3 step=12 t=102"),
			// resumed from step 10 on two nodes: 11 and 12 again, then 13
			k("TICK host=h1 pid=2 started=103 gen=2 rank=0 world=2 step=11 t=104"),
			k("TICK host=h1 pid=2 started=103 gen=2 rank=0 world=2 step=12 t=105"),
			k("TICK host=h1 pid=2 started=103 gen=2 rank=0 world=2 step=13 t=106"),
			k("TICK host=h1 pid=2 started=103 gen=2 rank=0 world=2 step=14 t=200"), // after the end
		}
		require.InDelta(t, 2.0, usefulSteps(ticks, t0, time.Unix(110, 0)), 1e-9) // 3 steps at 2/3 width
	})

	t.Run("paired goodput: fault windows over the fault-free ones, and their width", func(t *testing.T) {
		ticks := []tick{
			k("TICK host=h1 pid=1 started=90 gen=1 rank=0 world=3 step=10 t=101"),
			k("TICK host=h1 pid=2 started=103 gen=2 rank=0 world=2 step=11 t=104"),
			k("TICK host=h1 pid=2 started=103 gen=2 rank=0 world=3 step=12 t=112"),
		}
		require.False(t, fullWidth(ticks, t0, time.Unix(110, 0)), "step 11 ran on 2 nodes")
		require.True(t, fullWidth(ticks, time.Unix(110, 0), time.Unix(120, 0)))
		// Three pairs of one kind and one of another: each kind weighs
		// alike, not each pair.
		g := goodputRun{pairs: []goodputPair{
			{kind: "kill-worker", fault: 10, clean: 10},
			{kind: "kill-worker", fault: 10, clean: 10},
			{kind: "hang", fault: 8, clean: 10},
			{kind: "kill-worker", fault: 10, clean: 10},
		}}
		byKind, ratio := g.pairedGoodput()
		require.Equal(t, map[string]float64{"kill-worker": 1.0, "hang": 0.8}, byKind)
		require.InDelta(t, 0.9, ratio, 1e-9)
		_, ratio = goodputRun{}.pairedGoodput()
		require.Zero(t, ratio, "no pairs, no figure")
	})
}
