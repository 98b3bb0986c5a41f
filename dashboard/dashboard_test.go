package dashboard_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/dashboard"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeSource serves fixed answers; its watch sends events until the
// request ends.
type fakeSource struct {
	nodes []*rdzvv1.Node
	// summary answers SummarizeNodes: the controller counts every node,
	// of which ListNodes serves a page.
	summary *rdzvv1.SummarizeNodesResponse
	jobs    []*rdzvv1.Job
	events  []*rdzvv1.Event
	// watched records each watch's request.
	watched chan *rdzvv1.WatchEventsRequest
}

func (f *fakeSource) ListNodes(context.Context, *rdzvv1.ListNodesRequest) (*rdzvv1.ListNodesResponse, error) {
	return &rdzvv1.ListNodesResponse{Nodes: f.nodes}, nil
}

func (f *fakeSource) SummarizeNodes(context.Context, *rdzvv1.SummarizeNodesRequest) (*rdzvv1.SummarizeNodesResponse, error) {
	return f.summary, nil
}

func (f *fakeSource) ListJobs(context.Context, *rdzvv1.ListJobsRequest) (*rdzvv1.ListJobsResponse, error) {
	return &rdzvv1.ListJobsResponse{Jobs: f.jobs}, nil
}

func (f *fakeSource) GetJob(_ context.Context, req *rdzvv1.GetJobRequest) (*rdzvv1.GetJobResponse, error) {
	for _, j := range f.jobs {
		if j.GetSpec().GetName() == req.GetName() {
			return &rdzvv1.GetJobResponse{Job: j}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "job %s not found", req.GetName())
}

func (f *fakeSource) ListEvents(context.Context, *rdzvv1.ListEventsRequest) (*rdzvv1.ListEventsResponse, error) {
	return &rdzvv1.ListEventsResponse{Events: f.events}, nil
}

func (f *fakeSource) WatchEvents(ctx context.Context, req *rdzvv1.WatchEventsRequest, send func(*rdzvv1.WatchEventsResponse) error) error {
	f.watched <- req
	if err := send(&rdzvv1.WatchEventsResponse{Cursor: "1-", CaughtUp: true}); err != nil {
		return err
	}
	for i, ev := range f.events {
		if err := send(&rdzvv1.WatchEventsResponse{Event: ev, Cursor: strings.Repeat("x", i+1)}); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}

const evil = `<script>alert("x")</script>`

func newFake() *fakeSource {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }
	return &fakeSource{
		watched: make(chan *rdzvv1.WatchEventsRequest, 10),
		summary: &rdzvv1.SummarizeNodesResponse{Nodes: 10000, Gpus: 80000, States: []*rdzvv1.NodeStateCount{
			{State: rdzvv1.NodeState_NODE_STATE_READY, Nodes: 1, Gpus: 8},
			{State: rdzvv1.NodeState_NODE_STATE_BUSY, Nodes: 9998, Gpus: 79984},
			{State: rdzvv1.NodeState_NODE_STATE_LOST, Nodes: 1, Gpus: 8},
		}},
		nodes: []*rdzvv1.Node{
			{Info: &rdzvv1.NodeInfo{Name: "node-a", Gpus: []*rdzvv1.GPU{{Index: 0}, {Index: 1}}}, State: rdzvv1.NodeState_NODE_STATE_BUSY, Job: "train"},
			{Info: &rdzvv1.NodeInfo{Name: "node-b"}, State: rdzvv1.NodeState_NODE_STATE_LOST, Cordoned: true, CordonReason: evil},
		},
		jobs: []*rdzvv1.Job{{
			Spec: &rdzvv1.JobSpec{Name: "train"}, State: rdzvv1.JobState_JOB_STATE_RUNNING, Reason: evil, Generation: 2, CreatedAt: ts(0),
			Step: 120, ProgressAt: ts(20 * time.Second), Phase: rdzvv1.TrainingPhase_TRAINING_PHASE_SAVING, HangTimeout: durationpb.New(time.Hour),
			Metrics:     map[string]float64{"loss": 2.3125, "lr": 3e-4},
			Assignments: []*rdzvv1.NodeAssignment{{Node: "node-a", State: rdzvv1.WorkerState_WORKER_STATE_RUNNING}},
			Incidents: []*rdzvv1.Incident{{
				Generation: 1, NextGeneration: 2, Reason: evil, FaultAt: ts(time.Second), DetectedAt: ts(2 * time.Second),
				FencedAt: ts(3 * time.Second), CommittedAt: ts(5 * time.Second), StartedAt: ts(8 * time.Second), FirstStepAt: ts(13 * time.Second),
			}},
		}},
		events: []*rdzvv1.Event{{Time: ts(time.Second), Job: "train", Kind: "attempt_failed", Message: evil}},
	}
}

func get(t *testing.T, srv *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// Pages show what the API says, every value HTML-escaped.
func TestPages(t *testing.T) {
	srv := httptest.NewServer(dashboard.New(newFake(), zaptest.NewLogger(t)))
	defer srv.Close()

	for _, tc := range []struct {
		path string
		want []string
	}{
		{"/", []string{`data-node="node-a"`, `data-state="busy"`, `data-state="lost"`, `href="/jobs/train"`,
			// The cards count the whole cluster, not the table's page.
			`id="node-count">10000<`, `9998 busy`, `1 lost`, `<div class="big">80000</div>`, `79984 in jobs`}},
		{"/jobs/train", []string{`data-phase="detect"`, `data-phase="resume"`, `started → first step: 5s`, `generation 1 → 2`, `recovered in 12s`,
			`, saving, hang after 1h0m0s`, `<code>loss=2.3125</code> <code>lr=0.0003</code>`}},
		{"/nodes/node-a", []string{`id="node-state">busy`, `href="/jobs/train"`}},
	} {
		code, body := get(t, srv, tc.path)
		require.Equal(t, http.StatusOK, code, tc.path)
		for _, w := range tc.want {
			require.Contains(t, body, w, tc.path)
		}
		require.NotContains(t, body, "<script>alert", "%s: values are escaped", tc.path)
	}
	code, _ := get(t, srv, "/jobs/nope")
	require.Equal(t, http.StatusNotFound, code)
	code, _ = get(t, srv, "/jobs/Not_A_Name")
	require.Equal(t, http.StatusNotFound, code)
	code, body := get(t, srv, "/static/live.js")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "EventSource")
}

// Nothing but reads: every other method is refused, on every path.
func TestReadOnly(t *testing.T) {
	srv := httptest.NewServer(dashboard.New(newFake(), zaptest.NewLogger(t)))
	defer srv.Close()
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		for _, path := range []string{"/", "/jobs/train", "/events", "/static/style.css"} {
			req, err := http.NewRequest(method, srv.URL+path, strings.NewReader("x"))
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s %s", method, path)
		}
	}
}

// The event stream relays the watch as Server-Sent Events, resuming from
// the browser's Last-Event-ID, and ends with the request.
func TestEventStream(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(dashboard.New(f, zaptest.NewLogger(t)))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/events?job=train", nil)
	require.NoError(t, err)
	req.Header.Set("Last-Event-ID", "7-train/x")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	w := <-f.watched
	require.Equal(t, "train", w.GetJob())
	require.Equal(t, "7-train/x", w.GetCursor())
	lines := bufio.NewScanner(resp.Body)
	var got []string
	for len(got) < 3 && lines.Scan() {
		got = append(got, lines.Text())
	}
	require.Equal(t, "id: x", got[0])
	require.Equal(t, "event: rdzv", got[1])
	require.Contains(t, got[2], `"kind":"attempt_failed"`)
	cancel()
}
