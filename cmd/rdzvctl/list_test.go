package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/internal/testaddr"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// pagedServer answers lists three items a page (or the page size asked, if
// smaller), with the index of the next item as the token, and records every
// request: a stand-in for the controller, whose paging is tested in
// controller/.
type pagedServer struct {
	rdzvv1.UnimplementedJobServiceServer
	rdzvv1.UnimplementedNodeServiceServer
	jobs   []*rdzvv1.Job
	nodes  []*rdzvv1.Node
	events []*rdzvv1.Event
	// live are the events WatchEvents sends after its replay of events;
	// then it ends the watch as for a deleted job.
	live []*rdzvv1.Event
	// summary answers SummarizeNodes; nil counts the nodes alone, and
	// noSummary answers Unimplemented, as a controller older than it.
	summary   *rdzvv1.SummarizeNodesResponse
	noSummary bool

	mu   sync.Mutex
	reqs []proto.Message
}

func page[T any](s *pagedServer, req proto.Message, items []T, token string, size int32) ([]T, string, error) {
	s.mu.Lock()
	s.reqs = append(s.reqs, proto.Clone(req))
	s.mu.Unlock()
	from := 0
	if token != "" {
		var err error
		if from, err = strconv.Atoi(token); err != nil {
			return nil, "", status.Error(codes.InvalidArgument, "bad token")
		}
	}
	n := 3
	if size > 0 && int(size) < n {
		n = int(size)
	}
	to := min(from+n, len(items))
	next := ""
	if to < len(items) {
		next = strconv.Itoa(to)
	}
	return items[from:to], next, nil
}

func (s *pagedServer) ListJobs(_ context.Context, req *rdzvv1.ListJobsRequest) (*rdzvv1.ListJobsResponse, error) {
	s.mu.Lock()
	all := s.jobs // replaced, never changed in place, by tests that change it
	s.mu.Unlock()
	jobs, next, err := page(s, req, all, req.GetPageToken(), req.GetPageSize())
	return &rdzvv1.ListJobsResponse{Jobs: jobs, NextPageToken: next}, err
}

func (s *pagedServer) ListNodes(_ context.Context, req *rdzvv1.ListNodesRequest) (*rdzvv1.ListNodesResponse, error) {
	nodes, next, err := page(s, req, s.nodes, req.GetPageToken(), req.GetPageSize())
	return &rdzvv1.ListNodesResponse{Nodes: nodes, NextPageToken: next}, err
}

func (s *pagedServer) SummarizeNodes(_ context.Context, req *rdzvv1.SummarizeNodesRequest) (*rdzvv1.SummarizeNodesResponse, error) {
	s.mu.Lock()
	s.reqs = append(s.reqs, proto.Clone(req))
	s.mu.Unlock()
	switch {
	case s.noSummary:
		return nil, status.Error(codes.Unimplemented, "unknown method SummarizeNodes")
	case s.summary != nil:
		return s.summary, nil
	}
	return &rdzvv1.SummarizeNodesResponse{Nodes: int32(len(s.nodes))}, nil
}

func (s *pagedServer) ListEvents(_ context.Context, req *rdzvv1.ListEventsRequest) (*rdzvv1.ListEventsResponse, error) {
	events, next, err := page(s, req, s.events, req.GetPageToken(), req.GetPageSize())
	return &rdzvv1.ListEventsResponse{Events: events, NextPageToken: next}, err
}

func (s *pagedServer) WatchEvents(req *rdzvv1.WatchEventsRequest, stream rdzvv1.JobService_WatchEventsServer) error {
	s.mu.Lock()
	s.reqs = append(s.reqs, proto.Clone(req))
	s.mu.Unlock()
	replay := s.events[max(0, len(s.events)-int(req.GetTail())):]
	for i, ev := range replay {
		if err := stream.Send(&rdzvv1.WatchEventsResponse{Event: ev, Cursor: strconv.Itoa(i)}); err != nil {
			return err
		}
	}
	if err := stream.Send(&rdzvv1.WatchEventsResponse{CaughtUp: true, Cursor: "caught-up"}); err != nil {
		return err
	}
	for i, ev := range s.live {
		if err := stream.Send(&rdzvv1.WatchEventsResponse{Event: ev, Cursor: fmt.Sprintf("live-%d", i)}); err != nil {
			return err
		}
	}
	return status.Error(codes.NotFound, "the job was deleted")
}

func (s *pagedServer) DeleteJob(_ context.Context, req *rdzvv1.DeleteJobRequest) (*rdzvv1.DeleteJobResponse, error) {
	s.mu.Lock()
	s.reqs = append(s.reqs, proto.Clone(req))
	s.mu.Unlock()
	if req.GetName() == "busy" {
		return nil, status.Error(codes.FailedPrecondition, "job busy is RUNNING; stop it first (rdzvctl stop busy), then delete it")
	}
	return &rdzvv1.DeleteJobResponse{}, nil
}

