package store

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func job(name string, state rdzvv1.JobState, gen uint64) *rdzvv1.Job {
	return &rdzvv1.Job{
		Spec:  &rdzvv1.JobSpec{Name: name, NodesMin: 1, NodesMax: 2, Command: []string{"train.py"}},
		State: state, Generation: gen, CreatedAt: timestamppb.New(t0),
	}
}

func event(jobName, kind string, at time.Time) *rdzvv1.Event {
	return &rdzvv1.Event{Time: timestamppb.New(at), Job: jobName, Kind: kind, Message: kind}
}

func round(jobName string, gen uint64, nodes ...string) *rdzvv1.Round {
	r := &rdzvv1.Round{Job: jobName, Generation: gen, MasterAddr: "10.0.0.1", MasterPort: 29500, CommittedAt: timestamppb.New(t0)}
	for i, n := range nodes {
		r.Nodes = append(r.Nodes, &rdzvv1.NodeAssignment{Node: n, NodeRank: uint32(i), Address: "10.0.0.1", GpuIndices: []uint32{0}})
	}
	return r
}

func kinds(events []*rdzvv1.Event) []string {
	out := make([]string, len(events))
	for i, ev := range events {
		out[i] = ev.GetKind()
	}
	return out
}

// newest lists a scope's newest n events through ListEvents' pages, two
// events a page, as the API's pages follow each other.
func newest(t *testing.T, s *Store, scope string, n int) []*rdzvv1.Event {
	t.Helper()
	var all []*rdzvv1.Event
	page := EventPage{Newest: n, Limit: 2, MaxBytes: 1 << 20}
	for {
		events, cursor, more, err := s.ListEvents(ctx(t), scope, page)
		require.NoError(t, err)
		all = append(all, events...)
		if !more || len(all) >= n {
			return all[:min(len(all), n)]
		}
		page.After = cursor
	}
}

func TestKeys(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"node", NodeKey("gpu-01"), "/rdzv/v1/nodes/gpu-01"},
		{"job", JobKey("train"), "/rdzv/v1/jobs/train"},
		{"round zero padded", RoundKey("train", 7), "/rdzv/v1/rounds/train/00000000000000000007"},
		{"round max generation", RoundKey("train", ^uint64(0)), "/rdzv/v1/rounds/train/18446744073709551615"},
		{"worker", WorkerKey("train", "gpu-01"), "/rdzv/v1/workers/train/gpu-01"},
		{"event", EventKey("train", time.Unix(0, 42), 3), "/rdzv/v1/events/train/00000000000000000042-000000000003"},
		{"cluster event", EventKey(ClusterScope, time.Unix(1, 0), 12), "/rdzv/v1/events/_cluster/00000000001000000000-000000000012"},
		{"rounds prefix", RoundsPrefix("train"), "/rdzv/v1/rounds/train/"},
		{"workers prefix", WorkersPrefix("train"), "/rdzv/v1/workers/train/"},
		{"events prefix", EventsPrefix("train"), "/rdzv/v1/events/train/"},
		{"revoked serial", RevokedSerialKey("1f2e"), "/rdzv/v1/revoked/serial/1f2e"},
		{"revoked identity", RevokedIdentityKey("agent/gpu-01"), "/rdzv/v1/revoked/identity/agent/gpu-01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { require.Equal(t, tt.want, tt.got) })
	}
}

// Keys are compared as bytes by etcd, so the padding is what makes "latest
// round" and "newest events" a single sorted range read.
func TestKeysSortNumerically(t *testing.T) {
	gens := []uint64{10, 9, 100, 1, 11, 2}
	rounds := make([]string, len(gens))
	for i, g := range gens {
		rounds[i] = RoundKey("train", g)
	}
	sort.Strings(rounds)
	parsed := make([]uint64, len(rounds))
	for i, k := range rounds {
		g, err := generationFromRoundKey(k)
		require.NoError(t, err)
		parsed[i] = g
	}
	require.Equal(t, []uint64{1, 2, 9, 10, 11, 100}, parsed)

	events := []string{
		EventKey("j", time.Unix(10, 0), 1),
		EventKey("j", time.Unix(9, 0), 2),
		EventKey("j", time.Unix(10, 0), 10),
		EventKey("j", time.Unix(10, 0), 9),
	}
	sort.Strings(events)
	require.Equal(t, []string{
		EventKey("j", time.Unix(9, 0), 2),
		EventKey("j", time.Unix(10, 0), 1),
		EventKey("j", time.Unix(10, 0), 9),
		EventKey("j", time.Unix(10, 0), 10),
	}, events)
}

