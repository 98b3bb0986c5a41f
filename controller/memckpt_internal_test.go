package controller

import (
	"cmp"
	"testing"

	"github.com/stretchr/testify/require"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func held(gen, step uint64, ranks ...uint32) *rdzvv1.MemoryHeld {
	return &rdzvv1.MemoryHeld{Generation: gen, Step: step, Ranks: ranks}
}

func TestPickMemory(t *testing.T) {
	// Three nodes of two ranks each; every node holds its own ranks and a
	// replica of the previous node's (it is the next node rank).
	ring := func(gen, step uint64) map[string][]*rdzvv1.MemoryHeld {
		return map[string][]*rdzvv1.MemoryHeld{
			"a": {held(gen, step, 0, 1, 4, 5)},
			"b": {held(gen, step, 2, 3, 0, 1)},
			"c": {held(gen, step, 4, 5, 2, 3)},
		}
	}
	merge := func(ms ...map[string][]*rdzvv1.MemoryHeld) map[string][]*rdzvv1.MemoryHeld {
		out := map[string][]*rdzvv1.MemoryHeld{}
		for _, m := range ms {
			for n, h := range m {
				out[n] = append(out[n], h...)
			}
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		held    map[string][]*rdzvv1.MemoryHeld
		dead    []string
		current uint64
		skip    map[memKey]bool
		// worlds are the generations' world sizes (default 6 each); world
		// is the new generation's (default 6).
		worlds     map[uint64]uint32
		world      uint32
		replicated bool
		want       memKey
		holders    [][]string
		ok         bool
	}{
		{name: "nothing held", held: nil, current: 1},
		{name: "all alive", held: ring(1, 40), current: 1, want: memKey{1, 40}, ok: true,
			holders: [][]string{{"a", "b"}, {"a", "b"}, {"b", "c"}, {"b", "c"}, {"a", "c"}, {"a", "c"}}},
		{name: "one node lost, its replica survives", held: ring(1, 40), dead: []string{"b"}, current: 1, want: memKey{1, 40}, ok: true,
			holders: [][]string{{"a"}, {"a"}, {"c"}, {"c"}, {"a", "c"}, {"a", "c"}}},
		{name: "two adjacent nodes lost", held: ring(1, 40), dead: []string{"a", "b"}, current: 1},
		{name: "newest complete step wins", held: merge(ring(1, 40), ring(1, 50)), current: 1, want: memKey{1, 50}, ok: true},
		{name: "a step missing a rank is not complete",
			held:    merge(ring(1, 40), map[string][]*rdzvv1.MemoryHeld{"a": {held(1, 50, 0, 1)}, "b": {held(1, 50, 2, 3)}}),
			current: 1, want: memKey{1, 40}, ok: true},
		{name: "a later generation's step wins over a higher older one", held: merge(ring(1, 90), ring(2, 60)), current: 2, want: memKey{2, 60}, ok: true},
		{name: "generations are never mixed",
			held: map[string][]*rdzvv1.MemoryHeld{"a": {held(1, 40, 0, 1, 2)}, "b": {held(2, 40, 3, 4, 5)}}, current: 2},
		{name: "no generation beyond the current", held: merge(ring(1, 40), ring(3, 60)), current: 2, want: memKey{1, 40}, ok: true},
		{name: "a step whose fetch failed is skipped", held: merge(ring(1, 40), ring(1, 50)), current: 1,
			skip: map[memKey]bool{{1, 50}: true}, want: memKey{1, 40}, ok: true},
		{name: "ranks beyond the world ignored", held: map[string][]*rdzvv1.MemoryHeld{"a": {held(1, 40, 0, 1, 2, 3, 4, 5, 6, 7)}},
			current: 1, want: memKey{1, 40}, ok: true},
		{name: "a step of another world does not fit", held: ring(1, 40), dead: []string{"b"}, current: 1, world: 4},
		{name: "a replicated state's step fits another world", held: ring(1, 40), dead: []string{"b"}, current: 1, world: 4, replicated: true,
			want: memKey{1, 40}, ok: true, holders: [][]string{{"a"}, {"a"}, {"c"}, {"c"}, {"a", "c"}, {"a", "c"}}},
		{name: "a replicated state's step must be whole in the world that saved it",
			held: map[string][]*rdzvv1.MemoryHeld{"a": {held(1, 40, 0, 1)}, "c": {held(1, 40, 2, 3)}}, current: 1, world: 4, replicated: true},
		{name: "an older generation of the same world fits, a newer one of another does not",
			held:   merge(ring(1, 40), map[string][]*rdzvv1.MemoryHeld{"a": {held(2, 60, 0, 1, 2, 3)}}),
			worlds: map[uint64]uint32{1: 6, 2: 4}, current: 2, want: memKey{1, 40}, ok: true},
		{name: "the steps of a generation of unknown world never fit", held: merge(ring(1, 90), ring(2, 60)),
			worlds: map[uint64]uint32{2: 6}, current: 2, skip: map[memKey]bool{{2, 60}: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			alive := func(n string) bool {
				for _, d := range tc.dead {
					if d == n {
						return false
					}
				}
				return true
			}
			worldOf := func(g uint64) uint32 {
				if tc.worlds == nil {
					return 6
				}
				return tc.worlds[g]
			}
			world := cmp.Or(tc.world, 6)
			plan, ok := pickMemory(tc.held, alive, worldOf, world, tc.replicated, tc.current, tc.skip)
			require.Equal(t, tc.ok, ok)
			if !ok {
				return
			}
			require.Equal(t, tc.want, plan.key)
			if tc.holders != nil {
				require.Equal(t, tc.holders, plan.holders)
			}
		})
	}
}

func TestMemPlanSources(t *testing.T) {
	plan := memPlan{key: memKey{1, 40}, saved: 6, holders: [][]string{{"a"}, {"a"}, {"c"}, {"c"}, {"a", "c"}, {"a", "c"}}}
	addr := func(n string) string { return n + ":7947" }
	// d replaces b at node rank 1: it fetches both ranks from c.
	require.Equal(t, []*rdzvv1.ShardSource{{Rank: 2, Node: "c", Addr: "c:7947"}, {Rank: 3, Node: "c", Addr: "c:7947"}},
		plan.sources("d", 1, 2, addr))
	// c keeps its own.
	require.Equal(t, []*rdzvv1.ShardSource{{Rank: 4, Node: "c", Addr: "c:7947"}, {Rank: 5, Node: "c", Addr: "c:7947"}},
		plan.sources("c", 2, 2, addr))

	// A replicated state saved by 2 ranks, resumed by 4 (two nodes of two):
	// ranks 2 and 3 take ranks 0 and 1's shards.
	grown := memPlan{key: memKey{1, 40}, saved: 2, holders: [][]string{{"a", "b"}, {"b"}}}
	require.Equal(t, []*rdzvv1.ShardSource{{Rank: 0, Node: "a", Addr: "a:7947"}, {Rank: 1, Node: "b", Addr: "b:7947"}},
		grown.sources("a", 1, 2, addr))
	// Saved by one rank: every rank takes its shard, fetched once.
	one := memPlan{key: memKey{1, 40}, saved: 1, holders: [][]string{{"a"}}}
	require.Equal(t, []*rdzvv1.ShardSource{{Rank: 0, Node: "a", Addr: "a:7947"}}, one.sources("d", 1, 2, addr))
}

// A registration replaces what the node holds of every job: a restarted
// agent (nothing) drops its stale claims, a reconnecting one keeps its own,
// and other nodes' holdings and jobs without checkpoint.memory are left
// alone. A node that does not run in the job's running generation (fenced,
// the job recovering) can only take away from its claims of the current
// generation: a stalled node's agent may have taken its workers' queued
// reports, late, on resuming.
func TestRegisterMemory(t *testing.T) {
	memJob := func(state rdzvv1.JobState) *jobState {
		return withMembers(&jobState{rec: &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "train", CheckpointMemory: &rdzvv1.CheckpointMemorySpec{Replicas: 1}},
			Generation: 1, State: state},
			memHeld: map[string][]*rdzvv1.MemoryHeld{"a": {held(1, 30, 0, 1)}, "b": {held(1, 30, 2, 3, 0, 1)}}},
			&rdzvv1.Round{Nodes: []*rdzvv1.NodeAssignment{{Node: "a"}, {Node: "b", NodeRank: 1}}}, nil)
	}
	for _, tc := range []struct {
		name       string
		recovering bool
		reg        []*rdzvv1.JobMemoryHeld
		want       map[string][]*rdzvv1.MemoryHeld
	}{
		{"a fenced node cannot add a step", true, []*rdzvv1.JobMemoryHeld{{Job: "train", Held: []*rdzvv1.MemoryHeld{held(1, 30, 2, 3, 0, 1), held(1, 33, 2, 3)}}},
			map[string][]*rdzvv1.MemoryHeld{"a": {held(1, 30, 0, 1)}, "b": {held(1, 30, 2, 3, 0, 1)}}},
		{"a fenced node cannot add a rank", true, []*rdzvv1.JobMemoryHeld{{Job: "train", Held: []*rdzvv1.MemoryHeld{held(1, 30, 2, 3, 4)}}},
			map[string][]*rdzvv1.MemoryHeld{"a": {held(1, 30, 0, 1)}, "b": {held(1, 30, 2, 3)}}},
		{"a fenced node holds less", true, []*rdzvv1.JobMemoryHeld{{Job: "train", Held: []*rdzvv1.MemoryHeld{held(1, 30, 2, 3)}}},
			map[string][]*rdzvv1.MemoryHeld{"a": {held(1, 30, 0, 1)}, "b": {held(1, 30, 2, 3)}}},
		{"a restarted fenced node holds nothing", true, nil,
			map[string][]*rdzvv1.MemoryHeld{"a": {held(1, 30, 0, 1)}}},

		{"a restarted agent holds nothing", false, nil,
			map[string][]*rdzvv1.MemoryHeld{"a": {held(1, 30, 0, 1)}}},
		{"a reconnecting agent holds what it held", false, []*rdzvv1.JobMemoryHeld{{Job: "train", Held: []*rdzvv1.MemoryHeld{held(1, 30, 2, 3, 0, 1)}}},
			map[string][]*rdzvv1.MemoryHeld{"a": {held(1, 30, 0, 1)}, "b": {held(1, 30, 2, 3, 0, 1)}}},
		{"a new leader learns a step", false, []*rdzvv1.JobMemoryHeld{{Job: "train", Held: []*rdzvv1.MemoryHeld{held(1, 36, 2, 3)}}},
			map[string][]*rdzvv1.MemoryHeld{"a": {held(1, 30, 0, 1)}, "b": {held(1, 36, 2, 3)}}},
		{"a job it does not know is ignored", false, []*rdzvv1.JobMemoryHeld{{Job: "gone", Held: []*rdzvv1.MemoryHeld{held(1, 36, 2, 3)}}},
			map[string][]*rdzvv1.MemoryHeld{"a": {held(1, 30, 0, 1)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plain := &jobState{rec: &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "plain"}}}
			state := rdzvv1.JobState_JOB_STATE_RUNNING
			if tc.recovering {
				state = rdzvv1.JobState_JOB_STATE_RECOVERING
			}
			c := &Controller{jobs: map[string]*jobState{"train": memJob(state), "plain": plain}}
			c.jobs.registerMemory("b", tc.reg)
			require.Equal(t, tc.want, c.jobs["train"].memHeld)
			require.Nil(t, plain.memHeld, "a job without checkpoint.memory keeps no holdings")
		})
	}
}

