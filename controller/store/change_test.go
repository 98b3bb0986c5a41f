package store

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/internal/testetcd"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// workerReports is one report per node for a job, with an event each when
// withEvents: the burst a heartbeat wave brings.
func workerReports(s *Store, jobName string, nodes int, withEvents bool) []*Change {
	out := make([]*Change, nodes)
	for i := range out {
		node := fmt.Sprintf("node-%04d", i)
		w := &rdzvv1.WorkerStatus{Job: jobName, Generation: 1, State: rdzvv1.WorkerState_WORKER_STATE_RUNNING}
		if withEvents {
			out[i] = s.PutWorker(jobName, node, w, event(jobName, "worker_failed", t0))
		} else {
			out[i] = s.PutWorker(jobName, node, w)
		}
	}
	return out
}

// modRevisions counts the distinct revisions the keys under prefix were
// written at: the transactions that wrote them.
func modRevisions(t *testing.T, cli *clientv3.Client, prefix string) int {
	t.Helper()
	resp, err := cli.Get(ctx(t), prefix, clientv3.WithPrefix())
	require.NoError(t, err)
	revs := map[int64]bool{}
	for _, kv := range resp.Kvs {
		revs[kv.ModRevision] = true
	}
	return len(revs)
}

func workerOf(t *testing.T, s *Store, jobName, node string) *rdzvv1.WorkerStatus {
	t.Helper()
	workers, _, err := s.Workers(ctx(t), jobName)
	require.NoError(t, err)
	return workers[node]
}

