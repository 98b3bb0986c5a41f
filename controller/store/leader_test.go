package store

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Every write carries the leadership guard: once the leader key is gone or
// belongs to another campaign, writes fail with ErrNotLeader, never
// ErrConflict, and write nothing.
func TestWritesGuardedByLeadership(t *testing.T) {
	s, cli := newStore(t)
	commit(t, s, s.CreateJob(job("train", rdzvv1.JobState_JOB_STATE_PENDING, 0), false))

	t.Run("a lost race on a record is a conflict", func(t *testing.T) {
		// A store that leads but never saw the job: its view is stale.
		o := sibling(s)
		_, err := o.CommitAll(ctx(t), o.UpdateJob(job("train", rdzvv1.JobState_JOB_STATE_RUNNING, 1)))
		require.ErrorIs(t, err, ErrConflict)
		require.NotErrorIs(t, err, ErrNotLeader)
	})

	// Each write is built on the deposed store d; d never saw "train", so
	// its record guards fail as well: the leadership must win.
	writes := map[string]func(d *Store) error{
		"update job": func(d *Store) error {
			_, err := d.CommitAll(ctx(t), d.UpdateJob(job("train", rdzvv1.JobState_JOB_STATE_RUNNING, 1)))
			return err
		},
		"create job": func(d *Store) error {
			_, err := d.CommitAll(ctx(t), d.CreateJob(job("other", rdzvv1.JobState_JOB_STATE_PENDING, 0), false))
			return err
		},
		"commit round": func(d *Store) error {
			_, err := d.CommitAll(ctx(t), d.CommitRound(job("train", rdzvv1.JobState_JOB_STATE_RUNNING, 1), round("train", 1, "n1")))
			return err
		},
		"record checkpoint": func(d *Store) error {
			_, err := d.CommitAll(ctx(t), d.RecordCheckpoint(job("train", rdzvv1.JobState_JOB_STATE_RUNNING, 1), &rdzvv1.Checkpoint{Step: 1}, 0))
			return err
		},
		"node": func(d *Store) error {
			_, err := d.CommitAll(ctx(t), d.PutNode(&rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: "n1"}}))
			return err
		},
		"event": func(d *Store) error {
			_, err := d.CommitAll(ctx(t), d.AppendEvent(event("", "x", t0)))
			return err
		},
		"worker": func(d *Store) error {
			_, err := d.CommitAll(ctx(t), d.PutWorker("train", "n1", &rdzvv1.WorkerStatus{Job: "train"}))
			return err
		},
		"batch": func(d *Store) error {
			n, _, err := d.Commit(ctx(t), []*Change{d.AppendEvent(event("", "x", t0)), d.AppendEvent(event("", "y", t0))})
			require.Zero(t, n)
			return err
		},
		"prune": func(d *Store) error {
			_, err := d.PruneEvents(ctx(t), ClusterScope, t0, 0)
			return err
		},
		"delete job": func(d *Store) error {
			_, err := d.CommitAll(ctx(t), d.DeleteJob("train", 0))
			return err
		},
	}
	deposals := []struct {
		name   string
		depose func(t *testing.T) *Store
	}{
		{"following", func(t *testing.T) *Store {
			f := New(cli, 0, testKeys(t), 0)
			f.Follow()
			return f
		}},
		{"never told it leads", func(t *testing.T) *Store { return New(cli, 0, testKeys(t), 0) }},
		{"leader key deleted (lease expired)", func(t *testing.T) *Store {
			l := lead(t, cli, "deposed")
			_, err := cli.Delete(ctx(t), l.Key)
			require.NoError(t, err)
			d := New(cli, 0, testKeys(t), 0)
			d.Lead(l)
			return d
		}},
		{"leader key recreated by a later campaign", func(t *testing.T) *Store {
			l := lead(t, cli, "recreated")
			_, err := cli.Delete(ctx(t), l.Key)
			require.NoError(t, err)
			lead(t, cli, "recreated")
			d := New(cli, 0, testKeys(t), 0)
			d.Lead(l)
			return d
		}},
	}
	for _, dp := range deposals {
		t.Run(dp.name, func(t *testing.T) {
			d := dp.depose(t)
			for what, write := range writes {
				before := revision(t, cli)
				err := write(d)
				require.ErrorIs(t, err, ErrNotLeader, what)
				require.NotErrorIs(t, err, ErrConflict, what)
				require.Equal(t, before, revision(t, cli), "%s: a refused write changed etcd", what)
			}
		})
	}
}