func TestNameFromKey(t *testing.T) {
	tests := []struct {
		key     string
		want    string
		wantErr bool
	}{
		{WorkerKey("train", "gpu-01"), "gpu-01", false},
		{WorkersPrefix("train"), "", true},
		{WorkersPrefix("train") + "a/b", "", true},
		{NodeKey("gpu-01"), "", true},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			got, err := nameFromKey(WorkersPrefix("train"), tt.key)
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestStore(t *testing.T) {
	s, cli := newStore(t)

	t.Run("create job conflicts on existing name", func(t *testing.T) {
		rev := commit(t, s, s.CreateJob(job("dup", rdzvv1.JobState_JOB_STATE_PENDING, 0), false, event("dup", "job_submitted", t0)))
		require.Positive(t, rev)

		// A second controller (or this one after losing track) that never
		// saw the job creates it again.
		before := revision(t, cli)
		o := sibling(s)
		_, err := o.CommitAll(ctx(t), o.CreateJob(job("dup", rdzvv1.JobState_JOB_STATE_PENDING, 0), false, event("dup", "job_submitted", t0.Add(time.Second))))
		require.ErrorIs(t, err, ErrConflict)
		require.Equal(t, before, revision(t, cli), "a conflicting create wrote something")

		events := newest(t, s, "dup", 10)
		require.Len(t, events, 1, "the losing create's event was stored")
	})

	// replaceFinished stores a job that ran one round, as the controller
	// holds it when the job has finished.
	replaceFinished := func(t *testing.T, name string) {
		commit(t, s,
			s.CreateJob(job(name, rdzvv1.JobState_JOB_STATE_PENDING, 0), false, event(name, "job_submitted", t0)),
			s.CommitRound(job(name, rdzvv1.JobState_JOB_STATE_RUNNING, 1), round(name, 1, "n1")),
			s.PutWorker(name, "n1", &rdzvv1.WorkerStatus{Job: name, Generation: 1}))

		o := sibling(s)
		_, err := o.CommitAll(ctx(t), o.CreateJob(job(name, rdzvv1.JobState_JOB_STATE_PENDING, 1), true))
		require.ErrorIs(t, err, ErrConflict, "replacing a job the store never saw")
		require.Len(t, keys(t, cli, RoundsPrefix(name)), 1, "a refused replace dropped the rounds")
		require.Len(t, keys(t, cli, WorkersPrefix(name)), 1, "a refused replace dropped the workers")
	}

	t.Run("create replaces a finished job and drops its rounds and workers", func(t *testing.T) {
		replaceFinished(t, "again")
		commit(t, s, s.CreateJob(job("again", rdzvv1.JobState_JOB_STATE_PENDING, 1), true))
		require.Empty(t, keys(t, cli, RoundsPrefix("again")))
		require.Empty(t, keys(t, cli, WorkersPrefix("again")))
		require.Len(t, keys(t, cli, EventsPrefix("again")), 1, "the old job's events stay as the name's history")
	})

	t.Run("create replaces a finished job and keeps its events", func(t *testing.T) {
		// The controller always passes a job_submitted event, under the same
		// events prefix as the earlier run's: both must be kept.
		replaceFinished(t, "again-ev")
		commit(t, s, s.CreateJob(job("again-ev", rdzvv1.JobState_JOB_STATE_PENDING, 1), true, event("again-ev", "job_submitted", t0.Add(time.Hour))))
		require.Empty(t, keys(t, cli, RoundsPrefix("again-ev")))
		require.Empty(t, keys(t, cli, WorkersPrefix("again-ev")))
		events := newest(t, s, "again-ev", 10)
		require.Len(t, events, 2, "the earlier run's event and the new one")
		require.True(t, events[1].GetTime().AsTime().Equal(t0.Add(time.Hour)), "the new event is the newest")
	})

	t.Run("create replaces a finished job and drops its checkpoints", func(t *testing.T) {
		replaceFinished(t, "again-cp")
		commit(t, s, s.RecordCheckpoint(job("again-cp", rdzvv1.JobState_JOB_STATE_FAILED, 1), &rdzvv1.Checkpoint{Step: 5, Path: "/c/5"}, 0))
		require.Len(t, keys(t, cli, CheckpointsPrefix("again-cp")), 1)
		commit(t, s, s.CreateJob(job("again-cp", rdzvv1.JobState_JOB_STATE_PENDING, 1), true))
		require.Empty(t, keys(t, cli, CheckpointsPrefix("again-cp")))
	})

	t.Run("update with a stale revision writes nothing", func(t *testing.T) {
		rev := commit(t, s, s.CreateJob(job("upd", rdzvv1.JobState_JOB_STATE_PENDING, 0), false))
		// stale read the job before the update below.
		stale := sibling(s)
		_, err := stale.Load(ctx(t))
		require.NoError(t, err)
		rev2 := commit(t, s, s.UpdateJob(job("upd", rdzvv1.JobState_JOB_STATE_STOPPED, 0), event("upd", "job_stopped", t0)))
		require.Greater(t, rev2, rev)

		before := revision(t, cli)
		_, err = stale.CommitAll(ctx(t), stale.UpdateJob(job("upd", rdzvv1.JobState_JOB_STATE_FAILED, 0), event("upd", "job_failed", t0.Add(time.Second))))
		require.ErrorIs(t, err, ErrConflict)
		require.Equal(t, before, revision(t, cli))

		snap, err := s.Load(ctx(t))
		require.NoError(t, err)
		require.Equal(t, rdzvv1.JobState_JOB_STATE_STOPPED, snap.Jobs["upd"].Value.GetState())
		require.Equal(t, rev2, snap.Jobs["upd"].ModRevision)
		events := newest(t, s, "upd", 10)
		require.Equal(t, []string{"job_stopped"}, kinds(events))
	})

	t.Run("update of a job deleted behind the store's back conflicts", func(t *testing.T) {
		commit(t, s, s.CreateJob(job("ghost", rdzvv1.JobState_JOB_STATE_PENDING, 0), false))
		_, err := cli.Delete(ctx(t), JobKey("ghost"))
		require.NoError(t, err)
		_, err = s.CommitAll(ctx(t), s.UpdateJob(job("ghost", rdzvv1.JobState_JOB_STATE_FAILED, 0)))
		require.ErrorIs(t, err, ErrConflict)
		require.Empty(t, keys(t, cli, JobKey("ghost")), "the update recreated a deleted job")
	})

	t.Run("commit round", func(t *testing.T) {
		commit(t, s,
			s.CreateJob(job("rnd", rdzvv1.JobState_JOB_STATE_PENDING, 0), false),
			s.CommitRound(job("rnd", rdzvv1.JobState_JOB_STATE_RUNNING, 1), round("rnd", 1, "n1", "n2")))
		for _, n := range []string{"n1", "n2"} {
			commit(t, s, s.PutWorker("rnd", n, &rdzvv1.WorkerStatus{Job: "rnd", Generation: 1, State: rdzvv1.WorkerState_WORKER_STATE_RUNNING}))
		}
		workers, _, err := s.Workers(ctx(t), "rnd")
		require.NoError(t, err)
		require.Len(t, workers, 2)

		// The same generation again, even with the job as last seen, must
		// lose: a generation is committed once.
		before := revision(t, cli)
		_, err = s.CommitAll(ctx(t), s.CommitRound(job("rnd", rdzvv1.JobState_JOB_STATE_RUNNING, 1), round("rnd", 1, "n3")))
		require.ErrorIs(t, err, ErrConflict)
		require.Equal(t, before, revision(t, cli))
		latest, err := s.LatestRound(ctx(t), "rnd")
		require.NoError(t, err)
		require.Equal(t, "n1", latest.GetNodes()[0].GetNode(), "the losing round overwrote the committed one")

		// A job that moved behind the store's back loses too.
		putBehind(t, cli, JobKey("rnd"), job("rnd", rdzvv1.JobState_JOB_STATE_RUNNING, 1))
		before = revision(t, cli)
		_, err = s.CommitAll(ctx(t), s.CommitRound(job("rnd", rdzvv1.JobState_JOB_STATE_RUNNING, 2), round("rnd", 2, "n3")))
		require.ErrorIs(t, err, ErrConflict)
		require.Equal(t, before, revision(t, cli))
		_, err = s.Load(ctx(t))
		require.NoError(t, err)

		// The next generation starts with a clean slate of workers: the
		// old ones stay stored, superseded.
		commit(t, s, s.CommitRound(job("rnd", rdzvv1.JobState_JOB_STATE_RUNNING, 2), round("rnd", 2, "n3")))
		snap, err := s.Load(ctx(t))
		require.NoError(t, err)
		require.Empty(t, snap.Workers["rnd"])
		latest, err = s.LatestRound(ctx(t), "rnd")
		require.NoError(t, err)
		require.Equal(t, uint64(2), latest.GetGeneration())
	})

	t.Run("put worker is guarded by the job revision", func(t *testing.T) {
		commit(t, s, s.CreateJob(job("pw", rdzvv1.JobState_JOB_STATE_PENDING, 0), false))
		// stale saw the job before its round: a report for the superseded
		// generation must not land.
		stale := sibling(s)
		_, err := stale.Load(ctx(t))
		require.NoError(t, err)
		commit(t, s, s.CommitRound(job("pw", rdzvv1.JobState_JOB_STATE_RUNNING, 1), round("pw", 1, "n1")))

		before := revision(t, cli)
		_, err = stale.CommitAll(ctx(t), stale.PutWorker("pw", "n1", &rdzvv1.WorkerStatus{Job: "pw", Generation: 0}, event("pw", "worker_failed", t0)))
		require.ErrorIs(t, err, ErrConflict)
		require.Equal(t, before, revision(t, cli))
		require.Empty(t, keys(t, cli, WorkersPrefix("pw")))

		w := &rdzvv1.WorkerStatus{Job: "pw", Generation: 1, State: rdzvv1.WorkerState_WORKER_STATE_FAILED, ExitCode: 3, Message: "boom"}
		commit(t, s, s.PutWorker("pw", "n1", w, event("pw", "workers_exited", t0)))
		workers, _, err := s.Workers(ctx(t), "pw")
		require.NoError(t, err)
		require.Empty(t, cmpDiff(w, workers["n1"]))
		events := newest(t, s, "pw", 10)
		require.Equal(t, []string{"workers_exited"}, kinds(events))
	})

	t.Run("record checkpoint drops steps below the kept one", func(t *testing.T) {
		commit(t, s, s.CreateJob(job("ckpt", rdzvv1.JobState_JOB_STATE_RUNNING, 1), false))
		for _, step := range []uint64{10, 20, 30} {
			commit(t, s, s.RecordCheckpoint(job("ckpt", rdzvv1.JobState_JOB_STATE_RUNNING, 1), &rdzvv1.Checkpoint{Step: step}, 0))
		}
		commit(t, s, s.RecordCheckpoint(job("ckpt", rdzvv1.JobState_JOB_STATE_RUNNING, 1), &rdzvv1.Checkpoint{Step: 40}, 30))
		cps, _, err := s.Checkpoints(ctx(t), "ckpt")
		require.NoError(t, err)
		steps := make([]uint64, len(cps))
		for i, cp := range cps {
			steps[i] = cp.GetStep()
		}
		require.Equal(t, []uint64{30, 40}, steps)
	})

	t.Run("list events oldest first within the limit", func(t *testing.T) {
		// Appended out of time order: the key, not the write order, sorts.
		for _, i := range []int{3, 0, 4, 1, 2} {
			commit(t, s, s.AppendEvent(event("ev", string(rune('a'+i)), t0.Add(time.Duration(i)*time.Second))))
		}
		tests := []struct {
			limit int
			want  []string
		}{
			{10, []string{"a", "b", "c", "d", "e"}},
			{5, []string{"a", "b", "c", "d", "e"}},
			{3, []string{"c", "d", "e"}},
			{1, []string{"e"}},
		}
		for _, tt := range tests {
			events := newest(t, s, "ev", tt.limit)
			require.Equal(t, tt.want, kinds(events), "limit %d", tt.limit)
		}

		// Events without a job land in the cluster scope and never in a job's.
		commit(t, s, s.AppendEvent(event("", "node_registered", t0)))
		cluster := newest(t, s, ClusterScope, 10)
		require.Equal(t, []string{"node_registered"}, kinds(cluster))
	})

	t.Run("event pages end at their limit or their size, and resume after their cursor", func(t *testing.T) {
		var sizes []int
		for i := range 5 {
			ev := event("paged", fmt.Sprint(i), t0.Add(time.Duration(i)*time.Second))
			ev.Message = strings.Repeat("m", 100*(i+1))
			sizes = append(sizes, wire.ItemBytes(proto.Size(ev)))
			commit(t, s, s.AppendEvent(ev))
		}
		tests := []struct {
			name     string
			page     EventPage
			want     []string
			wantMore bool
		}{
			{"limit", EventPage{Newest: 5, Limit: 2, MaxBytes: 1 << 20}, []string{"0", "1"}, true},
			{"the newest only", EventPage{Newest: 2, Limit: 10, MaxBytes: 1 << 20}, []string{"3", "4"}, false},
			{"bytes", EventPage{Newest: 5, Limit: 10, MaxBytes: sizes[0] + sizes[1] + sizes[2] - 1}, []string{"0", "1"}, true},
			{"exactly the bytes", EventPage{Newest: 5, Limit: 10, MaxBytes: sizes[0] + sizes[1]}, []string{"0", "1"}, true},
			{"one event even over the bytes", EventPage{Newest: 5, Limit: 10, MaxBytes: 1}, []string{"0"}, true},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				events, cursor, more, err := s.ListEvents(ctx(t), "paged", tt.page)
				require.NoError(t, err)
				require.Equal(t, tt.want, kinds(events))
				require.Equal(t, tt.wantMore, more)
				rest, _, more, err := s.ListEvents(ctx(t), "paged", EventPage{After: cursor, Limit: 10, MaxBytes: 1 << 20})
				require.NoError(t, err)
				require.False(t, more)
				all := []string{"0", "1", "2", "3", "4"}
				last := slices.Index(all, tt.want[len(tt.want)-1])
				require.Equal(t, all[last+1:], append([]string{}, kinds(rest)...), "after %q", cursor)
			})
		}
		none, cursor, more, err := s.ListEvents(ctx(t), "no-such-scope", EventPage{Newest: 5, Limit: 5, MaxBytes: 1 << 20})
		require.NoError(t, err)
		require.Empty(t, none)
		require.Empty(t, cursor)
		require.False(t, more)
		for _, bad := range []string{"x", "../jobs/x", strings.Repeat("0", 20) + "/" + strings.Repeat("0", 12), strings.Repeat("0", 34)} {
			_, _, _, err := s.ListEvents(ctx(t), "paged", EventPage{After: bad, Limit: 5, MaxBytes: 1 << 20})
			require.ErrorIs(t, err, ErrBadCursor, "cursor %q", bad)
		}
	})

	t.Run("events at the same instant keep their write order", func(t *testing.T) {
		for _, k := range []string{"first", "second", "third"} {
			commit(t, s, s.AppendEvent(event("same", k, t0)))
		}
		events := newest(t, s, "same", 10)
		require.Equal(t, []string{"first", "second", "third"}, kinds(events))
	})

	t.Run("put node is guarded and never stores in-memory fields", func(t *testing.T) {
		n := &rdzvv1.Node{
			Info:  &rdzvv1.NodeInfo{Name: "gpu-07", Address: "10.0.0.7"},
			State: rdzvv1.NodeState_NODE_STATE_READY, Job: "train", Generation: 4,
			LastHeartbeat: timestamppb.New(t0),
		}
		commit(t, s, s.PutNode(n))
		o := sibling(s)
		_, err := o.CommitAll(ctx(t), o.PutNode(n))
		require.ErrorIs(t, err, ErrConflict, "a second registration from scratch")
		// o now reads the node, then s rewrites it: o's view is stale.
		_, err = o.Load(ctx(t))
		require.NoError(t, err)
		rev := commit(t, s, s.PutNode(n))
		_, err = o.CommitAll(ctx(t), o.PutNode(n))
		require.ErrorIs(t, err, ErrConflict)

		snap, err := s.Load(ctx(t))
		require.NoError(t, err)
		got := snap.Nodes["gpu-07"]
		require.Equal(t, rev, got.ModRevision)
		require.Nil(t, got.Value.GetLastHeartbeat())
		require.Empty(t, got.Value.GetJob())
		require.Zero(t, got.Value.GetGeneration())
		require.NotEqual(t, n.GetJob(), "", "PutNode must not modify its argument")
	})
}