// TestCommitPacks checks how Commit packs changes into transactions: as
// many as etcd's limits allow, never two that touch the same key, each
// later change seeing the earlier ones. Every case runs against real etcd,
// which itself refuses a transaction over its limits or touching a key
// twice.
func TestCommitPacks(t *testing.T) {
	s, cli := newStore(t)
	big := strings.Repeat("x", 400<<10)
	tests := []struct {
		name string
		// changes to commit; the store has created jobName (generation 0).
		changes func(s *Store, jobName string) []*Change
		// wantN is what each successive Commit writes until all are.
		wantN []int
		check func(t *testing.T, jobName string)
	}{
		{
			name: "300 worker reports with events, the job guarded once per transaction",
			changes: func(s *Store, jobName string) []*Change {
				return workerReports(s, jobName, 300, true)
			},
			// Two operations each.
			wantN: []int{DefaultMaxTxnOps / 2, DefaultMaxTxnOps / 2, DefaultMaxTxnOps / 2, DefaultMaxTxnOps / 2, 300 - 4*DefaultMaxTxnOps/2},
			check: func(t *testing.T, jobName string) {
				require.Len(t, keys(t, cli, WorkersPrefix(jobName)), 300)
				require.Len(t, keys(t, cli, EventsPrefix(jobName)), 300)
				require.Equal(t, 5, modRevisions(t, cli, WorkersPrefix(jobName)))
			},
		},
		{
			// A full transaction of single-operation changes proves the job
			// guard is one comparison, not one per change: with one each
			// the comparisons (and the leader's) would cap it below DefaultMaxTxnOps.
			name: "300 worker reports without events fill whole transactions",
			changes: func(s *Store, jobName string) []*Change {
				return workerReports(s, jobName, 300, false)
			},
			wantN: []int{DefaultMaxTxnOps, DefaultMaxTxnOps, 300 - 2*DefaultMaxTxnOps},
			check: func(t *testing.T, jobName string) {
				require.Len(t, keys(t, cli, WorkersPrefix(jobName)), 300)
				require.Equal(t, 3, modRevisions(t, cli, WorkersPrefix(jobName)))
			},
		},
		{
			name: "two reports of the same worker go in order, one transaction each",
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{
					s.PutWorker(jobName, "n1", &rdzvv1.WorkerStatus{Job: jobName, Message: "first"}),
					s.PutWorker(jobName, "n1", &rdzvv1.WorkerStatus{Job: jobName, Message: "second"}),
				}
			},
			wantN: []int{1, 1},
			check: func(t *testing.T, jobName string) {
				require.Equal(t, "second", workerOf(t, s, jobName, "n1").GetMessage())
			},
		},
		{
			// The report's guard is the job as the round left it, in the
			// same transaction.
			name: "a round, then a report for it, in one transaction",
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{
					s.CommitRound(job(jobName, rdzvv1.JobState_JOB_STATE_RUNNING, 1), round(jobName, 1, "n1")),
					s.PutWorker(jobName, "n1", &rdzvv1.WorkerStatus{Job: jobName, Generation: 1}),
				}
			},
			wantN: []int{2},
			check: func(t *testing.T, jobName string) {
				require.Equal(t, uint64(1), workerOf(t, s, jobName, "n1").GetGeneration())
			},
		},
		{
			name: "a report then a round that supersedes it",
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{
					s.PutWorker(jobName, "n1", &rdzvv1.WorkerStatus{Job: jobName}),
					s.PutWorker(jobName, "n2", &rdzvv1.WorkerStatus{Job: jobName}),
					s.CommitRound(job(jobName, rdzvv1.JobState_JOB_STATE_RUNNING, 1), round(jobName, 1, "n1")),
					s.PutWorker(jobName, "n1", &rdzvv1.WorkerStatus{Job: jobName, Generation: 1}),
				}
			},
			wantN: []int{3, 1},
			check: func(t *testing.T, jobName string) {
				// No tombstones: the old generation's records stay in etcd
				// until overwritten, and loading leaves them out.
				require.Len(t, keys(t, cli, WorkersPrefix(jobName)), 2)
				snap, err := s.Load(ctx(t))
				require.NoError(t, err)
				require.Equal(t, []string{"n1"}, slices.Collect(maps.Keys(snap.Workers[jobName])))
				require.Equal(t, uint64(1), snap.Workers[jobName]["n1"].GetGeneration())
			},
		},
		{
			// The report's guard is the job as the update left it, in the
			// same transaction: checking the old revision would fail.
			name: "a job update then a report of that job share a transaction",
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{
					s.UpdateJob(job(jobName, rdzvv1.JobState_JOB_STATE_STOPPING, 0)),
					s.PutWorker(jobName, "n1", &rdzvv1.WorkerStatus{Job: jobName}),
					s.UpdateJob(job(jobName, rdzvv1.JobState_JOB_STATE_STOPPED, 0)),
				}
			},
			// The second update rewrites the job key: a transaction of its own.
			wantN: []int{2, 1},
			check: func(t *testing.T, jobName string) {
				require.NotNil(t, workerOf(t, s, jobName, "n1"))
				snap, err := s.Load(ctx(t))
				require.NoError(t, err)
				require.Equal(t, rdzvv1.JobState_JOB_STATE_STOPPED, snap.Jobs[jobName].Value.GetState())
			},
		},
		{
			name: "unrelated records share a transaction",
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{
					s.PutNode(&rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: jobName + "-n1"}}),
					s.PutNode(&rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: jobName + "-n2"}}),
					s.UpdateJob(job(jobName, rdzvv1.JobState_JOB_STATE_RUNNING, 0)),
					s.PutWorker(jobName, "n1", &rdzvv1.WorkerStatus{Job: jobName}),
					s.AppendEvent(event("", "cluster_event", t0)),
				}
			},
			wantN: []int{5},
			check: func(t *testing.T, jobName string) {
				require.Len(t, keys(t, cli, NodeKey(jobName+"-n")), 2)
			},
		},
		{
			name: "changes over the byte limit split",
			changes: func(s *Store, jobName string) []*Change {
				out := make([]*Change, 3)
				for i := range out {
					out[i] = s.PutWorker(jobName, fmt.Sprint("n", i), &rdzvv1.WorkerStatus{Job: jobName, Message: big})
				}
				return out
			},
			wantN: []int{2, 1},
			check: func(t *testing.T, jobName string) {
				require.Len(t, keys(t, cli, WorkersPrefix(jobName)), 3)
			},
		},
		{
			// The delete forgets the record, so the create's guard is that
			// it does not exist.
			name: "delete then create of the same name",
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{
					s.DeleteJob(jobName, 0),
					s.CreateJob(job(jobName, rdzvv1.JobState_JOB_STATE_PENDING, 0), false, event(jobName, "job_submitted", t0)),
				}
			},
			wantN: []int{1, 1},
			check: func(t *testing.T, jobName string) {
				require.Len(t, keys(t, cli, JobKey(jobName)), 1)
				require.Len(t, keys(t, cli, EventsPrefix(jobName)), 1)
				// And the new record is tracked again.
				commit(t, s, s.UpdateJob(job(jobName, rdzvv1.JobState_JOB_STATE_RUNNING, 0)))
			},
		},
	}
	for i, tt := range tests {
		// Each case runs through Commit, counting transactions, and through
		// CommitAll, which must leave the same result.
		for _, all := range []bool{false, true} {
			jobName := fmt.Sprintf("case-%d-%t", i, all)
			t.Run(fmt.Sprintf("%s/commit all %t", tt.name, all), func(t *testing.T) {
				commit(t, s, s.CreateJob(job(jobName, rdzvv1.JobState_JOB_STATE_PENDING, 0), false))
				changes := tt.changes(s, jobName)
				if all {
					before := revision(t, cli)
					rev := commit(t, s, changes...)
					require.Equal(t, before+int64(len(tt.wantN)), rev, "one revision per transaction")
				} else {
					var got []int
					last := revision(t, cli)
					for len(changes) > 0 {
						n, rev, err := s.Commit(ctx(t), changes)
						require.NoError(t, err)
						require.Positive(t, n)
						require.Equal(t, last+1, rev, "one transaction per Commit")
						got, last, changes = append(got, n), rev, changes[n:]
					}
					require.Equal(t, tt.wantN, got)
				}
				tt.check(t, jobName)
			})
		}
	}
}

