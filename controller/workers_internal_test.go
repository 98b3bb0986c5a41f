package controller

import (
	"fmt"
	"testing"

	"github.com/jonboulle/clockwork"
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

// The counts follow the round and its reports: counted once when the
// round is replaced, then kept per report, never twice for one node.
func TestStateCount(t *testing.T) {
	succeeded := &rdzvv1.WorkerStatus{State: rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED}
	report := func(js *jobState, node string) {
		js.workers[node] = succeeded
		js.succeeded.note(js)
	}
	count := func(js *jobState) int { return js.succeeded.get(js, rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED) }
	// Loaded with one success already recorded, and one of a node no
	// longer in the round.
	js := &jobState{round: testRound("a", "b", "c"), workers: map[string]*rdzvv1.WorkerStatus{"a": succeeded, "z": succeeded}}
	report(js, "b") // before the first count: the count includes it
	require.Equal(t, 2, count(js))
	report(js, "c")
	require.Equal(t, 3, count(js))

	// The next generation: a new round and no reports yet.
	js.round, js.workers = testRound("a", "c"), map[string]*rdzvv1.WorkerStatus{}
	require.Zero(t, count(js))
	report(js, "c")
	require.Equal(t, 1, count(js))
}

func testRound(nodes ...string) *rdzvv1.Round {
	r := &rdzvv1.Round{Generation: 1}
	for _, n := range nodes {
		r.Nodes = append(r.Nodes, &rdzvv1.NodeAssignment{Node: n})
	}
	return r
}

// A generation's reports add two events in all (every worker running,
// every worker exited), and one per failed node up to maxFailureEvents;
// the phase events say how many nodes and how their workers ended.
func TestWorkerEvents(t *testing.T) {
	many := make([]string, maxFailureEvents+3)
	for i := range many {
		many[i] = fmt.Sprintf("n%02d", i)
	}
	type report struct {
		node  string
		state rdzvv1.WorkerState
		// kinds are the events it adds, message the last one's.
		kinds   []string
		message string
	}
	var (
		running   = rdzvv1.WorkerState_WORKER_STATE_RUNNING
		assigned  = rdzvv1.WorkerState_WORKER_STATE_ASSIGNED
		stopped   = rdzvv1.WorkerState_WORKER_STATE_STOPPED
		failed    = rdzvv1.WorkerState_WORKER_STATE_FAILED
		succeeded = rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED
	)
	manyFail := func() []report {
		var rs []report
		for i, n := range many {
			r := report{node: n, state: failed, kinds: []string{EventWorkerFailed}, message: "workers on " + n + " exited with code 1"}
			if i >= maxFailureEvents {
				r.kinds, r.message = nil, ""
			}
			if i == len(many)-1 {
				r.kinds = []string{EventWorkersExited}
				r.message = fmt.Sprintf("generation 1: workers exited on all %d nodes: %d failed (the first %d listed in worker_failed events, 3 not)", len(many), len(many), maxFailureEvents)
			}
			rs = append(rs, r)
		}
		return rs
	}
	tests := []struct {
		name    string
		nodes   []string
		loaded  map[string]rdzvv1.WorkerState // as a controller taking over finds them
		reports []report
	}{
		{"runs and succeeds", []string{"a", "b"}, nil, []report{
			{"a", assigned, nil, ""},
			{"a", running, nil, ""},
			{"b", running, []string{EventWorkersRunning}, "generation 1: workers running on all 2 nodes"},
			{"b", succeeded, nil, ""},
			{"a", succeeded, []string{EventWorkersExited}, "generation 1: workers exited on all 2 nodes: 2 succeeded"},
		}},
		{"one fails, the rest are stopped", []string{"a", "b", "c"}, nil, []report{
			{"a", running, nil, ""},
			{"b", running, nil, ""},
			{"c", running, []string{EventWorkersRunning}, "generation 1: workers running on all 3 nodes"},
			{"c", failed, []string{EventWorkerFailed}, "workers on c exited with code 1"},
			{"a", stopped, nil, ""},
			{"b", stopped, []string{EventWorkersExited}, "generation 1: workers exited on all 3 nodes: 2 stopped, 1 failed (listed in worker_failed events)"},
		}},
		{"fails before every worker ran", []string{"a", "b"}, nil, []report{
			{"a", running, nil, ""},
			{"b", failed, []string{EventWorkerFailed}, "workers on b exited with code 1"},
			{"a", stopped, []string{EventWorkersExited}, "generation 1: workers exited on all 2 nodes: 1 stopped, 1 failed (listed in worker_failed events)"},
		}},
		{"the last of one node", []string{"a"}, nil, []report{
			{"a", failed, []string{EventWorkerFailed, EventWorkersExited}, "generation 1: workers exited on all 1 nodes: 1 failed (listed in worker_failed events)"},
		}},
		{"failures beyond the cap are counted", many, nil, manyFail()},
		{"taking over after every worker ran", []string{"a", "b"}, map[string]rdzvv1.WorkerState{"a": running, "b": running}, []report{
			{"a", stopped, nil, ""},
			{"b", stopped, []string{EventWorkersExited}, "generation 1: workers exited on all 2 nodes: 2 stopped"},
		}},
		{"taking over with the cap reached", many[:maxFailureEvents+1], func() map[string]rdzvv1.WorkerState {
			m := map[string]rdzvv1.WorkerState{}
			for _, n := range many[:maxFailureEvents] {
				m[n] = failed
			}
			return m
		}(), []report{
			{many[maxFailureEvents], failed, []string{EventWorkersExited},
				fmt.Sprintf("generation 1: workers exited on all %d nodes: %d failed (the first %d listed in worker_failed events, 1 not)", maxFailureEvents+1, maxFailureEvents+1, maxFailureEvents)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Controller{clock: clockwork.NewFakeClock()}
			js := &jobState{rec: &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "j"}, Generation: 1}, round: testRound(tt.nodes...), workers: map[string]*rdzvv1.WorkerStatus{}}
			for n, s := range tt.loaded {
				js.workers[n] = &rdzvv1.WorkerStatus{Job: "j", Generation: 1, State: s, ExitCode: 1}
			}
			for i, r := range tt.reports {
				w := &rdzvv1.WorkerStatus{Job: "j", Generation: 1, State: r.state}
				if r.state == failed {
					w.ExitCode = 1
				}
				// As applyWorkerStatus does.
				js.workers[r.node] = w
				if r.state == failed {
					js.failed.note(js)
				}
				evs := c.workerEvents(js, r.node, w)
				var kinds []string
				for _, ev := range evs {
					kinds = append(kinds, ev.GetKind())
					require.Equal(t, "j", ev.GetJob())
					require.Equal(t, uint64(1), ev.GetGeneration())
				}
				require.Equal(t, r.kinds, kinds, "report %d (%s %s)", i, r.node, r.state)
				if len(evs) > 0 {
					last := evs[len(evs)-1]
					require.Equal(t, r.message, last.GetMessage(), "report %d", i)
					if last.GetKind() == EventWorkerFailed {
						require.Equal(t, r.node, last.GetNode())
					} else {
						require.Empty(t, last.GetNode(), "a generation's event names no node")
					}
				}
			}
		})
	}
}