// A node of a fenced generation that resumes late (a stall) pushes a shard
// of its generation to a peer that runs on in the next one, which reports
// it: only what was held when the generation was fenced may count.
func TestMemorySealedAtCommit(t *testing.T) {
	// Generation 1 on a and b, two ranks each; at the fence, step 40 is
	// complete and of step 43 only a's ranks were saved: b stalled first.
	atFence := map[string][]*rdzvv1.MemoryHeld{
		"a": {held(1, 40, 0, 1, 2, 3), held(1, 43, 0, 1)},
		"b": {held(1, 40, 2, 3, 0, 1)},
	}
	sealed := sealMemory(atFence, 1)
	require.Equal(t, map[memKey][]uint32{{1, 40}: {0, 1, 2, 3}, {1, 43}: {0, 1}}, sealed)

	// Generation 2 runs on a and c and has saved nothing complete yet; b,
	// resumed, has pushed its late shards of step 43 to a.
	late := []*rdzvv1.MemoryHeld{held(1, 40, 0, 1, 2, 3), held(1, 43, 0, 1, 2, 3), held(2, 41, 0, 1)}
	require.Equal(t, []*rdzvv1.MemoryHeld{held(1, 40, 0, 1, 2, 3), held(1, 43, 0, 1), held(2, 41, 0, 1)},
		sealedOnly(late, 2, sealed))
	// c fetched step 40's ranks 2 and 3 to resume: sealed, so they count.
	fetched := []*rdzvv1.MemoryHeld{held(1, 40, 2, 3), held(1, 99, 2, 3)}
	require.Equal(t, []*rdzvv1.MemoryHeld{held(1, 40, 2, 3)}, sealedOnly(fetched, 2, sealed))

	now := map[string][]*rdzvv1.MemoryHeld{"a": sealedOnly(late, 2, sealed), "c": sealedOnly(fetched, 2, sealed)}
	four := func(uint64) uint32 { return 4 }
	plan, ok := pickMemory(now, func(string) bool { return true }, four, 4, false, 2, nil)
	require.True(t, ok)
	require.Equal(t, memKey{1, 40}, plan.key, "the late shards must not complete step 43")
	// Without the seal they would have.
	plan, ok = pickMemory(map[string][]*rdzvv1.MemoryHeld{"a": late, "c": fetched}, func(string) bool { return true }, four, 4, false, 2, nil)
	require.True(t, ok)
	require.Equal(t, memKey{1, 43}, plan.key)

	// Sealing again at the next commit keeps generation 1's seal and adds
	// generation 2's holdings.
	require.Equal(t, map[memKey][]uint32{{1, 40}: {0, 1, 2, 3}, {1, 43}: {0, 1}, {2, 41}: {0, 1}}, sealMemory(now, 2))
	// After a failover nothing is sealed: earlier generations count no more.
	require.Empty(t, sealedOnly(late[:2], 2, nil))
}

