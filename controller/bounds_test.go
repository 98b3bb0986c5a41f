package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// Beyond limits.max_active_jobs unfinished jobs, StartJob is refused with
// the cap and the count, and nothing is written; a finished job frees its
// place.
func TestActiveJobCap(t *testing.T) {
	c := newCluster(t, func(cfg *controller.Config) { cfg.Limits.MaxActiveJobs = 2 })
	// No nodes: both wait, pending, as long as the test needs.
	c.startJob(c.spec("first", 1, 1, "ok"))
	c.startJob(c.spec("second", 1, 1, "ok"))

	tests := []struct {
		name     string
		before   func()
		job      string
		wantCode codes.Code
		wantMsg  string
	}{
		{"over the cap", nil, "third", codes.ResourceExhausted,
			"job third refused: 2 jobs are pending or running, the most limits.max_active_jobs (2) allows"},
		{"a name already active is refused as such", nil, "first", codes.AlreadyExists, "job first is PENDING"},
		{"a stopped job frees its place", func() { c.stopJob("second") }, "third", codes.OK, ""},
		{"a finished job's name is started again within the cap", func() { c.stopJob("third") }, "second", codes.OK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.before != nil {
				tt.before()
			}
			before := c.etcdRevision()
			_, err := c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: c.spec(tt.job, 1, 1, "ok")})
			require.Equal(t, tt.wantCode, status.Code(err), "%v", err)
			if tt.wantCode == codes.OK {
				require.Equal(t, pending, c.getJob(tt.job).GetState())
				return
			}
			require.ErrorContains(t, err, tt.wantMsg)
			require.Equal(t, before, c.etcdRevision(), "a refused start wrote to etcd")
		})
	}
}

// bigSpec is a job spec of about 480 KiB, within the 512 KiB limit: big
// environment values, as in the report that broke `rdzvctl list`.
func (c *cluster) bigSpec(name string) *rdzvv1.JobSpec {
	spec := c.spec(name, 1, 1, "ok")
	for i := range 15 {
		spec.Env[fmt.Sprintf("BIG_%d", i)] = strings.Repeat("x", wire.MaxEnvValueBytes-64)
	}
	spec.LauncherExtraArgs = []string{"--monitor_interval", "1"}
	return spec
}

// listJobPages follows ListJobs' pages and returns each page.
func (c *cluster) listJobPages(req *rdzvv1.ListJobsRequest) [][]*rdzvv1.Job {
	c.t.Helper()
	var pages [][]*rdzvv1.Job
	for {
		resp, err := c.jobs.ListJobs(rpcCtx(c.t), req)
		require.NoError(c.t, err)
		require.LessOrEqual(c.t, proto.Size(resp), wire.MaxPageBytes+1024, "a page over its bound")
		pages = append(pages, resp.GetJobs())
		if resp.GetNextPageToken() == "" {
			return pages
		}
		require.NotEqual(c.t, req.GetPageToken(), resp.GetNextPageToken())
		req = proto.CloneOf(req)
		req.PageToken = resp.GetNextPageToken()
	}
}

func jobNames(pages ...[]*rdzvv1.Job) []string {
	var names []string
	for _, p := range pages {
		for _, j := range p {
			names = append(names, j.GetSpec().GetName())
		}
	}
	return names
}