// A store packs transactions up to the limit it is given, which etcd
// accepts when its --max-txn-ops is as high (the embedded etcd's), and
// refuses, writing nothing, when it is not.
func TestCommitPacksToTheServersLimit(t *testing.T) {
	const limit = 1024
	tests := []struct {
		name      string
		serverOps uint
		wantN     []int
		wantErr   bool
	}{
		{name: "server at the limit", serverOps: limit, wantN: []int{limit, limit, 2500 - 2*limit}},
		{name: "server at etcd's default", serverOps: DefaultMaxTxnOps, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			endpoint, _ := testetcd.Start(t, "store-test", func(c *embed.Config) { c.MaxTxnOps = tt.serverOps })
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second,
				Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
			require.NoError(t, err)
			t.Cleanup(func() { _ = cli.Close() })
			s := New(cli, 0, testKeys(t), limit)
			s.Lead(lead(t, cli, "test"))
			commit(t, s, s.CreateJob(job("big", rdzvv1.JobState_JOB_STATE_PENDING, 0), false))

			changes := workerReports(s, "big", 2500, false)
			var got []int
			for len(changes) > 0 {
				n, _, err := s.Commit(ctx(t), changes)
				if tt.wantErr {
					require.Error(t, err)
					require.Empty(t, keys(t, cli, WorkersPrefix("big")))
					return
				}
				require.NoError(t, err)
				got, changes = append(got, n), changes[n:]
			}
			require.Equal(t, tt.wantN, got)
			require.Len(t, keys(t, cli, WorkersPrefix("big")), 2500)
			require.Equal(t, len(tt.wantN), modRevisions(t, cli, WorkersPrefix("big")))
		})
	}
}