// TestLoadRoundTrip writes a small cluster and checks a fresh Store over the
// same etcd sees exactly it: what a restarted controller starts from.
func TestLoadRoundTrip(t *testing.T) {
	s, _ := newStore(t)
	nodes := map[string]*rdzvv1.Node{}
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		n := &rdzvv1.Node{
			Info: &rdzvv1.NodeInfo{
				Name: name, Labels: map[string]string{"pool": "train"}, Address: "10.0.0.1", NcclInterface: "eth0",
				Gpus: []*rdzvv1.GPU{{Index: 0, Uuid: "GPU-" + name}},
			},
			State: rdzvv1.NodeState_NODE_STATE_READY, RegisteredAt: timestamppb.New(t0),
		}
		commit(t, s, s.PutNode(n))
		nodes[name] = n
	}

	commit(t, s, s.CreateJob(job("train", rdzvv1.JobState_JOB_STATE_PENDING, 0), false))
	// Eleven generations: the latest must be found by numeric, not
	// lexical, order of the generation.
	var last *rdzvv1.Round
	var rev int64
	for gen := uint64(1); gen <= 11; gen++ {
		last = round("train", gen, "node-a", "node-b")
		rev = commit(t, s, s.CommitRound(job("train", rdzvv1.JobState_JOB_STATE_RUNNING, gen), last))
	}
	workers := map[string]*rdzvv1.WorkerStatus{
		"node-a": {Job: "train", Generation: 11, State: rdzvv1.WorkerState_WORKER_STATE_RUNNING},
		"node-b": {Job: "train", Generation: 11, State: rdzvv1.WorkerState_WORKER_STATE_FAILED, ExitCode: 1, Signal: "SIGKILL"},
	}
	for n, w := range workers {
		commit(t, s, s.PutWorker("train", n, w))
	}
	withAssignments := job("waiting", rdzvv1.JobState_JOB_STATE_PENDING, 0)
	withAssignments.Assignments = []*rdzvv1.NodeAssignment{{Node: "node-c"}}
	waitingRev := commit(t, s, s.CreateJob(withAssignments, false))

	fresh := sibling(s)
	snap, err := fresh.Load(ctx(t))
	require.NoError(t, err)

	require.Len(t, snap.Nodes, 3)
	for name, n := range nodes {
		require.Empty(t, cmpDiff(n, snap.Nodes[name].Value), "node %s", name)
		require.Positive(t, snap.Nodes[name].ModRevision)
	}
	require.Len(t, snap.Jobs, 2)
	require.Equal(t, rev, snap.Jobs["train"].ModRevision)
	require.Empty(t, cmpDiff(job("train", rdzvv1.JobState_JOB_STATE_RUNNING, 11), snap.Jobs["train"].Value))
	require.Equal(t, waitingRev, snap.Jobs["waiting"].ModRevision)
	require.Empty(t, snap.Jobs["waiting"].Value.GetAssignments(), "assignments are derived, never stored")

	require.Empty(t, cmpDiff(last, snap.Rounds["train"]))
	require.NotContains(t, snap.Rounds, "waiting", "a job that never ran has no round")
	require.Len(t, snap.Workers["train"], 2)
	for n, w := range workers {
		require.Empty(t, cmpDiff(w, snap.Workers["train"][n]), "worker %s", n)
	}
	require.Empty(t, snap.Workers["waiting"])

	// What Load read guards the fresh store's writes: a restarted
	// controller carries on without rereading each record.
	commit(t, fresh,
		fresh.UpdateJob(job("train", rdzvv1.JobState_JOB_STATE_STOPPING, 11)),
		fresh.PutNode(nodes["node-c"]))
}