// 40 jobs of about 480 KiB (19 MiB in all, more than a gRPC message) are
// listed in pages that each fit the message limit, in creation order; the
// summary view omits the big fields and fits one page.
func TestListJobsInPages(t *testing.T) {
	c := newCluster(t)
	var want []string
	for i := range 40 {
		name := fmt.Sprintf("big-%02d", i)
		spec := c.bigSpec(name)
		require.Greater(t, proto.Size(spec), 470<<10)
		c.startJob(spec)
		want = append(want, name)
		if i%10 == 9 {
			c.stopJob(name) // finished jobs are listed too
		}
	}

	tests := []struct {
		name      string
		req       *rdzvv1.ListJobsRequest
		want      []string
		wantPages int
		// full: each job comes with its spec's environment.
		full bool
	}{
		{"summaries by default, one page", &rdzvv1.ListJobsRequest{}, want, 1, false},
		{"full jobs, pages of at most 4 MiB", &rdzvv1.ListJobsRequest{View: rdzvv1.JobView_JOB_VIEW_FULL}, want, 5, true},
		{"page size", &rdzvv1.ListJobsRequest{PageSize: 16}, want, 3, false},
		{"state filter", &rdzvv1.ListJobsRequest{States: []rdzvv1.JobState{stopped}, PageSize: 3},
			[]string{"big-09", "big-19", "big-29", "big-39"}, 2, false},
		{"two states", &rdzvv1.ListJobsRequest{States: []rdzvv1.JobState{stopped, pending}}, want, 1, false},
		{"no match", &rdzvv1.ListJobsRequest{States: []rdzvv1.JobState{running}}, nil, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pages := c.listJobPages(tt.req)
			require.Len(t, pages, tt.wantPages)
			require.Equal(t, tt.want, jobNames(pages...))
			for _, p := range pages {
				for _, j := range p {
					spec := j.GetSpec()
					require.Equal(t, tt.full, len(spec.GetEnv()) == 16, "env of %s", spec.GetName())
					require.Equal(t, tt.full, len(spec.GetCommand()) > 0, "command of %s", spec.GetName())
					require.Equal(t, tt.full, len(spec.GetLauncherExtraArgs()) > 0, "extra args of %s", spec.GetName())
					require.Equal(t, uint32(1), spec.GetNodesMin(), "a summary keeps what `rdzvctl list` shows")
					require.NotEmpty(t, j.GetState())
				}
			}
		})
	}

	// A token only continues the list that made it.
	resp, err := c.jobs.ListJobs(rpcCtx(t), &rdzvv1.ListJobsRequest{PageSize: 1})
	require.NoError(t, err)
	_, err = c.nodes.ListNodes(rpcCtx(t), &rdzvv1.ListNodesRequest{PageToken: resp.GetNextPageToken()})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "page_token:")
}

