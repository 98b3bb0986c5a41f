package lifecycle

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

var t0 = time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)

const (
	pending    = rdzvv1.JobState_JOB_STATE_PENDING
	running    = rdzvv1.JobState_JOB_STATE_RUNNING
	recovering = rdzvv1.JobState_JOB_STATE_RECOVERING
	stopping   = rdzvv1.JobState_JOB_STATE_STOPPING
	succeeded  = rdzvv1.JobState_JOB_STATE_SUCCEEDED
	failed     = rdzvv1.JobState_JOB_STATE_FAILED
	stopped    = rdzvv1.JobState_JOB_STATE_STOPPED
)

// job is a record in state at generation 3, started a minute before t0,
// with restarts of max 3 used and a checkpoint at step 40.
func job(state rdzvv1.JobState, restarts uint32) *rdzvv1.Job {
	rec := &rdzvv1.Job{
		Spec: &rdzvv1.JobSpec{Name: "train", NodesMin: 2, NodesMax: 4, RestartMaxRestarts: 3,
			RestartBackoffInitial: durationpb.New(time.Second), RestartBackoffMax: durationpb.New(8 * time.Second)},
		State: state, Generation: 3, Restarts: restarts, StartedAt: timestamppb.New(t0.Add(-time.Minute)),
		LatestCheckpoint: &rdzvv1.Checkpoint{Step: 40, Generation: 3},
	}
	switch state {
	case running:
		rec.TrainingSince = timestamppb.New(t0.Add(-time.Minute))
	case recovering:
		rec.RecoveryStartedAt = timestamppb.New(t0.Add(-10 * time.Second))
	}
	return rec
}