// requests returns the requests since the last call.
func (s *pagedServer) requests() []proto.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.reqs
	s.reqs = nil
	return r
}

func startPagedServer(t *testing.T) (*pagedServer, string) {
	s := &pagedServer{}
	for i := range 7 {
		s.jobs = append(s.jobs, &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: fmt.Sprintf("job-%d", i)}, State: rdzvv1.JobState_JOB_STATE_RUNNING})
		s.nodes = append(s.nodes, &rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: fmt.Sprintf("node-%d", i)}, State: rdzvv1.NodeState_NODE_STATE_READY})
		s.events = append(s.events, &rdzvv1.Event{Kind: fmt.Sprintf("kind_%d", i)})
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	rdzvv1.RegisterJobServiceServer(srv, s)
	rdzvv1.RegisterNodeServiceServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return s, lis.Addr().String()
}

// rows are the first column of a table's rows, without the header.
func rows(t *testing.T, out string) []string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	require.Equal(t, 1, strings.Count(out, "NAME")+strings.Count(out, "TIME"), "one header:\n%s", out)
	var first []string
	for _, l := range lines[1:] {
		first = append(first, strings.Fields(l)[0])
	}
	return first
}

func names(prefix string, idx ...int) []string {
	var out []string
	for _, i := range idx {
		out = append(out, fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

// Lists follow the controller's pages to the end, printing each as it
// comes, and pass their filters on.
func TestListsFollowPages(t *testing.T) {
	s, addr := startPagedServer(t)
	all := []int{0, 1, 2, 3, 4, 5, 6}
	tests := []struct {
		name     string
		args     []string
		wantRows []string
		// wantReqs are the requests the controller got, in order.
		wantReqs []proto.Message
	}{
		{"list", []string{"list"}, names("job", all...), []proto.Message{
			&rdzvv1.ListJobsRequest{View: rdzvv1.JobView_JOB_VIEW_SUMMARY},
			&rdzvv1.ListJobsRequest{View: rdzvv1.JobView_JOB_VIEW_SUMMARY, PageToken: "3"},
			&rdzvv1.ListJobsRequest{View: rdzvv1.JobView_JOB_VIEW_SUMMARY, PageToken: "6"},
		}},
		{"status without a job lists", []string{"status", "--state", "running,Failed"}, names("job", all...), []proto.Message{
			&rdzvv1.ListJobsRequest{View: rdzvv1.JobView_JOB_VIEW_SUMMARY, States: []rdzvv1.JobState{rdzvv1.JobState_JOB_STATE_RUNNING, rdzvv1.JobState_JOB_STATE_FAILED}},
			&rdzvv1.ListJobsRequest{View: rdzvv1.JobView_JOB_VIEW_SUMMARY, States: []rdzvv1.JobState{rdzvv1.JobState_JOB_STATE_RUNNING, rdzvv1.JobState_JOB_STATE_FAILED}, PageToken: "3"},
			&rdzvv1.ListJobsRequest{View: rdzvv1.JobView_JOB_VIEW_SUMMARY, States: []rdzvv1.JobState{rdzvv1.JobState_JOB_STATE_RUNNING, rdzvv1.JobState_JOB_STATE_FAILED}, PageToken: "6"},
		}},
		{"list stops at its limit", []string{"list", "--limit", "2"}, names("job", 0, 1), []proto.Message{
			&rdzvv1.ListJobsRequest{View: rdzvv1.JobView_JOB_VIEW_SUMMARY, PageSize: 2},
		}},
		{"nodes filtered", []string{"nodes", "--state", "lost,BUSY", "--selector", "pool=train,rack=r1"}, names("node", all...), []proto.Message{
			&rdzvv1.SummarizeNodesRequest{States: []rdzvv1.NodeState{rdzvv1.NodeState_NODE_STATE_LOST, rdzvv1.NodeState_NODE_STATE_BUSY},
				Selector: map[string]string{"pool": "train", "rack": "r1"}},
			&rdzvv1.ListNodesRequest{States: []rdzvv1.NodeState{rdzvv1.NodeState_NODE_STATE_LOST, rdzvv1.NodeState_NODE_STATE_BUSY},
				Selector: map[string]string{"pool": "train", "rack": "r1"}},
			&rdzvv1.ListNodesRequest{States: []rdzvv1.NodeState{rdzvv1.NodeState_NODE_STATE_LOST, rdzvv1.NodeState_NODE_STATE_BUSY},
				Selector: map[string]string{"pool": "train", "rack": "r1"}, PageToken: "3"},
			&rdzvv1.ListNodesRequest{States: []rdzvv1.NodeState{rdzvv1.NodeState_NODE_STATE_LOST, rdzvv1.NodeState_NODE_STATE_BUSY},
				Selector: map[string]string{"pool": "train", "rack": "r1"}, PageToken: "6"},
		}},
		{"nodes limit across pages", []string{"nodes", "--limit", "5"}, names("node", 0, 1, 2, 3, 4), []proto.Message{
			&rdzvv1.ListNodesRequest{PageSize: 5},
			&rdzvv1.ListNodesRequest{PageSize: 5, PageToken: "3"},
		}},
		{"events", []string{"events", "train", "--limit", "7"}, nil, []proto.Message{
			&rdzvv1.ListEventsRequest{Job: "train", Limit: 7},
			&rdzvv1.ListEventsRequest{Job: "train", Limit: 7, PageToken: "3"},
			&rdzvv1.ListEventsRequest{Job: "train", Limit: 7, PageToken: "6"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := runOK(t, append([]string{"--insecure", "--controller", addr}, tt.args...)...)
			reqs := s.requests()
			require.Len(t, reqs, len(tt.wantReqs))
			for i := range reqs {
				require.True(t, proto.Equal(tt.wantReqs[i], reqs[i]), "request %d: got %v, want %v", i, reqs[i], tt.wantReqs[i])
			}
			if tt.wantRows != nil {
				require.Equal(t, tt.wantRows, rows(t, out))
				return
			}
			for i := range 7 {
				require.Contains(t, out, fmt.Sprintf("kind_%d", i))
			}
		})
	}
}

// -o json prints one object holding every page's items, full jobs.
func TestListJSONSpansPages(t *testing.T) {
	s, addr := startPagedServer(t)
	for _, tt := range []struct {
		args  []string
		field string
	}{{[]string{"list"}, "jobs"}, {[]string{"nodes"}, "nodes"}, {[]string{"events"}, "events"}} {
		t.Run(tt.field, func(t *testing.T) {
			out := runOK(t, append([]string{"--insecure", "--controller", addr, "-o", "json"}, tt.args...)...)
			var got map[string][]json.RawMessage
			require.NoError(t, json.Unmarshal([]byte(out), &got), out)
			require.Len(t, got[tt.field], 7)
			reqs := s.requests()
			require.Len(t, reqs, 3)
			if r, ok := reqs[0].(*rdzvv1.ListJobsRequest); ok {
				require.Equal(t, rdzvv1.JobView_JOB_VIEW_FULL, r.GetView(), "scripts get whole jobs")
			}
		})
	}
	s.jobs = nil
	out := runOK(t, "--insecure", "--controller", addr, "-o", "json", "list")
	require.JSONEq(t, `{"jobs": []}`, out)
}

func TestListAndDeleteUsage(t *testing.T) {
	_, addr := startPagedServer(t)
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
		wantOut  string
	}{
		{"delete", []string{"delete", "done"}, 0, "", "job done deleted\n"},
		{"delete refused", []string{"delete", "busy"}, 1, "deleting job: job busy is RUNNING; stop it first", ""},
		{"delete needs a job", []string{"delete"}, 2, "delete takes one job name", ""},
		{"bad job state", []string{"list", "--state", "runing"}, 2, `--state: "runing" is not a state; want failed, pending, recovering, running, stopped, stopping, succeeded`, ""},
		{"unspecified is no state", []string{"list", "--state", "unspecified"}, 2, "is not a state", ""},
		{"bad node state", []string{"nodes", "--state", "pending"}, 2, `--state: "pending" is not a state; want busy, drained, lost, ready`, ""},
		{"bad selector", []string{"nodes", "--selector", "pool"}, 2, `--selector: "pool" is not key=value`, ""},
		{"negative limit", []string{"list", "--limit", "-1"}, 2, "--limit: must be 0 (all) or more, got -1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			code, err := run(context.Background(), append([]string{"--insecure", "--controller", addr}, tt.args...), &out, io.Discard)
			require.Equal(t, tt.wantCode, code, "err: %v", err)
			if tt.wantErr == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, tt.wantErr)
			}
			require.Equal(t, tt.wantOut, out.String())
		})
	}
}

