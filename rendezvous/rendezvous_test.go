package rendezvous

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func node(name string, gpus int, labels map[string]string) Candidate {
	c := Candidate{Name: name, Labels: labels, Free: true, Address: "10.0.0." + name, Interface: "eth0"}
	for i := range gpus {
		c.GPUs = append(c.GPUs, uint32(i))
	}
	return c
}

func busy(c Candidate) Candidate { c.Free = false; return c }

func names(t *testing.T, placed []Placed) []string {
	out := make([]string, len(placed))
	for i, p := range placed {
		require.Equal(t, i, p.Rank)
		out[i] = p.Name
	}
	return out
}

func TestPlan(t *testing.T) {
	tests := []struct {
		name       string
		req        Requirements
		candidates []Candidate
		want       []string
		wantErr    error
	}{
		{
			name:       "sorted by name when no topology",
			req:        Requirements{Min: 2, Max: 3},
			candidates: []Candidate{node("c", 0, nil), node("a", 0, nil), node("b", 0, nil)},
			want:       []string{"a", "b", "c"},
		},
		{
			name: "topology groups before name",
			req:  Requirements{Min: 1, Max: 4},
			candidates: []Candidate{
				node("a", 0, map[string]string{TopologyLabel: "rack2"}),
				node("b", 0, map[string]string{TopologyLabel: "rack1"}),
				node("c", 0, map[string]string{TopologyLabel: "rack2"}),
				node("d", 0, map[string]string{TopologyLabel: "rack1"}),
			},
			want: []string{"b", "d", "a", "c"},
		},
		{
			name:       "capped at max",
			req:        Requirements{Min: 1, Max: 2},
			candidates: []Candidate{node("c", 0, nil), node("a", 0, nil), node("b", 0, nil)},
			want:       []string{"a", "b"},
		},
		{
			name:       "preferred nodes first when capped, ranked by name",
			req:        Requirements{Min: 1, Max: 2, Prefer: map[string]bool{"c": true, "d": true}},
			candidates: []Candidate{node("c", 0, nil), node("a", 0, nil), node("b", 0, nil)},
			want:       []string{"a", "c"},
		},
		{
			name:       "preference moot when all fit",
			req:        Requirements{Min: 1, Max: 3, Prefer: map[string]bool{"c": true}},
			candidates: []Candidate{node("c", 0, nil), node("a", 0, nil), node("b", 0, nil)},
			want:       []string{"a", "b", "c"},
		},
		{
			name:       "busy nodes skipped",
			req:        Requirements{Min: 2, Max: 3},
			candidates: []Candidate{busy(node("a", 0, nil)), node("b", 0, nil), node("c", 0, nil)},
			want:       []string{"b", "c"},
		},
		{
			name:       "too few gpus skipped",
			req:        Requirements{Min: 1, Max: 3, GPUsPerNode: 8},
			candidates: []Candidate{node("a", 4, nil), node("b", 8, nil)},
			want:       []string{"b"},
		},
		{
			name:       "selector must match every key",
			req:        Requirements{Min: 1, Max: 3, Selector: map[string]string{"pool": "train", "gpu": "a100"}},
			candidates: []Candidate{node("a", 0, map[string]string{"pool": "train"}), node("b", 0, map[string]string{"pool": "train", "gpu": "a100"})},
			want:       []string{"b"},
		},
		{
			name:       "below min",
			req:        Requirements{Min: 3, Max: 3},
			candidates: []Candidate{node("a", 0, nil), busy(node("b", 0, nil))},
			wantErr:    ErrNotEnoughNodes,
		},
		{
			name:    "no nodes",
			req:     Requirements{Min: 1, Max: 1},
			wantErr: ErrNotEnoughNodes,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			placed, err := Plan(tt.req, tt.candidates)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, names(t, placed))
		})
	}
}

func TestPlanIsDeterministicWhateverTheInputOrder(t *testing.T) {
	var nodes []Candidate
	for i := range 50 {
		nodes = append(nodes, node(fmt.Sprintf("n%02d", i), 0, map[string]string{TopologyLabel: fmt.Sprint(i % 5)}))
	}
	req := Requirements{Min: 1, Max: 50}
	first, err := Plan(req, nodes)
	require.NoError(t, err)
	reversed := make([]Candidate, len(nodes))
	for i, n := range nodes {
		reversed[len(nodes)-1-i] = n
	}
	second, err := Plan(req, reversed)
	require.NoError(t, err)
	require.Equal(t, names(t, first), names(t, second))
}