// TestLoadPagesThroughLargeRanges stores more nodes than one range read
// returns, so Load must follow the continuation.
func TestLoadPagesThroughLargeRanges(t *testing.T) {
	s, cli := newStore(t)
	const n = pageSize + 7
	// Batched raw writes: one guarded PutNode per node would spend seconds
	// on fsyncs without testing anything more.
	var ops []clientv3.Op
	flush := func() {
		_, err := cli.Txn(ctx(t)).Then(ops...).Commit()
		require.NoError(t, err)
		ops = ops[:0]
	}
	for i := range n {
		name := fmt.Sprintf("node-%04d", i)
		b, err := proto.Marshal(&rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: name}})
		require.NoError(t, err)
		ops = append(ops, clientv3.OpPut(NodeKey(name), string(b)))
		if len(ops) == 100 {
			flush()
		}
	}
	flush()
	snap, err := s.Load(ctx(t))
	require.NoError(t, err)
	require.Len(t, snap.Nodes, n)
	require.Contains(t, snap.Nodes, "node-0000")
	require.Contains(t, snap.Nodes, fmt.Sprintf("node-%04d", n-1))
}

func TestTxnSurfacesEtcdErrors(t *testing.T) {
	s, cli := newStore(t)
	require.NoError(t, cli.Close())
	_, err := s.CommitAll(ctx(t), s.CreateJob(job("x", rdzvv1.JobState_JOB_STATE_PENDING, 0), false))
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrConflict), "a dead connection is not a lost race: %v", err)
	require.False(t, errors.Is(err, ErrNotLeader), "a dead connection is not a lost lead: %v", err)
}