// TestTransitions is the lifecycle's table: from a state, on an event,
// the state it moves to, the event written and the order the workers
// get. The record passed in is never changed.
func TestTransitions(t *testing.T) {
	trained := Failure{Reason: "node h2 (rank 1): workers killed by signal KILL", Latency: 2 * time.Second, Progressed: true}
	idle := Failure{Reason: "node h2 (rank 1): workers exited with code 1", Progressed: false}
	round := &rdzvv1.Round{Job: "train", Generation: 4, MasterAddr: "10.77.0.2", MasterPort: 29500,
		Nodes: []*rdzvv1.NodeAssignment{{Node: "h1"}, {Node: "h2"}}}
	for _, tc := range []struct {
		name  string
		from  *rdzvv1.Job
		on    func(*rdzvv1.Job) Transition
		state rdzvv1.JobState
		kind  string
		order Order
		// reason is a part of the new record's reason.
		reason string
	}{
		{"stop pending", job(pending, 0), func(j *rdzvv1.Job) Transition { tr, _ := Stop(j, t0); return tr },
			stopped, EventJobStopped, OrderEnd, "before it started"},
		{"stop running", job(running, 0), func(j *rdzvv1.Job) Transition { tr, _ := Stop(j, t0); return tr },
			stopping, EventJobStopping, OrderStop, "waiting for workers"},
		{"stop recovering", job(recovering, 1), func(j *rdzvv1.Job) Transition { tr, _ := Stop(j, t0); return tr },
			stopping, EventJobStopping, OrderStop, "waiting for workers"},
		{"stopping, every worker exited", job(stopping, 0), func(j *rdzvv1.Job) Transition { return Stopped(j, t0) },
			stopped, EventJobStopped, OrderEnd, "stopped by operator"},
		{"fail with a restart left", job(running, 0), func(j *rdzvv1.Job) Transition { return Fail(j, trained, t0) },
			recovering, EventAttemptFailed, OrderStopFailed, "restart 1 of 3 from checkpoint step 40"},
		{"fail with none left", job(running, 3), func(j *rdzvv1.Job) Transition { return Fail(j, trained, t0) },
			failed, EventJobFailed, OrderEnd, "no restarts left (max_restarts 3)"},
		{"fail in a crash loop", func() *rdzvv1.Job { j := job(running, 2); j.RestartsWithoutProgress = 2; return j }(),
			func(j *rdzvv1.Job) Transition { return Fail(j, idle, t0) },
			failed, EventJobFailed, OrderEnd, "crash loop: 3 attempts in a row"},
		{"grow", job(running, 0), func(j *rdzvv1.Job) Transition { return Grow(j, 2, 4, false, t0) },
			recovering, EventJobGrowing, OrderStopFailed, "growing from 2 to 4 nodes: restarting from checkpoint step 40"},
		{"grow from memory", job(running, 0), func(j *rdzvv1.Job) Transition { return Grow(j, 2, 4, true, t0) },
			recovering, EventJobGrowing, OrderStopFailed, "growing from 2 to 4 nodes: restarting from the newest in-memory step"},
		{"preflight leaves a node out", job(running, 0), func(j *rdzvv1.Job) Transition { return Replan(j, "h2", "nccl test failed", t0) },
			recovering, EventPreflightExcluded, OrderStopFailed, "without h2"},
		{"commit a pending job", job(pending, 0), func(j *rdzvv1.Job) Transition { return Committed(j, Commit{Round: round, Nodes: "[h1 h2]"}, t0) },
			running, EventRendezvousCommitted, OrderAssign, "running on 2 nodes"},
		{"commit a recovery from memory", job(recovering, 1),
			func(j *rdzvv1.Job) Transition {
				return Committed(j, Commit{Round: round, Nodes: "[h1 h2]", Resume: "from in-memory step 45"}, t0)
			},
			running, EventRendezvousCommitted, OrderAssign, "resumed from in-memory step 45"},
		{"rendezvous timeout", job(pending, 0), func(j *rdzvv1.Job) Transition { return Finish(j, failed, "rendezvous timed out after 1m0s", t0) },
			failed, EventJobFailed, OrderEnd, "rendezvous timed out"},
		{"every node succeeded", job(running, 0), func(j *rdzvv1.Job) Transition { return Finish(j, succeeded, "all 2 nodes finished", t0) },
			succeeded, EventJobSucceeded, OrderEnd, "all 2 nodes finished"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := proto.CloneOf(tc.from)
			tr := tc.on(tc.from)
			require.True(t, proto.Equal(before, tc.from), "the record passed in changed")
			require.Equal(t, tc.state, tr.Job.GetState())
			require.Equal(t, tc.kind, tr.Event.GetKind())
			require.Equal(t, tc.order, tr.Order)
			require.Contains(t, tr.Job.GetReason(), tc.reason)
			require.Equal(t, "train", tr.Event.GetJob())
			require.Equal(t, t0, tr.Event.GetTime().AsTime())
			if Terminal(tc.state) {
				require.Equal(t, t0, tr.Job.GetFinishedAt().AsTime())
				require.Equal(t, tr.Job.GetReason(), tr.Why)
			}
			if tc.state != running && tc.state != recovering {
				require.Nil(t, tr.Job.GetTrainingSince(), "an open interval outlived the state")
				require.Nil(t, tr.Job.GetRecoveryStartedAt(), "an open interval outlived the state")
			}
		})
	}
}

func TestStopIgnoresAJobNotRunning(t *testing.T) {
	for _, s := range []rdzvv1.JobState{stopping, succeeded, failed, stopped} {
		_, ok := Stop(job(s, 0), t0)
		require.False(t, ok, s.String())
	}
}

func TestReplanOfAJobNoLongerRunningOnlyRecords(t *testing.T) {
	tr := Replan(job(recovering, 1), "h2", "nccl test failed", t0)
	require.Nil(t, tr.Job)
	require.Equal(t, EventPreflightExcluded, tr.Event.GetKind())
	require.Equal(t, "h2", tr.Event.GetNode())
}