// TestCommitConflicts: a change whose records moved behind the store's back
// fails its whole transaction with ErrConflict, and nothing of it is
// written.
func TestCommitConflicts(t *testing.T) {
	s, cli := newStore(t)
	tests := []struct {
		name string
		// known are changes the store commits first, so it has seen them.
		known func(s *Store, jobName string) []*Change
		// behind is written with the raw client.
		behind  func(t *testing.T, jobName string)
		changes func(s *Store, jobName string) []*Change
	}{
		{
			name: "300 worker reports after the job moved",
			known: func(s *Store, jobName string) []*Change {
				return []*Change{s.CreateJob(job(jobName, rdzvv1.JobState_JOB_STATE_PENDING, 0), false)}
			},
			behind: func(t *testing.T, jobName string) {
				putBehind(t, cli, JobKey(jobName), job(jobName, rdzvv1.JobState_JOB_STATE_RUNNING, 1))
			},
			changes: func(s *Store, jobName string) []*Change { return workerReports(s, jobName, 300, true) },
		},
		{
			name: "create of a name the store never saw",
			behind: func(t *testing.T, jobName string) {
				putBehind(t, cli, JobKey(jobName), job(jobName, rdzvv1.JobState_JOB_STATE_RUNNING, 1))
			},
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{s.CreateJob(job(jobName, rdzvv1.JobState_JOB_STATE_PENDING, 0), false, event(jobName, "job_submitted", t0))}
			},
		},
		{
			name: "replace of a job the store never saw",
			behind: func(t *testing.T, jobName string) {
				putBehind(t, cli, JobKey(jobName), job(jobName, rdzvv1.JobState_JOB_STATE_FAILED, 1))
				putBehind(t, cli, RoundKey(jobName, 1), round(jobName, 1, "n1"))
			},
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{s.CreateJob(job(jobName, rdzvv1.JobState_JOB_STATE_PENDING, 0), true)}
			},
		},
		{
			name: "node registered by someone else",
			behind: func(t *testing.T, jobName string) {
				putBehind(t, cli, NodeKey(jobName), &rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: jobName}})
			},
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{s.PutNode(&rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: jobName, Address: "10.0.0.9"}})}
			},
		},
		{
			name: "a stale change fails the unguarded ones packed with it",
			known: func(s *Store, jobName string) []*Change {
				return []*Change{s.CreateJob(job(jobName, rdzvv1.JobState_JOB_STATE_PENDING, 0), false)}
			},
			behind: func(t *testing.T, jobName string) {
				putBehind(t, cli, JobKey(jobName), job(jobName, rdzvv1.JobState_JOB_STATE_RUNNING, 1))
			},
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{
					s.AppendEvent(event("", "cluster_event", t0)),
					s.PutNode(&rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: jobName}}),
					s.UpdateJob(job(jobName, rdzvv1.JobState_JOB_STATE_STOPPING, 1)),
				}
			},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			jobName := fmt.Sprintf("conflict-%d", i)
			if tt.known != nil {
				commit(t, s, tt.known(s, jobName)...)
			}
			tt.behind(t, jobName)
			changes := tt.changes(s, jobName)
			before := revision(t, cli)
			n, rev, err := s.Commit(ctx(t), changes)
			require.ErrorIs(t, err, ErrConflict)
			require.NotErrorIs(t, err, ErrNotLeader)
			require.Zero(t, n)
			require.Zero(t, rev)
			_, err = s.CommitAll(ctx(t), changes...)
			require.ErrorIs(t, err, ErrConflict)
			require.Equal(t, before, revision(t, cli), "a refused transaction wrote something")
		})
	}
}