// Shell completion offers the controller's job and node names.
func TestCompletesNames(t *testing.T) {
	_, addr := startPagedServer(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"logs", "job-"}, "job-0\njob-1\njob-2\n:4\n"},
		{[]string{"nodes", "drain", "node-1"}, "node-1\n:4\n"},
		{[]string{"status", "job-0", ""}, ":4\n"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out := runOK(t, append([]string{"--insecure", "--controller", addr, "__complete"}, tt.args...)...)
			require.Equal(t, tt.want, out)
		})
	}
}

// version asks the controller for its build; one that predates
// GetServerInfo is named as such, and --client asks nothing.
func TestVersionOfAnOlderServer(t *testing.T) {
	_, addr := startPagedServer(t)
	out := runOK(t, "--insecure", "--controller", addr, "version")
	require.Contains(t, out, "Client: ")
	require.Contains(t, out, "Server: unknown (the controller is older than GetServerInfo)\n")
	out = runOK(t, "--insecure", "--controller", testaddr.Free(t), "version", "--client", "-o", "json")
	var v struct {
		Client map[string]string `json:"client"`
		Server *struct{}         `json:"server"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.NotEmpty(t, v.Client["version"])
	require.Nil(t, v.Server)
}

// syncBuffer is a bytes.Buffer written by one goroutine and read by another.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// --watch prints the list again when it changed, and only then.
func TestWatchPrintsChanges(t *testing.T) {
	s, addr := startPagedServer(t)
	clock := clockwork.NewFakeClock()
	out := &syncBuffer{}
	c := &command{globals: defaultGlobals(), out: out, errOut: io.Discard, clock: clock}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		code, _ := runWith(ctx, c, []string{"--insecure", "--controller", addr, "list", "--watch", "-o", "name"})
		done <- code
	}()
	lines := func() []string { return strings.Fields(out.String()) }
	require.NoError(t, clock.BlockUntilContext(ctx, 1), "the watch never waited for its next poll")
	require.Equal(t, names("job", 0, 1, 2, 3, 4, 5, 6), lines())

	clock.Advance(watchEvery)
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	require.Len(t, lines(), 7, "unchanged, nothing is printed again")

	s.mu.Lock()
	s.jobs = s.jobs[:2]
	s.mu.Unlock()
	clock.Advance(watchEvery)
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	require.Equal(t, append(names("job", 0, 1, 2, 3, 4, 5, 6), "job-0", "job-1"), lines())

	cancel()
	require.Equal(t, 0, <-done, "interrupting a watch is no failure")
}

// A table of more than summaryAbove nodes is a summary, from one call;
// --all, --limit and data formats list every node; a controller without
// summaries is listed.
func TestNodesSummarized(t *testing.T) {
	s, addr := startPagedServer(t)
	big := &rdzvv1.SummarizeNodesResponse{Nodes: summaryAbove + 1, Attention: []*rdzvv1.Node{s.nodes[5]}, AttentionTotal: 1,
		States: []*rdzvv1.NodeStateCount{{State: rdzvv1.NodeState_NODE_STATE_READY, Nodes: summaryAbove + 1}}}
	listAll := []proto.Message{&rdzvv1.ListNodesRequest{}, &rdzvv1.ListNodesRequest{PageToken: "3"}, &rdzvv1.ListNodesRequest{PageToken: "6"}}
	tests := []struct {
		name      string
		args      []string
		noSummary bool
		summary   bool // printed a summary, not a list
		wantReqs  []proto.Message
	}{
		{"summary", []string{"nodes"}, false, true, []proto.Message{&rdzvv1.SummarizeNodesRequest{}}},
		{"wide summary", []string{"nodes", "-o", "wide"}, false, true, []proto.Message{&rdzvv1.SummarizeNodesRequest{}}},
		{"--all", []string{"nodes", "--all"}, false, false, listAll},
		{"--limit", []string{"nodes", "--limit", "2"}, false, false, []proto.Message{&rdzvv1.ListNodesRequest{PageSize: 2}}},
		{"json", []string{"nodes", "-o", "json"}, false, false, listAll},
		{"name", []string{"nodes", "-o", "name"}, false, false, listAll},
		{"older controller", []string{"nodes"}, true, false, append([]proto.Message{&rdzvv1.SummarizeNodesRequest{}}, listAll...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.summary, s.noSummary = big, tt.noSummary
			out := runOK(t, append([]string{"--insecure", "--controller", addr}, tt.args...)...)
			reqs := s.requests()
			require.Len(t, reqs, len(tt.wantReqs))
			for i := range reqs {
				require.True(t, proto.Equal(tt.wantReqs[i], reqs[i]), "request %d: got %v, want %v", i, reqs[i], tt.wantReqs[i])
			}
			if tt.summary {
				require.Contains(t, out, fmt.Sprintf("%d nodes, 0 GPUs (a summary", summaryAbove+1))
				require.Contains(t, out, "node-5", "the node needing attention is listed")
				require.NotContains(t, out, "node-0")
			} else {
				require.NotContains(t, out, "a summary")
				require.Contains(t, out, "node-0")
			}
		})
	}
}
