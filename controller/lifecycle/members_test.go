package lifecycle

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const (
	wAssigned  = rdzvv1.WorkerState_WORKER_STATE_ASSIGNED
	wRunning   = rdzvv1.WorkerState_WORKER_STATE_RUNNING
	wSucceeded = rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED
	wFailed    = rdzvv1.WorkerState_WORKER_STATE_FAILED
	wStopped   = rdzvv1.WorkerState_WORKER_STATE_STOPPED
)

func testRound(nodes ...string) *rdzvv1.Round {
	r := &rdzvv1.Round{Generation: 1}
	for i, n := range nodes {
		r.Nodes = append(r.Nodes, &rdzvv1.NodeAssignment{Node: n, NodeRank: uint32(i)})
	}
	return r
}

func testJob(state rdzvv1.JobState) *rdzvv1.Job {
	return &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "j"}, Generation: 1, State: state}
}

func report(state rdzvv1.WorkerState) *rdzvv1.WorkerStatus {
	w := &rdzvv1.WorkerStatus{Job: "j", Generation: 1, State: state}
	if state == wFailed {
		w.ExitCode = 1
	}
	return w
}

// The index follows the round wherever it is replaced, or a report from a
// node of the new round would be taken for a stale one.
func TestMembersFollowTheRound(t *testing.T) {
	var m Members
	steps := []struct {
		name  string
		round *rdzvv1.Round
		in    []string
		notIn []string
	}{
		{"no round yet", nil, nil, []string{"a"}},
		{"first round", testRound("a", "b"), []string{"a", "b"}, []string{"c"}},
		{"next generation without b", testRound("a", "c"), []string{"a", "c"}, []string{"b"}},
		{"an empty round", testRound(), nil, []string{"a", "c"}},
		{"round dropped", nil, nil, []string{"a"}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			m.Reset(s.round, nil)
			for _, n := range s.in {
				require.True(t, m.Member(n), "node %s", n)
				require.Equal(t, n, m.Assignment(n).GetNode())
			}
			for _, n := range s.notIn {
				require.False(t, m.Member(n), "node %s", n)
			}
		})
	}
}

// The counts follow the round and its reports: counted once after Reset,
// then kept per report, never twice for one node, and a node no longer in
// the round does not count.
func TestMembersCount(t *testing.T) {
	var m Members
	// Loaded with one success already recorded, and one of a node no
	// longer in the round.
	m.Reset(testRound("a", "b", "c"), map[string]*rdzvv1.WorkerStatus{"a": report(wSucceeded), "z": report(wSucceeded)})
	rec := testJob(running)
	OnWorkerReport(rec, &m, "b", report(wSucceeded), t0) // before the first count: the count includes it
	require.Equal(t, 2, m.Succeeded())
	OnWorkerReport(rec, &m, "c", report(wSucceeded), t0)
	require.Equal(t, 3, m.Succeeded())
	OnWorkerReport(rec, &m, "c", report(wSucceeded), t0)
	require.Equal(t, 3, m.Succeeded(), "the same report again")
	require.True(t, m.AllExited())
	require.Zero(t, m.Failed())

	// The next generation: a new round and no reports yet.
	m.Reset(testRound("a", "c"), nil)
	require.Zero(t, m.Succeeded())
	require.False(t, m.AllExited())
	OnWorkerReport(rec, &m, "c", report(wFailed), t0)
	require.Equal(t, 1, m.Failed())
	require.Zero(t, m.Succeeded())
}