func TestFailRecovers(t *testing.T) {
	from := job(running, 1)
	tr := Fail(from, Failure{Reason: "node h2 (rank 1): workers killed by signal KILL", Latency: 2 * time.Second, Progressed: true}, t0)
	rec := tr.Job
	require.Equal(t, uint32(2), rec.GetRestarts())
	require.Equal(t, uint32(0), rec.GetRestartsWithoutProgress())
	// Timed from the fault, not its detection; no backoff after progress.
	require.Equal(t, t0.Add(-2*time.Second), rec.GetRecoveryStartedAt().AsTime())
	require.Equal(t, t0, rec.GetRestartNotBefore().AsTime())
	require.Equal(t, time.Minute, rec.GetTrainingTime().AsDuration())
	require.Equal(t, 2*time.Second, tr.Event.GetDetectionLatency().AsDuration())
	require.Equal(t, uint64(3), tr.Event.GetGeneration())
	require.Equal(t, "generation 3 failed: node h2 (rank 1): workers killed by signal KILL", tr.Why)
	require.Len(t, rec.GetIncidents(), 1)
	inc := rec.GetIncidents()[0]
	require.Equal(t, uint64(3), inc.GetGeneration())
	require.Equal(t, t0, inc.GetDetectedAt().AsTime())
	require.Equal(t, t0.Add(-2*time.Second), inc.GetFaultAt().AsTime())

	// A failure without progress backs off (one more in a row would be a
	// crash loop).
	tr = Fail(job(running, 1), Failure{Reason: "exited with code 1"}, t0)
	require.Equal(t, recovering, tr.Job.GetState())
	require.Equal(t, uint32(1), tr.Job.GetRestartsWithoutProgress())
	require.Equal(t, t0.Add(time.Second), tr.Job.GetRestartNotBefore().AsTime())
}

func TestFailedForGoodKeepsTheIncident(t *testing.T) {
	tr := Fail(job(running, 3), Failure{Reason: strings.Repeat("é", 300)}, t0)
	require.Equal(t, failed, tr.Job.GetState())
	require.Len(t, tr.Job.GetIncidents(), 1)
	reason := tr.Job.GetIncidents()[0].GetReason()
	require.LessOrEqual(t, len(reason), MaxIncidentReasonBytes+len("..."))
	require.True(t, strings.HasSuffix(reason, "é..."), "cut inside a rune: %q", reason[len(reason)-8:])
}

func TestIncidentsAreBounded(t *testing.T) {
	rec := job(running, 0)
	rec.Spec.RestartMaxRestarts = 100
	for range MaxIncidents + 5 {
		rec = Fail(rec, Failure{Reason: "killed", Progressed: true}, t0).Job
		rec.State = running
	}
	require.Len(t, rec.GetIncidents(), MaxIncidents)
}

func TestBackoff(t *testing.T) {
	spec := &rdzvv1.JobSpec{RestartBackoffInitial: durationpb.New(time.Second), RestartBackoffMax: durationpb.New(5 * time.Second)}
	for consecutive, want := range []time.Duration{0, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second} {
		require.Equal(t, want, Backoff(spec, uint32(consecutive)), "consecutive %d", consecutive)
	}
	require.Equal(t, 5*time.Second, Backoff(spec, 1000))
}