// The job guard is checked by every transaction of a batch: a job that
// moves between two of them stops the rest, and the store carries on once
// it has reread the job.
func TestCommitGuardsEachTransaction(t *testing.T) {
	s, cli := newStore(t)
	commit(t, s, s.CreateJob(job("train", rdzvv1.JobState_JOB_STATE_RUNNING, 1), false))
	changes := workerReports(s, "train", 300, true)

	n, _, err := s.Commit(ctx(t), changes)
	require.NoError(t, err)
	require.Greater(t, n, 1)
	require.Less(t, n, 300)
	changes = changes[n:]

	putBehind(t, cli, JobKey("train"), job("train", rdzvv1.JobState_JOB_STATE_RUNNING, 2))
	_, err = s.CommitAll(ctx(t), changes...)
	require.ErrorIs(t, err, ErrConflict)
	require.Len(t, keys(t, cli, WorkersPrefix("train")), n, "reports landed after the job moved")
	require.Len(t, keys(t, cli, EventsPrefix("train")), n, "events landed after the job moved")

	// Guards are evaluated at commit, so the same changes go through once
	// the store has seen the job as it now is.
	_, err = s.Load(ctx(t))
	require.NoError(t, err)
	commit(t, s, changes...)
	require.Len(t, keys(t, cli, WorkersPrefix("train")), 300)
	require.Len(t, keys(t, cli, EventsPrefix("train")), 300)
}

// A change that cannot be encoded ends the transaction before it: what
// came before is written, and the next Commit, starting at it, reports it.
func TestCommitStopsAtAnEncodingError(t *testing.T) {
	s, cli := newStore(t)
	commit(t, s, s.CreateJob(job("train", rdzvv1.JobState_JOB_STATE_RUNNING, 1), false))
	changes := []*Change{
		s.PutWorker("train", "n1", &rdzvv1.WorkerStatus{Job: "train"}),
		// proto3 strings must be valid UTF-8.
		s.PutWorker("train", "n2", &rdzvv1.WorkerStatus{Job: "train", Message: "\xff"}),
		s.PutWorker("train", "n3", &rdzvv1.WorkerStatus{Job: "train"}),
	}
	n, _, err := s.Commit(ctx(t), changes)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{WorkerKey("train", "n1")}, keys(t, cli, WorkersPrefix("train")))

	before := revision(t, cli)
	n, _, err = s.Commit(ctx(t), changes[n:])
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrConflict)
	require.NotErrorIs(t, err, ErrNotLeader)
	require.Zero(t, n)
	_, err = s.CommitAll(ctx(t), changes[1:]...)
	require.Error(t, err)
	require.Equal(t, before, revision(t, cli), "nothing is written once the bad change is first")
}