// What one report decides, by the job's state and the node's part in it.
func TestOnWorkerReport(t *testing.T) {
	tests := []struct {
		name string
		rec  *rdzvv1.Job // nil: the job is gone
		node string      // a, b are the round's nodes
		prev rdzvv1.WorkerState
		// other is the other node's workers' state (default assigned).
		other rdzvv1.WorkerState
		w     *rdzvv1.WorkerStatus
		want  Report // Events checked by kind only, in wantEvents
		// wantEvents are the kinds of the events recorded with the report.
		wantEvents []string
	}{
		{name: "running, first report", rec: testJob(running), node: "a", w: report(wRunning), want: Report{Recorded: true}},
		{name: "running, the second node too", rec: testJob(running), node: "b", other: wRunning, w: report(wRunning),
			want: Report{Recorded: true, AllRunning: true}, wantEvents: []string{EventWorkersRunning}},
		{name: "the same state again", rec: testJob(running), node: "a", prev: wRunning, w: report(wRunning), want: Report{}},
		{name: "anything after an exit", rec: testJob(running), node: "a", prev: wFailed, w: report(wRunning),
			want: Report{}},
		{name: "an exit", rec: testJob(running), node: "a", prev: wRunning, w: report(wFailed),
			want: Report{Recorded: true, Exited: true}, wantEvents: []string{EventWorkerFailed}},
		{name: "a survivor's exit during a recovery", rec: testJob(recovering), node: "a", prev: wRunning, w: report(wStopped),
			want: Report{Recorded: true, Exited: true, Lazy: true}},
		{name: "running workers of a job stopping", rec: testJob(stopping), node: "a", prev: wAssigned, w: report(wRunning),
			want: Report{Stop: "job is STOPPING", Recorded: true}},
		{name: "the last to run, of a job stopping", rec: testJob(stopping), node: "a", other: wRunning, w: report(wRunning),
			want: Report{Stop: "job is STOPPING", Recorded: true, AllRunning: true}, wantEvents: []string{EventWorkersRunning}},
		{name: "running workers of a recovering job", rec: testJob(recovering), node: "a", prev: wRunning, w: report(wRunning),
			want: Report{Stop: "job is RECOVERING"}},
		{name: "another generation", rec: testJob(running), node: "a", w: &rdzvv1.WorkerStatus{Job: "j", Generation: 7, State: wRunning},
			want: Report{Stale: true, Stop: "stale generation", StopGrace: FailedStopGrace}},
		{name: "a node not in the round", rec: testJob(running), node: "z", w: report(wRunning),
			want: Report{Stale: true, Stop: "stale generation", StopGrace: FailedStopGrace}},
		{name: "a job gone", node: "a", w: report(wRunning),
			want: Report{Stale: true, Stop: "stale generation", StopGrace: FailedStopGrace}},
		{name: "a stale exit needs no stop", rec: testJob(running), node: "z", w: report(wStopped), want: Report{Stale: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m Members
			other := "b"
			if tt.node == "b" {
				other = "a"
			}
			workers := map[string]*rdzvv1.WorkerStatus{other: report(wAssigned)}
			if tt.other != 0 {
				workers[other] = report(tt.other)
			}
			if tt.prev != 0 {
				workers[tt.node] = report(tt.prev)
			}
			m.Reset(testRound("a", "b"), workers)
			got := OnWorkerReport(tt.rec, &m, tt.node, tt.w, t0)
			var kinds []string
			for _, ev := range got.Events {
				kinds = append(kinds, ev.GetKind())
				require.Equal(t, t0, ev.GetTime().AsTime())
			}
			require.Equal(t, tt.wantEvents, kinds)
			got.Events = nil
			require.Equal(t, tt.want, got)
			if got.Recorded {
				require.Same(t, tt.w, m.Worker(tt.node), "recorded")
			} else {
				require.NotSame(t, tt.w, m.Worker(tt.node), "not recorded")
			}
		})
	}
}

