package controller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/controller/store"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// The writer drops the reports a queued round deletes, unless something
// waits on them or on a change after them: those and everything before
// them reach etcd whole. What is left keeps its order, callbacks and
// replies.
func TestElideSuperseded(t *testing.T) {
	s := store.New(nil, 0, nil, 0)
	report := func(node string) *store.Change {
		return s.PutWorker("job", node, &rdzvv1.WorkerStatus{Job: "job", Generation: 1, State: rdzvv1.WorkerState_WORKER_STATE_STOPPED})
	}
	round := s.CommitRound(&rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "job"}, Generation: 2},
		&rdzvv1.Round{Job: "job", Generation: 2, Nodes: []*rdzvv1.NodeAssignment{{Node: "n1"}}})
	var ran []string
	then := func(what string) func() { return func() { ran = append(ran, what) } }
	reply := make(chan error, 1)

	kept := elideSuperseded([]pendingWrite{
		{ch: report("n1")},
		{ch: report("n2"), reply: reply}, // an API answer waits on it
		{ch: report("n3")},
		{ch: report("n4")},
		{ch: round, then: then("assignments")},
		{then: then("after")},
	})
	require.Len(t, kept, 4, "n3's and n4's reports are dropped")
	require.Equal(t, "recording worker of job job on node n1", kept[0].ch.String())
	require.Equal(t, "recording worker of job job on node n2", kept[1].ch.String())
	require.Equal(t, (<-chan error)(reply), (<-chan error)(kept[1].reply))
	require.Same(t, round, kept[2].ch)
	require.Nil(t, kept[3].ch)
	for _, p := range kept {
		if p.then != nil {
			p.then()
		}
	}
	require.Equal(t, []string{"assignments", "after"}, ran)
}

// Reports taken behind queued reports elide nothing; the round's commit,
// taken behind them, elides them all, as eliding the whole queue does.
func TestAppendElided(t *testing.T) {
	s := store.New(nil, 0, nil, 0)
	report := func(node string) pendingWrite {
		return pendingWrite{ch: s.PutWorker("job", node, &rdzvv1.WorkerStatus{Job: "job", Generation: 1, State: rdzvv1.WorkerState_WORKER_STATE_STOPPED}), lazy: true}
	}
	round := s.CommitRound(&rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "job"}, Generation: 2},
		&rdzvv1.Round{Job: "job", Generation: 2, Nodes: []*rdzvv1.NodeAssignment{{Node: "n1"}}})
	require.True(t, round.Elides())
	require.False(t, report("n1").ch.Elides())
	require.False(t, (*store.Change)(nil).Elides(), "a barrier")

	queued := appendElided(nil, []pendingWrite{report("n1"), report("n2")})
	queued = appendElided(queued, []pendingWrite{report("n3"), {}})
	require.Len(t, queued, 4, "nothing elided without a change that deletes or supersedes")
	queued = appendElided(queued, []pendingWrite{report("n4"), {ch: round}})
	require.Len(t, queued, 2, "the reports are elided")
	require.Nil(t, queued[0].ch, "the barrier stays")
	require.Same(t, round, queued[1].ch)
}

// Lazy changes wait for company, up to lazyWait from the oldest; anything
// else queued writes them at once, in order.
func TestHoldUntil(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	lazy := func(at time.Time) pendingWrite { return pendingWrite{lazy: true, held: at} }
	tests := []struct {
		name   string
		queued []pendingWrite
		want   time.Time
	}{
		{"nothing queued", nil, time.Time{}},
		{"lazy changes wait from the oldest", []pendingWrite{lazy(t0), lazy(t0.Add(time.Second))}, t0.Add(lazyWait)},
		{"a change someone waits on takes them along", []pendingWrite{lazy(t0), {reply: make(chan error, 1)}}, time.Time{}},
		{"so does a plain change", []pendingWrite{{}, lazy(t0)}, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, holdUntil(tt.queued))
		})
	}
}