// Nodes are listed by name a page at a time, filtered by state (as shown:
// BUSY is a ready node with a job) and by labels.
func TestListNodesInPages(t *testing.T) {
	c := newCluster(t)
	c.addAgent("node-a", 0, map[string]string{"pool": "train"})
	c.addAgent("node-b", 0, map[string]string{"pool": "train", "rack": "r1"})
	c.addAgent("node-c", 2, map[string]string{"pool": "eval"})
	gone := c.connectFake("node-d")
	c.startJob(c.spec("hold", 1, 1, "hang"))
	busy := c.waitRunning("hold").GetAssignments()[0].GetNode()
	gone.crash()
	c.waitNode("node-d", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST })
	ready := []string{}
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if n != busy {
			ready = append(ready, n)
		}
	}

	tests := []struct {
		name string
		req  *rdzvv1.ListNodesRequest
		want []string
	}{
		{"all, one a page", &rdzvv1.ListNodesRequest{PageSize: 1}, []string{"node-a", "node-b", "node-c", "node-d"}},
		{"lost", &rdzvv1.ListNodesRequest{States: []rdzvv1.NodeState{rdzvv1.NodeState_NODE_STATE_LOST}}, []string{"node-d"}},
		{"busy", &rdzvv1.ListNodesRequest{States: []rdzvv1.NodeState{rdzvv1.NodeState_NODE_STATE_BUSY}}, []string{busy}},
		{"ready", &rdzvv1.ListNodesRequest{States: []rdzvv1.NodeState{rdzvv1.NodeState_NODE_STATE_READY}, PageSize: 1}, ready},
		{"selector", &rdzvv1.ListNodesRequest{Selector: map[string]string{"pool": "train"}}, []string{"node-a", "node-b"}},
		{"every label of the selector", &rdzvv1.ListNodesRequest{Selector: map[string]string{"pool": "train", "rack": "r1"}}, []string{"node-b"}},
		{"no match", &rdzvv1.ListNodesRequest{Selector: map[string]string{"pool": "none"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			pages := 0
			req := proto.CloneOf(tt.req)
			for {
				resp, err := c.nodes.ListNodes(rpcCtx(t), req)
				require.NoError(t, err)
				pages++
				for _, n := range resp.GetNodes() {
					got = append(got, n.GetInfo().GetName())
				}
				if resp.GetNextPageToken() == "" {
					break
				}
				req.PageToken = resp.GetNextPageToken()
			}
			require.Equal(t, tt.want, got)
			if tt.req.GetPageSize() == 1 {
				require.Equal(t, len(tt.want), pages, "one node a page, and no empty page after the last")
			}
		})
	}

	// The summary of the same nodes, node-c cordoned.
	_, err := c.nodes.CordonNode(rpcCtx(t), &rdzvv1.CordonNodeRequest{Name: "node-c", Reason: "bad fan"})
	require.NoError(t, err)
	count := func(state rdzvv1.NodeState, nodes, gpus int32) *rdzvv1.NodeStateCount {
		return &rdzvv1.NodeStateCount{State: state, Nodes: nodes, Gpus: gpus}
	}
	readyCount, busyCount := count(rdzvv1.NodeState_NODE_STATE_READY, 2, 2), count(rdzvv1.NodeState_NODE_STATE_BUSY, 1, 0)
	if busy == "node-c" {
		readyCount, busyCount = count(rdzvv1.NodeState_NODE_STATE_READY, 2, 0), count(rdzvv1.NodeState_NODE_STATE_BUSY, 1, 2)
	}
	lost := count(rdzvv1.NodeState_NODE_STATE_LOST, 1, 0)
	hold := []*rdzvv1.JobNodeCount{{Job: "hold", Nodes: 1}}
	train := &rdzvv1.SummarizeNodesResponse{Nodes: 2, States: []*rdzvv1.NodeStateCount{count(rdzvv1.NodeState_NODE_STATE_READY, 2, 0)}}
	if busy != "node-c" {
		train.States = []*rdzvv1.NodeStateCount{count(rdzvv1.NodeState_NODE_STATE_READY, 1, 0), count(rdzvv1.NodeState_NODE_STATE_BUSY, 1, 0)}
		train.Jobs = hold
	}
	summaries := []struct {
		name      string
		req       *rdzvv1.SummarizeNodesRequest
		want      *rdzvv1.SummarizeNodesResponse
		attention []string
	}{
		{"all", &rdzvv1.SummarizeNodesRequest{}, &rdzvv1.SummarizeNodesResponse{
			Nodes: 4, Gpus: 2, States: []*rdzvv1.NodeStateCount{readyCount, busyCount, lost}, Cordoned: 1, Jobs: hold, AttentionTotal: 2,
		}, []string{"node-c", "node-d"}},
		{"lost", &rdzvv1.SummarizeNodesRequest{States: []rdzvv1.NodeState{rdzvv1.NodeState_NODE_STATE_LOST}}, &rdzvv1.SummarizeNodesResponse{
			Nodes: 1, States: []*rdzvv1.NodeStateCount{lost}, AttentionTotal: 1,
		}, []string{"node-d"}},
		{"selector", &rdzvv1.SummarizeNodesRequest{Selector: map[string]string{"pool": "train"}}, train, nil},
		{"no match", &rdzvv1.SummarizeNodesRequest{Selector: map[string]string{"pool": "none"}}, &rdzvv1.SummarizeNodesResponse{}, nil},
	}
	for _, tt := range summaries {
		t.Run("summary "+tt.name, func(t *testing.T) {
			got, err := c.nodes.SummarizeNodes(rpcCtx(t), tt.req)
			require.NoError(t, err)
			var names []string
			for _, n := range got.GetAttention() {
				names = append(names, n.GetInfo().GetName())
			}
			require.Equal(t, tt.attention, names)
			got.Attention = nil
			require.Empty(t, cmp.Diff(tt.want, got, protocmp.Transform()))
		})
	}
}