func cmpDiff(want, got proto.Message) string { return cmp.Diff(want, got, protocmp.Transform()) }

// PutNode stores a node without its in-memory views (liveness, job) and
// leaves the record it was given as it was: the controller keeps it.
func TestPutNodeStoresWhatLasts(t *testing.T) {
	s, _ := newStore(t)
	n := &rdzvv1.Node{
		Info:         &rdzvv1.NodeInfo{Name: "node-a", Address: "10.0.0.1", Gpus: []*rdzvv1.GPU{{Uuid: "GPU-a"}}},
		State:        rdzvv1.NodeState_NODE_STATE_READY,
		Job:          "train",
		Generation:   3,
		RegisteredAt: timestamppb.New(t0), LastHeartbeat: timestamppb.New(t0.Add(time.Second)), StateChangedAt: timestamppb.New(t0),
		Cordoned: true, CordonReason: "maintenance", Draining: true,
		HealthChecks: []*rdzvv1.HealthCheckResult{{Name: "xid"}},
	}
	given := proto.Clone(n)
	commit(t, s, s.PutNode(n))
	require.Empty(t, cmpDiff(given, n), "PutNode changed the record it was given")

	snap, err := sibling(s).Load(ctx(t))
	require.NoError(t, err)
	want := proto.Clone(n).(*rdzvv1.Node)
	want.LastHeartbeat, want.Job, want.Generation = nil, "", 0
	require.Empty(t, cmpDiff(want, snap.Nodes["node-a"].Value))
}