// TestElide checks which writes Elide drops, and that committing what it
// leaves ends in the same stored state as committing everything, in fewer
// operations: real etcd, whose watch counts the keys written.
func TestElide(t *testing.T) {
	s, cli := newStore(t)
	stopped := func(s *Store, jobName, node string, events ...*rdzvv1.Event) *Change {
		return s.PutWorker(jobName, node, &rdzvv1.WorkerStatus{Job: jobName, Generation: 1, State: rdzvv1.WorkerState_WORKER_STATE_STOPPED}, events...)
	}
	tests := []struct {
		name    string
		changes func(s *Store, jobName string) []*Change
		pinned  []int
		// kept is, per change, how many operations are left (-1: dropped).
		kept []int
	}{
		{
			name: "reports before the round that supersedes them are dropped",
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{
					stopped(s, jobName, "n1"),
					stopped(s, jobName, "n2"),
					s.CommitRound(job(jobName, rdzvv1.JobState_JOB_STATE_RUNNING, 2), round(jobName, 2, "n1", "n2")),
				}
			},
			kept: []int{-1, -1, 2},
		},
		{
			name: "a report's event stays, its worker key goes",
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{
					stopped(s, jobName, "n1", event(jobName, "workers_exited", t0)),
					s.CommitRound(job(jobName, rdzvv1.JobState_JOB_STATE_RUNNING, 2), round(jobName, 2, "n1")),
				}
			},
			kept: []int{1, 2},
		},
		{
			name: "a pinned change keeps itself and everything before it whole",
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{
					stopped(s, jobName, "n1"),
					stopped(s, jobName, "n2"),
					stopped(s, jobName, "n3"),
					s.CommitRound(job(jobName, rdzvv1.JobState_JOB_STATE_RUNNING, 2), round(jobName, 2, "n1", "n2", "n3")),
				}
			},
			pinned: []int{1},
			kept:   []int{1, 1, -1, 2},
		},
		{
			name: "a barrier pins too",
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{
					stopped(s, jobName, "n1"),
					nil,
					s.CommitRound(job(jobName, rdzvv1.JobState_JOB_STATE_RUNNING, 2), round(jobName, 2, "n1")),
				}
			},
			pinned: []int{1},
			kept:   []int{1, 0, 2},
		},
		{
			name: "reports after the round stay",
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{
					s.CommitRound(job(jobName, rdzvv1.JobState_JOB_STATE_RUNNING, 2), round(jobName, 2, "n1")),
					s.PutWorker(jobName, "n1", &rdzvv1.WorkerStatus{Job: jobName, Generation: 2, State: rdzvv1.WorkerState_WORKER_STATE_RUNNING}),
				}
			},
			kept: []int{2, 1},
		},
		{
			name: "other jobs' reports stay",
			changes: func(s *Store, jobName string) []*Change {
				return []*Change{
					stopped(s, jobName+"-other", "n1"),
					s.CommitRound(job(jobName, rdzvv1.JobState_JOB_STATE_RUNNING, 2), round(jobName, 2, "n1")),
				}
			},
			kept: []int{1, 2},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The same changes, committed whole under one name and elided
			// under another, must leave the same state.
			var states [2]map[string]string
			for pass, elide := range []bool{false, true} {
				jobName := fmt.Sprintf("elide-%d-%d", i, pass) // one length: values hold it
				commit(t, s, s.CreateJob(job(jobName, rdzvv1.JobState_JOB_STATE_PENDING, 0), false))
				commit(t, s, s.CreateJob(job(jobName+"-other", rdzvv1.JobState_JOB_STATE_PENDING, 0), false))
				for _, n := range []string{"n1", "n2", "n3"} {
					commit(t, s, s.PutWorker(jobName, n, &rdzvv1.WorkerStatus{Job: jobName, Generation: 1, State: rdzvv1.WorkerState_WORKER_STATE_RUNNING}))
				}
				changes := tt.changes(s, jobName)
				if elide {
					store := slices.Clone(changes)
					Elide(store, func(i int) bool { return slices.Contains(tt.pinned, i) })
					kept := make([]int, len(store))
					for i, ch := range store {
						switch {
						case changes[i] == nil:
						case ch == nil:
							kept[i] = -1
						default:
							kept[i] = len(ch.l.ops)
						}
					}
					require.Equal(t, tt.kept, kept)
					changes = store
				}
				changes = slices.DeleteFunc(changes, func(c *Change) bool { return c == nil })
				commit(t, s, changes...)
				states[pass] = map[string]string{}
				for _, prefix := range []string{WorkersPrefix(jobName), WorkersPrefix(jobName + "-other"), RoundsPrefix(jobName)} {
					resp, err := cli.Get(ctx(t), prefix, clientv3.WithPrefix())
					require.NoError(t, err)
					for _, kv := range resp.Kvs {
						var w rdzvv1.WorkerStatus
						if prefix == WorkersPrefix(jobName) && proto.Unmarshal(kv.Value, &w) == nil && w.GetGeneration() < 2 {
							continue // superseded by the round: what a reader sees is the same
						}
						states[pass][strings.Replace(string(kv.Key), jobName, "JOB", 1)] = strings.ReplaceAll(string(kv.Value), jobName, "JOB")
					}
				}
				events, err := cli.Get(ctx(t), EventsPrefix(jobName), clientv3.WithPrefix(), clientv3.WithCountOnly())
				require.NoError(t, err)
				states[pass]["events"] = fmt.Sprint(events.Count)
			}
			require.Equal(t, states[0], states[1], "committing what Elide left ends where committing everything does")
		})
	}
}