// What a node of the job's current generation holds as its workers exit
// (WorkerStatus.memory) counts in full, while the job recovers too: the
// steps its workers saved after its last progress report are the newest
// of the lineage. A registration while the job recovers may only narrow
// (TestRegisterMemory); shards of generations the last commit sealed stay
// filtered.
func TestExitMemory(t *testing.T) {
	js := withMembers(&jobState{rec: &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "train", CheckpointMemory: &rdzvv1.CheckpointMemorySpec{Replicas: 1}},
		Generation: 2, State: rdzvv1.JobState_JOB_STATE_RECOVERING},
		memHeld:   map[string][]*rdzvv1.MemoryHeld{"a": {held(2, 30, 0, 1, 2, 3)}, "b": {held(2, 30, 2, 3, 0, 1)}},
		memSealed: map[memKey][]uint32{{1, 10}: {0, 1, 2, 3}}},
		&rdzvv1.Round{Nodes: []*rdzvv1.NodeAssignment{{Node: "a"}, {Node: "b", NodeRank: 1}}}, nil)

	js.memoryHeld("b", []*rdzvv1.MemoryHeld{held(2, 30, 2, 3, 0, 1), held(2, 34, 2, 3, 0, 1)})
	require.Equal(t, []*rdzvv1.MemoryHeld{held(2, 30, 2, 3, 0, 1)}, js.memHeld["b"], "a progress report while recovering adds nothing")

	js.exitMemory("b", []*rdzvv1.MemoryHeld{held(1, 10, 2, 3), held(1, 12, 2, 3), held(2, 30, 2, 3, 0, 1), held(2, 34, 2, 3, 0, 1)})
	require.Equal(t, []*rdzvv1.MemoryHeld{held(1, 10, 2, 3), held(2, 30, 2, 3, 0, 1), held(2, 34, 2, 3, 0, 1)}, js.memHeld["b"],
		"the exit adds step 34; generation 1's unsealed step 12 stays out")
	js.exitMemory("a", []*rdzvv1.MemoryHeld{held(2, 34, 0, 1)})
	plan, ok := pickMemory(js.memHeld, func(string) bool { return true }, func(uint64) uint32 { return 4 }, 4, false, 2, nil)
	require.True(t, ok)
	require.Equal(t, memKey{2, 34}, plan.key, "the recovery resumes from the step saved just before the exits")

	js.exitMemory("a", nil)
	require.NotContains(t, js.memHeld, "a", "an exit holding nothing clears the node's holdings")

	plain := &jobState{rec: &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "plain"}, Generation: 1}}
	plain.exitMemory("a", []*rdzvv1.MemoryHeld{held(1, 3, 0)})
	require.Nil(t, plain.memHeld, "a job without checkpoint.memory keeps no holdings")
}