// Events are listed oldest first, the newest `limit` of them across pages.
func TestListEventsInPages(t *testing.T) {
	c := newCluster(t)
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		c.connectFake(n).keepAlive()
	}
	all := c.events("")
	require.GreaterOrEqual(t, len(all), 3, "a registration each")
	tests := []struct {
		name string
		req  *rdzvv1.ListEventsRequest
		want []*rdzvv1.Event
	}{
		{"one a page", &rdzvv1.ListEventsRequest{PageSize: 1}, all},
		{"the newest two, one a page", &rdzvv1.ListEventsRequest{Limit: 2, PageSize: 1}, all[len(all)-2:]},
		{"the newest two in a page", &rdzvv1.ListEventsRequest{Limit: 2}, all[len(all)-2:]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []*rdzvv1.Event
			req := proto.CloneOf(tt.req)
			for {
				resp, err := c.jobs.ListEvents(rpcCtx(t), req)
				require.NoError(t, err)
				got = append(got, resp.GetEvents()...)
				if resp.GetNextPageToken() == "" {
					break
				}
				req.PageToken = resp.GetNextPageToken()
			}
			require.Len(t, got, len(tt.want))
			for i := range got {
				require.True(t, proto.Equal(tt.want[i], got[i]), "event %d: %v", i, got[i])
			}
		})
	}
	resp, err := c.jobs.ListEvents(rpcCtx(t), &rdzvv1.ListEventsRequest{PageSize: 1})
	require.NoError(t, err)
	_, err = c.jobs.ListEvents(rpcCtx(t), &rdzvv1.ListEventsRequest{Job: "other", PageToken: resp.GetNextPageToken()})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "a cluster events token continues no job's events: %v", err)
}

// jobKeys are the etcd prefixes that hold something of a job.
func jobKeys(job string) []string {
	return []string{"/rdzv/v1/jobs/" + job, "/rdzv/v1/rounds/" + job + "/", "/rdzv/v1/workers/" + job + "/",
		"/rdzv/v1/checkpoints/" + job + "/", "/rdzv/v1/events/" + job + "/"}
}

// DeleteJob refuses a job that has not finished and removes every key of
// one that has; its name then starts afresh, with generations above the
// deleted job's so that agents that ran it take the new one's assignments.
func TestDeleteJob(t *testing.T) {
	c := newCluster(t)
	a := c.connectFake("node-a")
	a.keepAlive()
	c.startJob(c.recoverable("train", 1, 3))
	a1 := a.run()
	a.checkpoint(a1, 10, "/ckpt/train/step-10")
	c.waitJob("train", func(j *rdzvv1.Job) bool { return j.GetLatestCheckpoint().GetStep() == 10 })
	viewer := rdzvv1.NewJobServiceClient(c.dial(c.issue(pki.Identity{Role: pki.RoleViewer, Name: "grafana"})))

	tests := []struct {
		name     string
		client   rdzvv1.JobServiceClient
		job      string
		wantCode codes.Code
		wantMsg  string
	}{
		{"running", c.jobs, "train", codes.FailedPrecondition, "job train is RUNNING; stop it first (rdzvctl stop train)"},
		{"unknown", c.jobs, "nope", codes.NotFound, "job nope"},
		{"by a viewer", viewer, "train", codes.PermissionDenied, "it needs a certificate of role operator"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := c.etcdRevision()
			_, err := tt.client.DeleteJob(rpcCtx(t), &rdzvv1.DeleteJobRequest{Name: tt.job})
			require.Equal(t, tt.wantCode, status.Code(err), "%v", err)
			require.ErrorContains(t, err, tt.wantMsg)
			require.Equal(t, before, c.etcdRevision(), "a refused delete wrote to etcd")
		})
	}
	for _, prefix := range jobKeys("train") {
		require.NotEmpty(t, c.etcdKeys(prefix), prefix)
	}

	a.report(a1, rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED, 0)
	c.waitJobState("train", succeeded)
	_, err := c.jobs.DeleteJob(rpcCtx(t), &rdzvv1.DeleteJobRequest{Name: "train"})
	require.NoError(t, err)
	for _, prefix := range jobKeys("train") {
		require.Empty(t, c.etcdKeys(prefix), prefix)
	}
	_, err = c.jobs.GetJob(rpcCtx(t), &rdzvv1.GetJobRequest{Name: "train"})
	require.Equal(t, codes.NotFound, status.Code(err))
	ev := c.waitEvent("", "job_deleted")
	require.Equal(t, "job train (SUCCEEDED, generation 1) deleted by operator/test-operator", ev.GetMessage())

	c.startJob(c.recoverable("train", 1, 3))
	a2 := a.run()
	require.Equal(t, uint64(2), a2.GetGeneration(), "generations go on above the deleted job's")
	c.waitJob("train", func(j *rdzvv1.Job) bool {
		return len(j.GetAssignments()) == 1 && j.GetAssignments()[0].GetState() == rdzvv1.WorkerState_WORKER_STATE_RUNNING
	})

	// A controller taking the lead counts on from there too.
	a.report(a2, rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED, 0)
	c.waitJobState("train", succeeded)
	_, err = c.jobs.DeleteJob(rpcCtx(t), &rdzvv1.DeleteJobRequest{Name: "train"})
	require.NoError(t, err)
	c.stopController()
	c.startController()
	c.startJob(c.spec("other", 1, 1, "ok"))
	require.Equal(t, uint64(2), c.getJob("other").GetGeneration(), "a new name starts at the floor")
}