// A real election: the loser's store refuses writes until the winner's
// session ends, then the winner's old guard refuses them too.
func TestGuardFollowsElection(t *testing.T) {
	s, cli := newStore(t)
	s.Follow()
	campaign := func(val string) (*concurrency.Session, *concurrency.Election) {
		sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
		require.NoError(t, err)
		t.Cleanup(func() { _ = sess.Close() })
		return sess, concurrency.NewElection(sess, ElectionName())
	}
	sessA, a := campaign("a")
	require.NoError(t, a.Campaign(ctx(t), "a:7070"))
	s.Lead(Leadership{Key: a.Key(), Rev: a.Rev()})
	commit(t, s, s.CreateJob(job("one", rdzvv1.JobState_JOB_STATE_PENDING, 0), false))

	// Closing the session revokes its lease, as its expiry would.
	require.NoError(t, sessA.Close())
	_, b := campaign("b")
	require.NoError(t, b.Campaign(ctx(t), "b:7070"))
	two := s.CreateJob(job("two", rdzvv1.JobState_JOB_STATE_PENDING, 0), false)
	_, err := s.CommitAll(ctx(t), two)
	require.ErrorIs(t, err, ErrNotLeader, "a deposed leader's late write must fail")
	require.Empty(t, keys(t, cli, JobKey("two")))

	// The refused change is still good once the store leads again: guards
	// are checked when it is committed, not when it is built.
	s.Lead(Leadership{Key: b.Key(), Rev: b.Rev()})
	commit(t, s, two)
	require.Len(t, keys(t, cli, JobKey("two")), 1)
}

func TestPruneEvents(t *testing.T) {
	tests := []struct {
		name   string
		events int
		cutoff time.Duration // after t0; events are one second apart from t0
		keep   int
		want   []int // indexes of the events left
	}{
		{"nothing to prune", 3, 0, 10, []int{0, 1, 2}},
		{"by age", 5, 2 * time.Second, 10, []int{2, 3, 4}},
		{"by count", 5, 0, 2, []int{3, 4}},
		{"by age then count", 6, time.Second, 3, []int{3, 4, 5}},
		{"keep none", 3, 0, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, cli := newStore(t)
			for i := range tt.events {
				commit(t, s, s.AppendEvent(event("train", fmt.Sprint(i), t0.Add(time.Duration(i)*time.Second))))
			}
			// Another scope is never touched.
			commit(t, s, s.AppendEvent(event("", "cluster", t0)))
			deleted, err := s.PruneEvents(ctx(t), "train", t0.Add(tt.cutoff), tt.keep)
			require.NoError(t, err)
			require.EqualValues(t, tt.events-len(tt.want), deleted)
			left := newest(t, s, "train", 100)
			want := []string{}
			for _, i := range tt.want {
				want = append(want, fmt.Sprint(i))
			}
			require.Equal(t, want, append([]string{}, kinds(left)...))
			require.Len(t, keys(t, cli, EventsPrefix(ClusterScope)), 1)
		})
	}
}