// TestIncidentTimeline follows one failure to the first step after it:
// each phase is noted once, and the first step closes the incident.
func TestIncidentTimeline(t *testing.T) {
	rec := Fail(job(running, 0), Failure{Reason: "killed", Latency: time.Second, Progressed: true}, t0).Job
	NoteFenced(rec, t0.Add(-5*time.Second)) // before detection: counted from it
	require.Equal(t, t0, rec.GetIncidents()[0].GetFencedAt().AsTime())
	NoteFenced(rec, t0.Add(time.Second)) // noted once
	require.Equal(t, t0, rec.GetIncidents()[0].GetFencedAt().AsTime())

	round := &rdzvv1.Round{Job: "train", Generation: 4, Nodes: []*rdzvv1.NodeAssignment{{Node: "h1"}}}
	rec = Committed(rec, Commit{Round: round, Nodes: "[h1]"}, t0.Add(2*time.Second)).Job
	inc := rec.GetIncidents()[0]
	require.Equal(t, uint64(4), inc.GetNextGeneration())
	require.Equal(t, t0.Add(2*time.Second), inc.GetCommittedAt().AsTime())
	require.NotNil(t, rec.GetRecoveryStartedAt(), "recovering until the first step")

	_, ok := WorkersRunning(rec, t0.Add(3*time.Second), false)
	require.False(t, ok, "a job that reports steps recovers at its first step")
	require.Equal(t, t0.Add(3*time.Second), rec.GetIncidents()[0].GetStartedAt().AsTime())

	tr, ok := FirstStep(rec, t0.Add(4*time.Second))
	require.True(t, ok)
	require.Equal(t, EventRecovered, tr.Event.GetKind())
	require.Equal(t, "recovered from the failure of generation 3: detected 1s after the fault, fenced +0s, committed +2s, started +3s, first step +4s",
		tr.Event.GetMessage())
	require.NotNil(t, tr.Event.GetIncident())
	_, ok = FirstStep(tr.Job, t0.Add(5*time.Second))
	require.False(t, ok, "closed once")

	took, ok := ResumeTraining(rec, t0.Add(4*time.Second))
	require.True(t, ok)
	require.Equal(t, 5*time.Second, took)
	require.Nil(t, rec.GetRecoveryStartedAt())
	require.Equal(t, t0.Add(4*time.Second), rec.GetTrainingSince().AsTime())
	_, ok = ResumeTraining(rec, t0.Add(5*time.Second))
	require.False(t, ok)
}

func TestWorkersRunningClosesAJobWithoutSteps(t *testing.T) {
	rec := Fail(job(running, 0), Failure{Reason: "killed", Progressed: true}, t0).Job
	round := &rdzvv1.Round{Job: "train", Generation: 4, Nodes: []*rdzvv1.NodeAssignment{{Node: "h1"}}}
	rec = Committed(rec, Commit{Round: round, Nodes: "[h1]"}, t0).Job
	tr, ok := WorkersRunning(rec, t0.Add(time.Second), true)
	require.True(t, ok)
	require.Equal(t, EventRecovered, tr.Event.GetKind())
	_, ok = WorkersRunning(tr.Job, t0.Add(2*time.Second), true)
	require.False(t, ok)
}

func TestJudge(t *testing.T) {
	w := func(s rdzvv1.WorkerState, failure string) *rdzvv1.WorkerStatus {
		return &rdzvv1.WorkerStatus{State: s, Failure: failure, Message: failure + ": workdir /x: no such directory", Signal: "KILL"}
	}
	const (
		run  = rdzvv1.WorkerState_WORKER_STATE_RUNNING
		ok   = rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED
		fail = rdzvv1.WorkerState_WORKER_STATE_FAILED
		stop = rdzvv1.WorkerState_WORKER_STATE_STOPPED
	)
	for _, tc := range []struct {
		name      string
		exits     []Exit
		succeeded int
		want      Verdict
		node      string
	}{
		{"one succeeded of two", []Exit{{Node: "h1", Worker: w(ok, "")}}, 1, Continue, ""},
		{"the last succeeded", []Exit{{Node: "h2", Worker: w(ok, "")}}, 2, Succeeded, ""},
		{"still running", []Exit{{Node: "h1", Worker: w(run, "")}}, 0, Continue, ""},
		{"failed", []Exit{{Node: "h1", Worker: w(ok, "")}, {Node: "h2", Worker: w(fail, "")}}, 1, Failed, "h2"},
		{"stopped by its agent", []Exit{{Node: "h2", Worker: w(stop, "")}}, 0, Failed, "h2"},
		{"a node that cannot run the job", []Exit{{Node: "h2", Worker: w(fail, "workdir")}}, 0, Broken, "h2"},
		{"a fetch another attempt avoids", []Exit{{Node: "h2", Worker: w(fail, "memory_fetch"), Retry: true}}, 0, Failed, "h2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, e := Judge(tc.exits, tc.succeeded, 2)
			require.Equal(t, tc.want, v)
			require.Equal(t, tc.node, e.Node)
		})
	}
	e := Exit{Node: "h2", Rank: 1, Worker: w(fail, "workdir")}
	tr := BrokenOn(job(running, 0), e, t0)
	require.Equal(t, failed, tr.Job.GetState())
	require.Equal(t, "workdir: node h2 (rank 1): workdir /x: no such directory; not restarted, as a restart would fail the same way: fix the job file or the node, then start the job again",
		tr.Job.GetReason())
	require.Equal(t, "node h2 (rank 1): workers killed by signal KILL (workdir: workdir /x: no such directory)", e.Reason())
}

