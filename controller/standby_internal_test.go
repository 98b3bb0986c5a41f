package controller

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/rendezvous"
)

// Idle nodes keep one standby each, for a running warm job they could
// join: the one they kept while still eligible, else the job with the
// fewest, oldest first on a tie; never a spare's node, a busy, cordoned or
// unhealthy one, or one matching no job.
func TestPlaceIdleStandbys(t *testing.T) {
	free := func(name string, labels map[string]string) rendezvous.Candidate {
		return rendezvous.Candidate{Name: name, Free: true, Labels: labels, GPUs: []uint32{0, 1}}
	}
	pool := func(p string) map[string]string { return map[string]string{"pool": p} }
	a := standbyJob{name: "a", req: rendezvous.Requirements{Min: 1, Max: 1}}
	b := standbyJob{name: "b", req: rendezvous.Requirements{Min: 1, Max: 1}}
	bigB := standbyJob{name: "b", req: rendezvous.Requirements{Min: 1, Max: 1, GPUsPerNode: 4}}
	onlyX := standbyJob{name: "x", req: rendezvous.Requirements{Min: 1, Max: 1, Selector: pool("x")}}
	busy := free("busy", nil)
	busy.Free = false
	cordoned := free("cordoned", nil)
	cordoned.Cordoned = true
	sick := free("sick", nil)
	sick.Unhealthy = "disk full"
	tests := []struct {
		name       string
		jobs       []standbyJob
		candidates []rendezvous.Candidate
		held, kept map[string]string
		want       map[string]string
	}{
		{"no warm job", nil, []rendezvous.Candidate{free("n1", nil)}, nil, nil, map[string]string{}},
		{"one job takes every idle node", []standbyJob{a}, []rendezvous.Candidate{free("n2", nil), free("n1", nil)}, nil, nil,
			map[string]string{"n1": "a", "n2": "a"}},
		{"only idle, healthy, uncordoned nodes", []standbyJob{a}, []rendezvous.Candidate{busy, cordoned, sick, free("n1", nil)}, nil, nil,
			map[string]string{"n1": "a"}},
		{"spares are their holder's", []standbyJob{a, b}, []rendezvous.Candidate{free("n1", nil), free("n2", nil), free("n3", nil)},
			map[string]string{"n1": "a"}, nil, map[string]string{"n2": "b", "n3": "a"}},
		{"fewest first, oldest on a tie, in name order", []standbyJob{a, b}, []rendezvous.Candidate{free("n3", nil), free("n1", nil), free("n2", nil)}, nil, nil,
			map[string]string{"n1": "a", "n2": "b", "n3": "a"}},
		{"selector decides", []standbyJob{a, onlyX}, []rendezvous.Candidate{free("n1", pool("x")), free("n2", pool("y")), free("n3", pool("x"))}, nil, nil,
			map[string]string{"n1": "a", "n2": "a", "n3": "x"}},
		{"gpus decide", []standbyJob{bigB}, []rendezvous.Candidate{free("n1", nil)}, nil, nil, map[string]string{}},
		{"kept while eligible, however lopsided", []standbyJob{a, b}, []rendezvous.Candidate{free("n1", nil), free("n2", nil)}, nil,
			map[string]string{"n1": "b", "n2": "b"}, map[string]string{"n1": "b", "n2": "b"}},
		{"kept for a job gone is placed again", []standbyJob{a}, []rendezvous.Candidate{free("n1", nil)}, nil,
			map[string]string{"n1": "gone"}, map[string]string{"n1": "a"}},
		{"kept on a node now busy is dropped", []standbyJob{a}, []rendezvous.Candidate{busy}, nil,
			map[string]string{"busy": "a"}, map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, placeIdleStandbys(tt.jobs, tt.candidates, tt.held, tt.kept))
		})
	}
}

// Whatever order the nodes come in, the placement is the same, and it
// spreads the idle nodes evenly over the jobs they match.
func TestPlaceIdleStandbysIsDeterministicAndEven(t *testing.T) {
	var nodes []rendezvous.Candidate
	for i := range 1000 {
		nodes = append(nodes, rendezvous.Candidate{Name: fmt.Sprintf("n%04d", i), Free: true})
	}
	jobs := []standbyJob{{name: "a"}, {name: "b"}, {name: "c"}}
	want := placeIdleStandbys(jobs, nodes, nil, nil)
	reversed := make([]rendezvous.Candidate, len(nodes))
	for i, n := range nodes {
		reversed[len(nodes)-1-i] = n
	}
	require.Equal(t, want, placeIdleStandbys(jobs, reversed, nil, nil))
	count := map[string]int{}
	for _, job := range want {
		count[job]++
	}
	require.Equal(t, map[string]int{"a": 334, "b": 333, "c": 333}, count)
}