func TestPlanPicksLowestGPUIndices(t *testing.T) {
	c := Candidate{Name: "a", Free: true, GPUs: []uint32{7, 3, 5, 1}}
	placed, err := Plan(Requirements{Min: 1, Max: 1, GPUsPerNode: 2}, []Candidate{c})
	require.NoError(t, err)
	require.Equal(t, []uint32{1, 3}, placed[0].GPUIndices)
}

func TestExplain(t *testing.T) {
	req := Requirements{Min: 3, Max: 3, GPUsPerNode: 8, Selector: map[string]string{"pool": "train"}}
	got := Explain(req, []Candidate{
		node("a", 8, map[string]string{"pool": "train"}),
		busy(node("b", 8, map[string]string{"pool": "train"})),
		node("c", 4, map[string]string{"pool": "train"}),
		node("d", 8, map[string]string{"pool": "eval"}),
	})
	require.Equal(t, "1 of 4 nodes eligible, need 3 with 8 GPUs matching pool=train (1 busy or not ready, 1 with too few GPUs, 1 not matching the selector)", got)
}

func sick(c Candidate, why string) Candidate { c.Unhealthy = why; return c }

func TestExplainUnhealthy(t *testing.T) {
	req := Requirements{Min: 2, Max: 2}
	long := strings.Repeat("x", 300)
	cands := []Candidate{
		sick(node("e", 0, nil), "storage: /ckpt: 1.0 MiB free"),
		node("a", 0, nil),
		sick(node("d", 0, nil), "disk-check: exit status 1"),
		sick(busy(node("z", 0, nil)), "busy nodes count as busy"),
		sick(node("b", 0, nil), long),
		sick(node("c", 0, nil), "gpu: 7 GPUs present, expected 8"),
	}
	ok, why := Eligible(req, cands[0])
	require.False(t, ok)
	require.Equal(t, Unhealthy, why)
	require.Equal(t, 1, Count(req, cands))
	_, err := Plan(req, cands)
	require.ErrorIs(t, err, ErrNotEnoughNodes)
	want := "1 of 6 nodes eligible, need 2 (1 busy or not ready, 4 failing health checks [b: " + long[:200] + "...; " +
		"c: gpu: 7 GPUs present, expected 8; d: disk-check: exit status 1; +1 more])"
	require.Equal(t, want, Explain(req, cands))
	// The same nodes are named whatever the order they come in.
	slices.Reverse(cands)
	require.Equal(t, want, Explain(req, cands))
}

func TestLastCall(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	req := Requirements{Min: 2, Max: 4}
	window := 10 * time.Second
	type step struct {
		at       time.Duration
		eligible int
		commit   bool
		recheck  time.Duration // zero: expect no recheck time
	}
	tests := []struct {
		name  string
		steps []step
		// openAt, when set, opens the window before the first step (a
		// restarting job opens it at its failure); negative is before t0.
		openAt *time.Duration
	}{
		{"below min waits without deadline", []step{{0, 1, false, 0}, {time.Hour, 1, false, 0}}, nil},
		{"max commits at once", []step{{0, 4, true, 0}}, nil},
		{"min then last call expiry commits", []step{{0, 2, false, 10 * time.Second}, {5 * time.Second, 3, false, 10 * time.Second}, {10 * time.Second, 3, true, 0}}, nil},
		{"reaching max during last call commits early", []step{{0, 2, false, 10 * time.Second}, {3 * time.Second, 4, true, 0}}, nil},
		{"dropping below min resets the window", []step{{0, 2, false, 10 * time.Second}, {5 * time.Second, 1, false, 0}, {8 * time.Second, 2, false, 18 * time.Second}, {17 * time.Second, 2, false, 18 * time.Second}, {18 * time.Second, 2, true, 0}}, nil},
		{"opened a window ago commits at min", []step{{0, 2, true, 0}}, ptr(-window)},
		{"opened earlier waits only the rest", []step{{0, 2, false, 6 * time.Second}, {6 * time.Second, 2, true, 0}}, ptr(-4 * time.Second)},
		{"opened but below min starts over", []step{{0, 1, false, 0}, {time.Second, 2, false, 11 * time.Second}}, ptr(-window)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var lc LastCall
			if tt.openAt != nil {
				lc.OpenAt(t0.Add(*tt.openAt))
				lc.OpenAt(t0) // an open window is not moved
			}
			for i, s := range tt.steps {
				d := lc.Observe(t0.Add(s.at), s.eligible, req, window)
				require.Equal(t, s.commit, d.Commit, "step %d: %s", i, d.Reason)
				require.NotEmpty(t, d.Reason)
				if s.recheck == 0 {
					require.True(t, d.RecheckAt.IsZero(), "step %d", i)
				} else {
					require.Equal(t, t0.Add(s.recheck), d.RecheckAt, "step %d", i)
				}
			}
		})
	}
}