func TestDeleteJob(t *testing.T) {
	s, cli := newStore(t)
	commit(t, s,
		s.CreateJob(job("done", rdzvv1.JobState_JOB_STATE_PENDING, 0), false, event("done", "job_submitted", t0)),
		s.CommitRound(job("done", rdzvv1.JobState_JOB_STATE_RUNNING, 1), round("done", 1, "n1")),
		s.PutWorker("done", "n1", &rdzvv1.WorkerStatus{Job: "done", Generation: 1}),
		s.RecordCheckpoint(job("done", rdzvv1.JobState_JOB_STATE_RUNNING, 1), &rdzvv1.Checkpoint{Step: 10, Path: "/c/10"}, 0))
	// A job whose name shares the prefix must survive.
	commit(t, s, s.CreateJob(job("done-2", rdzvv1.JobState_JOB_STATE_PENDING, 0), false, event("done-2", "job_submitted", t0)))
	kept := func() {
		t.Helper()
		require.Contains(t, keys(t, cli, JobsPrefix()), JobKey("done"), "a refused delete removed the job")
		for _, prefix := range []string{RoundsPrefix("done"), WorkersPrefix("done"), CheckpointsPrefix("done"), EventsPrefix("done")} {
			require.Len(t, keys(t, cli, prefix), 1, "a refused delete removed %s", prefix)
		}
	}

	o := sibling(s)
	_, err := o.CommitAll(ctx(t), o.DeleteJob("done", 0))
	require.ErrorIs(t, err, ErrConflict, "deleting a job the store never saw")
	kept()

	// The job changed behind the store's back: its view is stale.
	putBehind(t, cli, JobKey("done"), job("done", rdzvv1.JobState_JOB_STATE_FAILED, 1))
	_, err = s.CommitAll(ctx(t), s.DeleteJob("done", 0))
	require.ErrorIs(t, err, ErrConflict, "deleting a job that moved")
	kept()

	// Reloading catches up.
	_, err = s.Load(ctx(t))
	require.NoError(t, err)
	commit(t, s, s.DeleteJob("done", 7, event("", "job_deleted", t0)))
	require.Equal(t, []string{JobKey("done-2")}, keys(t, cli, JobsPrefix()))
	require.Len(t, keys(t, cli, EventsPrefix("done-2")), 1)
	require.Len(t, keys(t, cli, EventsPrefix(ClusterScope)), 1)
	require.Len(t, keys(t, cli, Prefix+"events/"), 2, "done-2's and the cluster's")
	for _, prefix := range []string{RoundsPrefix("done"), WorkersPrefix("done"), CheckpointsPrefix("done"), EventsPrefix("done")} {
		require.Empty(t, keys(t, cli, prefix), prefix)
	}
	// The floor outlives the job, for whoever leads next.
	snap, err := sibling(s).Load(ctx(t))
	require.NoError(t, err)
	require.EqualValues(t, 7, snap.GenerationFloor)
}

func TestDeleteNode(t *testing.T) {
	s, cli := newStore(t)
	node := func(name string) *rdzvv1.Node {
		return &rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: name}, State: rdzvv1.NodeState_NODE_STATE_LOST}
	}
	commit(t, s, s.PutNode(node("gpu-1")), s.PutNode(node("gpu-10")))

	o := sibling(s)
	_, err := o.CommitAll(ctx(t), o.DeleteNode("gpu-1"))
	require.ErrorIs(t, err, ErrConflict, "deleting a node the store never saw")
	putBehind(t, cli, NodeKey("gpu-1"), node("gpu-1"))
	_, err = s.CommitAll(ctx(t), s.DeleteNode("gpu-1"))
	require.ErrorIs(t, err, ErrConflict, "deleting a node that changed (registered again)")
	require.Len(t, keys(t, cli, NodesPrefix()), 2)

	_, err = s.Load(ctx(t))
	require.NoError(t, err)
	commit(t, s, s.DeleteNode("gpu-1", event("", "node_deleted", t0)))
	require.Equal(t, []string{NodeKey("gpu-10")}, keys(t, cli, NodesPrefix()), "only the node itself")
	require.Len(t, keys(t, cli, EventsPrefix(ClusterScope)), 1)
	// Forgotten: registering again is a create.
	commit(t, s, s.PutNode(node("gpu-1")))
}

func TestCompact(t *testing.T) {
	s, cli := newStore(t)
	commit(t, s, s.CreateJob(job("x", rdzvv1.JobState_JOB_STATE_PENDING, 0), false))
	old, err := s.Revision(ctx(t))
	require.NoError(t, err)
	commit(t, s, s.UpdateJob(job("x", rdzvv1.JobState_JOB_STATE_RUNNING, 1)))
	require.NoError(t, s.Compact(ctx(t), old))
	_, err = cli.Get(ctx(t), JobKey("x"), clientv3.WithRev(old-1))
	require.True(t, errors.Is(err, errCompacted(t, cli, old-1)), "history before the compaction is gone: %v", err)
	// Again, or to an older revision: already done, not an error.
	require.NoError(t, s.Compact(ctx(t), old))
	require.NoError(t, s.Compact(ctx(t), old-1))
}

// errCompacted is the error etcd gives for reading a compacted revision.
func errCompacted(t *testing.T, cli *clientv3.Client, rev int64) error {
	t.Helper()
	_, err := cli.Get(ctx(t), "probe", clientv3.WithRev(rev))
	require.Error(t, err)
	return err
}