// A generation's reports add two events in all (every worker running,
// every worker exited), and one per failed node up to MaxFailureEvents;
// the phase events say how many nodes and how their workers ended.
func TestWorkerEvents(t *testing.T) {
	many := make([]string, MaxFailureEvents+3)
	for i := range many {
		many[i] = fmt.Sprintf("n%02d", i)
	}
	type step struct {
		node  string
		state rdzvv1.WorkerState
		// kinds are the events it adds, message the last one's.
		kinds   []string
		message string
	}
	manyFail := func() []step {
		var rs []step
		for i, n := range many {
			r := step{node: n, state: wFailed, kinds: []string{EventWorkerFailed}, message: "workers on " + n + " exited with code 1"}
			if i >= MaxFailureEvents {
				r.kinds, r.message = nil, ""
			}
			if i == len(many)-1 {
				r.kinds = []string{EventWorkersExited}
				r.message = fmt.Sprintf("generation 1: workers exited on all %d nodes: %d failed (the first %d listed in worker_failed events, 3 not)", len(many), len(many), MaxFailureEvents)
			}
			rs = append(rs, r)
		}
		return rs
	}
	tests := []struct {
		name    string
		nodes   []string
		loaded  map[string]rdzvv1.WorkerState // as a controller taking over finds them
		reports []step
	}{
		{"runs and succeeds", []string{"a", "b"}, nil, []step{
			{"a", wAssigned, nil, ""},
			{"a", wRunning, nil, ""},
			{"b", wRunning, []string{EventWorkersRunning}, "generation 1: workers running on all 2 nodes"},
			{"b", wSucceeded, nil, ""},
			{"a", wSucceeded, []string{EventWorkersExited}, "generation 1: workers exited on all 2 nodes: 2 succeeded"},
		}},
		{"one fails, the rest are stopped", []string{"a", "b", "c"}, nil, []step{
			{"a", wRunning, nil, ""},
			{"b", wRunning, nil, ""},
			{"c", wRunning, []string{EventWorkersRunning}, "generation 1: workers running on all 3 nodes"},
			{"c", wFailed, []string{EventWorkerFailed}, "workers on c exited with code 1"},
			{"a", wStopped, nil, ""},
			{"b", wStopped, []string{EventWorkersExited}, "generation 1: workers exited on all 3 nodes: 2 stopped, 1 failed (listed in worker_failed events)"},
		}},
		{"fails before every worker ran", []string{"a", "b"}, nil, []step{
			{"a", wRunning, nil, ""},
			{"b", wFailed, []string{EventWorkerFailed}, "workers on b exited with code 1"},
			{"a", wStopped, []string{EventWorkersExited}, "generation 1: workers exited on all 2 nodes: 1 stopped, 1 failed (listed in worker_failed events)"},
		}},
		{"the last of one node", []string{"a"}, nil, []step{
			{"a", wFailed, []string{EventWorkerFailed, EventWorkersExited}, "generation 1: workers exited on all 1 nodes: 1 failed (listed in worker_failed events)"},
		}},
		{"failures beyond the cap are counted", many, nil, manyFail()},
		{"taking over after every worker ran", []string{"a", "b"}, map[string]rdzvv1.WorkerState{"a": wRunning, "b": wRunning}, []step{
			{"a", wStopped, nil, ""},
			{"b", wStopped, []string{EventWorkersExited}, "generation 1: workers exited on all 2 nodes: 2 stopped"},
		}},
		{"taking over with the cap reached", many[:MaxFailureEvents+1], func() map[string]rdzvv1.WorkerState {
			m := map[string]rdzvv1.WorkerState{}
			for _, n := range many[:MaxFailureEvents] {
				m[n] = wFailed
			}
			return m
		}(), []step{
			{many[MaxFailureEvents], wFailed, []string{EventWorkersExited},
				fmt.Sprintf("generation 1: workers exited on all %d nodes: %d failed (the first %d listed in worker_failed events, 1 not)", MaxFailureEvents+1, MaxFailureEvents+1, MaxFailureEvents)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := testJob(running)
			workers := map[string]*rdzvv1.WorkerStatus{}
			for n, s := range tt.loaded {
				workers[n] = report(s)
			}
			var m Members
			m.Reset(testRound(tt.nodes...), workers)
			for i, r := range tt.reports {
				got := OnWorkerReport(rec, &m, r.node, report(r.state), t0)
				require.True(t, got.Recorded, "report %d", i)
				var kinds []string
				for _, ev := range got.Events {
					kinds = append(kinds, ev.GetKind())
					require.Equal(t, "j", ev.GetJob())
					require.Equal(t, uint64(1), ev.GetGeneration())
				}
				require.Equal(t, r.kinds, kinds, "report %d (%s %s)", i, r.node, r.state)
				if len(got.Events) > 0 {
					last := got.Events[len(got.Events)-1]
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