// Only the first exit report of the current generation, from a member not
// lost, brings holdings.
func TestExitMemoryTakenFrom(t *testing.T) {
	exit := func(gen uint64, state rdzvv1.WorkerState) *rdzvv1.WorkerStatus {
		return &rdzvv1.WorkerStatus{Job: "train", Generation: gen, State: state, Memory: []*rdzvv1.MemoryHeld{held(gen, 34, 2, 3)}}
	}
	failed, stopped, running := rdzvv1.WorkerState_WORKER_STATE_FAILED, rdzvv1.WorkerState_WORKER_STATE_STOPPED, rdzvv1.WorkerState_WORKER_STATE_RUNNING
	for _, tc := range []struct {
		name     string
		node     string
		w        *rdzvv1.WorkerStatus
		nodeLost bool
		reported rdzvv1.WorkerState // what the controller has of node's workers
		taken    bool
	}{
		{"the exit of the current generation", "b", exit(2, stopped), false, running, true},
		{"a failure of the current generation", "b", exit(2, failed), false, running, true},
		{"workers still running", "b", exit(2, running), false, running, false},
		{"an earlier generation", "b", exit(1, stopped), false, running, false},
		{"a node outside the round", "c", exit(2, stopped), false, running, false},
		{"a lost node", "b", exit(2, stopped), true, running, false},
		{"an exit already reported", "b", exit(2, stopped), false, failed, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := map[string][]*rdzvv1.MemoryHeld{"b": {held(2, 30, 2, 3)}}
			js := withMembers(&jobState{rec: &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "train", CheckpointMemory: &rdzvv1.CheckpointMemorySpec{Replicas: 1}},
				Generation: 2, State: rdzvv1.JobState_JOB_STATE_RECOVERING},
				memHeld: map[string][]*rdzvv1.MemoryHeld{"b": before["b"]}},
				&rdzvv1.Round{Nodes: []*rdzvv1.NodeAssignment{{Node: "a"}, {Node: "b", NodeRank: 1}}},
				map[string]*rdzvv1.WorkerStatus{tc.node: {State: tc.reported}})
			state := rdzvv1.NodeState_NODE_STATE_BUSY
			if tc.nodeLost {
				state = rdzvv1.NodeState_NODE_STATE_LOST
			}
			c := &Controller{jobs: map[string]*jobState{"train": js},
				nodes: map[string]*nodeState{tc.node: {rec: &rdzvv1.Node{State: state}}}}
			c.jobs.exitMemory(c.nodes, tc.node, tc.w)
			if tc.taken {
				require.Equal(t, []*rdzvv1.MemoryHeld{held(2, 34, 2, 3)}, js.memHeld[tc.node])
			} else {
				require.Equal(t, before, js.memHeld)
			}
		})
	}
}