func ptr(d time.Duration) *time.Duration { return &d }

func TestLastCallZeroWindowCommitsAtMin(t *testing.T) {
	var lc LastCall
	d := lc.Observe(time.Now(), 2, Requirements{Min: 2, Max: 5}, 0)
	require.True(t, d.Commit)
}

// BenchmarkPlan sweeps cluster size; compare ns/op across sizes: 10x the
// nodes should cost about 10x (n log n), never 100x.
func BenchmarkPlan(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		nodes := make([]Candidate, n)
		for i := range nodes {
			nodes[i] = node(fmt.Sprintf("node-%05d", i), 8, map[string]string{TopologyLabel: fmt.Sprintf("rack%03d", i%250), "pool": "train"})
		}
		req := Requirements{Min: n / 10, Max: n / 2, GPUsPerNode: 8, Selector: map[string]string{"pool": "train"}}
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Plan(req, nodes); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestGPUWarning(t *testing.T) {
	gpu := func(name string, n int, labels map[string]string) Candidate {
		c := Candidate{Name: name, Labels: labels}
		for i := range n {
			c.GPUs = append(c.GPUs, uint32(i))
		}
		return c
	}
	nodes := []Candidate{gpu("a", 8, map[string]string{"pool": "gpu"}), gpu("b", 4, map[string]string{"pool": "gpu"}), gpu("c", 0, map[string]string{"pool": "cpu"})}
	for _, tt := range []struct {
		name string
		req  Requirements
		want string // in the warning; "" for none
	}{
		{"left out on GPU nodes", Requirements{Min: 1}, "2 of the 3 nodes the job may run on have GPUs (up to 8 each)"},
		{"asked for", Requirements{Min: 1, GPUsPerNode: 4}, ""},
		{"CPU pool", Requirements{Min: 1, Selector: map[string]string{"pool": "cpu"}}, ""},
		{"GPU pool", Requirements{Min: 1, Selector: map[string]string{"pool": "gpu"}}, "2 of the 2 nodes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := GPUWarning(tt.req, nodes)
			if tt.want == "" {
				require.Empty(t, got)
				return
			}
			require.Contains(t, got, tt.want)
			require.Contains(t, got, "gpus_per_node")
		})
	}
	require.Empty(t, GPUWarning(Requirements{Min: 1}, nil))
}

func TestGrow(t *testing.T) {
	busy := node("busy", 8, nil)
	busy.Free = false
	other := node("other", 8, map[string]string{"pool": "eval"})
	for _, tt := range []struct {
		name    string
		running int
		max     int
		sel     map[string]string
		cands   []Candidate
		to      int
		ok      bool
	}{
		{"one joins", 2, 3, nil, []Candidate{node("c", 8, nil)}, 3, true},
		{"capped at max", 1, 3, nil, []Candidate{node("c", 8, nil), node("d", 8, nil), node("e", 8, nil)}, 3, true},
		{"at max already", 3, 3, nil, []Candidate{node("c", 8, nil)}, 3, false},
		{"none free", 2, 3, nil, []Candidate{busy}, 2, false},
		{"selector mismatch", 2, 3, map[string]string{"pool": "train"}, []Candidate{other}, 2, false},
		{"too few GPUs", 2, 3, nil, []Candidate{node("small", 4, nil)}, 2, false},
		{"nothing", 2, 4, nil, nil, 2, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := Requirements{Min: 1, Max: tt.max, GPUsPerNode: 8, Selector: tt.sel}
			to, ok := Grow(req, tt.running, tt.cands)
			require.Equal(t, tt.ok, ok)
			require.Equal(t, tt.to, to)
		})
	}
}
