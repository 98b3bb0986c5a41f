package controller

import (
	"testing"

	"github.com/stretchr/testify/require"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// The round's index must follow js.round wherever it is replaced, or a
// report from a node of the new round would be taken for a stale one.
func TestMemberFollowsTheRound(t *testing.T) {
	round := func(nodes ...string) *rdzvv1.Round {
		r := &rdzvv1.Round{}
		for _, n := range nodes {
			r.Nodes = append(r.Nodes, &rdzvv1.NodeAssignment{Node: n})
		}
		return r
	}
	js := &jobState{}
	steps := []struct {
		name  string
		round *rdzvv1.Round
		in    []string
		notIn []string
	}{
		{"no round yet", nil, nil, []string{"a"}},
		{"first round", round("a", "b"), []string{"a", "b"}, []string{"c"}},
		{"next generation without b", round("a", "c"), []string{"a", "c"}, []string{"b"}},
		{"an empty round", round(), nil, []string{"a", "c"}},
		{"round dropped", nil, nil, []string{"a"}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			js.round = s.round
			for _, n := range s.in {
				require.True(t, js.member(n), "node %s", n)
			}
			for _, n := range s.notIn {
				require.False(t, js.member(n), "node %s", n)
			}
		})
	}
}

// findInRound's answer must not depend on where its search starts: the
// start is only a hint carried over from the previous search.
func TestFindInRound(t *testing.T) {
	r := &rdzvv1.Round{}
	for _, n := range []string{"a", "b", "c", "d"} {
		r.Nodes = append(r.Nodes, &rdzvv1.NodeAssignment{Node: n})
	}
	tests := []struct {
		name     string
		round    *rdzvv1.Round
		matching map[string]bool
		found    bool
		at       []string // where the search may stop, by start
	}{
		{"none", r, map[string]bool{}, false, nil},
		{"no round", nil, map[string]bool{"a": true}, false, nil},
		{"one", r, map[string]bool{"c": true}, true, []string{"c", "c", "c", "c", "c", "c"}},
		{"two", r, map[string]bool{"a": true, "c": true}, true, []string{"a", "c", "c", "a", "a", "c"}},
		{"all", r, map[string]bool{"a": true, "b": true, "c": true, "d": true}, true, []string{"a", "b", "c", "d", "a", "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Starts past the end wrap around, as after a smaller round.
			for start := range 6 {
				from := start
				found := findInRound(tt.round, &from, func(a *rdzvv1.NodeAssignment) bool { return tt.matching[a.GetNode()] })
				require.Equal(t, tt.found, found, "start %d", start)
				if found {
					require.Equal(t, tt.at[start], tt.round.GetNodes()[from].GetNode(), "start %d", start)
				}
			}
		})
	}
}

// The count of successes follows the round and its reports: counted once
// when the round is replaced, then kept per report, never twice for one
// node.
func TestSucceededCount(t *testing.T) {
	round := func(nodes ...string) *rdzvv1.Round {
		r := &rdzvv1.Round{}
		for _, n := range nodes {
			r.Nodes = append(r.Nodes, &rdzvv1.NodeAssignment{Node: n})
		}
		return r
	}
	succeeded := &rdzvv1.WorkerStatus{State: rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED}
	report := func(js *jobState, node string) {
		js.workers[node] = succeeded
		js.noteSucceeded()
	}
	// Loaded with one success already recorded, and one of a node no
	// longer in the round.
	js := &jobState{round: round("a", "b", "c"), workers: map[string]*rdzvv1.WorkerStatus{"a": succeeded, "z": succeeded}}
	report(js, "b") // before the first count: the count includes it
	require.Equal(t, 2, js.succeededCount())
	report(js, "c")
	require.Equal(t, 3, js.succeededCount())

	// The next generation: a new round and no reports yet.
	js.round, js.workers = round("a", "c"), map[string]*rdzvv1.WorkerStatus{}
	require.Zero(t, js.succeededCount())
	report(js, "c")
	require.Equal(t, 1, js.succeededCount())
}