// TestImportsDoNoIO holds the package to its contract: a pure state
// machine imports nothing that reaches a file, the network, a lock or a
// clock of its own.
func TestImportsDoNoIO(t *testing.T) {
	allowed := map[string]bool{
		"fmt": true, "strings": true, "time": true, "unicode/utf8": true,
		"google.golang.org/protobuf/proto":                   true,
		"google.golang.org/protobuf/types/known/durationpb":  true,
		"google.golang.org/protobuf/types/known/timestamppb": true,
		"github.com/rdzv/rdzv/health":                        true,
		"github.com/rdzv/rdzv/proto/rdzv/v1":                 true,
	}
	clock := map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true, "AfterFunc": true,
		"NewTimer": true, "NewTicker": true, "Tick": true}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			require.NoError(t, err)
			require.True(t, allowed[path], "%s imports %s", name, path)
		}
		// The time is every function's argument: none reads a clock.
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "time" {
					require.False(t, clock[sel.Sel.Name], "%s: time.%s", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}

// Find's answer must not depend on where its search starts: the
// start is only a hint carried over from the previous search.
func TestFind(t *testing.T) {
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
				found := Find(tt.round, &from, func(a *rdzvv1.NodeAssignment) bool { return tt.matching[a.GetNode()] })
				require.Equal(t, tt.found, found, "start %d", start)
				if found {
					require.Equal(t, tt.at[start], tt.round.GetNodes()[from].GetNode(), "start %d", start)
				}
			}
		})
	}
}

// TestFencedAt: a generation is fenced once no connected node's workers
// run, at the latest of its lost nodes' own fencing deadlines.
func TestFencedAt(t *testing.T) {
	r := &rdzvv1.Round{Nodes: []*rdzvv1.NodeAssignment{{Node: "h1"}, {Node: "h2"}, {Node: "h3"}}}
	for _, tc := range []struct {
		name    string
		members map[string]Member
		at      time.Time
		ok      bool
	}{
		{"every worker exited", map[string]Member{}, time.Time{}, true},
		{"a connected node's workers run", map[string]Member{"h2": {Running: true}}, time.Time{}, false},
		{"lost nodes: the latest deadline", map[string]Member{"h1": {FencedBy: t0.Add(time.Second)}, "h3": {FencedBy: t0.Add(3 * time.Second)}},
			t0.Add(3 * time.Second), true},
		{"a lost node beside one that runs", map[string]Member{"h1": {FencedBy: t0}, "h3": {Running: true}}, time.Time{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for start := range 4 {
				cursor := start
				at, ok := FencedAt(r, &cursor, func(node string) Member { return tc.members[node] })
				require.Equal(t, tc.ok, ok, "start %d", start)
				require.Equal(t, tc.at, at, "start %d", start)
			}
		})
	}
	_, ok := FencedAt(nil, new(int), func(string) Member { return Member{Running: true} })
	require.True(t, ok, "no round: nothing runs")
}