// Nodes lost for longer than retention.lost_node_max_age are deleted, from
// memory and etcd, with a cluster event; a cordoned one is kept, and a
// deleted node's agent registers anew.
func TestLostNodesDeleted(t *testing.T) {
	c := newCluster(t, func(cfg *controller.Config) {
		cfg.Retention.Interval.Duration = 100 * time.Millisecond
		cfg.Retention.LostNodeMaxAge.Duration = time.Millisecond
	})
	kept, gone := c.connectFake("kept"), c.connectFake("gone")
	kept.keepAlive()
	gone.keepAlive()
	c.connectFake("alive").keepAlive()
	_, err := c.nodes.CordonNode(rpcCtx(t), &rdzvv1.CordonNodeRequest{Name: "kept", Reason: "bad GPU"})
	require.NoError(t, err)
	// Lost before "gone" is: by the pass that deletes "gone", "kept" has been
	// lost for longer.
	kept.crash()
	c.waitNode("kept", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST })
	gone.crash()
	poll(t, func() bool { _, ok := c.listNodes()["gone"]; return !ok }, func() string { return "the lost node was never deleted" })

	nodes := c.listNodes()
	require.Contains(t, nodes, "kept", "a cordoned node is kept")
	require.True(t, nodes["kept"].GetCordoned())
	require.Equal(t, rdzvv1.NodeState_NODE_STATE_READY, nodes["alive"].GetState())
	require.Equal(t, []string{"/rdzv/v1/nodes/alive", "/rdzv/v1/nodes/kept"}, c.etcdKeys("/rdzv/v1/nodes/"))
	ev := c.waitEvent("", "node_deleted")
	require.Equal(t, "gone", ev.GetNode())
	require.Contains(t, ev.GetMessage(), "longer than retention.lost_node_max_age (1ms)")

	c.connectFake("gone").keepAlive()
	c.waitNode("gone", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_READY })
	require.Contains(t, c.etcdKeys("/rdzv/v1/nodes/"), "/rdzv/v1/nodes/gone")
}

// Viewers hold at most half of a job's log streams: with their half taken,
// another viewer is refused and an operator still follows the job.
func TestViewersLeaveOperatorsLogStreams(t *testing.T) {
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)
	c.startJob(c.spec("train", 1, 1, "hang"))
	c.waitRunning("train")
	viewer := rdzvv1.NewJobServiceClient(c.dial(c.issue(pki.Identity{Role: pki.RoleViewer, Name: "grafana"})))
	// Streams stay open until the test ends, with no deadline to close them
	// earlier and free their places.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// follow opens a stream and reads it until the job's own output comes
	// (the first chunk may hold only rdzv's header line), or the refusal.
	follow := func(client rdzvv1.JobServiceClient) error {
		s, err := client.StreamLogs(ctx, &rdzvv1.StreamLogsRequest{Job: "train", Follow: true})
		require.NoError(t, err)
		var got strings.Builder
		for !strings.Contains(got.String(), "hello from node-a") {
			chunk, err := s.Recv()
			if err != nil {
				return err
			}
			got.Write(chunk.GetData())
		}
		return nil
	}
	for i := range 4 {
		require.NoError(t, follow(viewer), "viewer stream %d", i)
	}
	err := follow(viewer)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "viewers hold 4 log streams of job train")
	for range 4 {
		require.NoError(t, follow(c.jobs))
	}
	err = follow(c.jobs)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "8 log streams of job train are open, the most allowed")
}
