package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// failingOver answers each watch with the next event, as its replay, and
// then ends it as a controller losing the lead does, recording what each watch asked for.
type failingOver struct {
	rdzvv1.UnimplementedJobServiceServer
	mu   sync.Mutex
	reqs []*rdzvv1.WatchEventsRequest
	// job is what GetJob answers: pending until the third watch, which
	// sends the job's end.
	pending, done *rdzvv1.Job
}

func (f *failingOver) WatchEvents(req *rdzvv1.WatchEventsRequest, stream rdzvv1.JobService_WatchEventsServer) error {
	f.mu.Lock()
	f.reqs = append(f.reqs, proto.Clone(req).(*rdzvv1.WatchEventsRequest))
	n := len(f.reqs)
	f.mu.Unlock()
	ev := &rdzvv1.Event{Time: timestamppb.Now(), Job: "train", Kind: fmt.Sprintf("kind_%d", n), Message: fmt.Sprintf("event %d", n)}
	if n == 3 {
		ev.Kind = "job_succeeded"
	}
	cursor := fmt.Sprintf("cursor-%d", n)
	if err := stream.Send(&rdzvv1.WatchEventsResponse{Event: ev, Cursor: cursor}); err != nil {
		return err
	}
	if err := stream.Send(&rdzvv1.WatchEventsResponse{CaughtUp: true, Cursor: cursor}); err != nil {
		return err
	}
	return wire.Error(wire.ReasonNoLeader, "", "stopped leading")
}

func (f *failingOver) GetJob(context.Context, *rdzvv1.GetJobRequest) (*rdzvv1.GetJobResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) >= 3 {
		return &rdzvv1.GetJobResponse{Job: f.done}, nil
	}
	return &rdzvv1.GetJobResponse{Job: f.pending}, nil
}

func serveFailingOver(t *testing.T, f *failingOver) rdzvv1.JobServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	rdzvv1.RegisterJobServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return rdzvv1.NewJobServiceClient(conn)
}

// A watch that ends on a failover is resumed from the cursor of the last
// event, without the first request's tail, and every event is printed once.
func TestFollowEventsResumesFromTheCursor(t *testing.T) {
	f := &failingOver{}
	jobs := serveFailingOver(t, f)
	var out bytes.Buffer
	print := printEvents(&out, false)
	var warned []error
	err := followEvents(context.Background(), jobs, &rdzvv1.WatchEventsRequest{Job: "train", Tail: 5}, func(m *rdzvv1.WatchEventsResponse) (bool, error) {
		_, err := print(m)
		return m.GetCursor() == "cursor-3", err
	}, func(err error) { warned = append(warned, err) })
	require.NoError(t, err)
	require.Len(t, f.reqs, 3)
	require.Equal(t, uint32(5), f.reqs[0].GetTail())
	require.Empty(t, f.reqs[0].GetCursor())
	for i, r := range f.reqs[1:] {
		require.Equal(t, fmt.Sprintf("cursor-%d", i+1), r.GetCursor())
		require.Zero(t, r.GetTail())
		require.Equal(t, "train", r.GetJob())
	}
	require.Len(t, warned, 2, "each failover is reported")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3)
	for i, l := range lines {
		require.Contains(t, l, fmt.Sprintf("event %d", i+1))
	}
}

// --wait says why a job waits, then follows its events to its end.
func TestWaitForJobSaysWhyItIsPending(t *testing.T) {
	created := timestamppb.New(timestamppb.Now().AsTime().Add(-1e9))
	f := &failingOver{
		pending: &rdzvv1.Job{State: rdzvv1.JobState_JOB_STATE_PENDING, Reason: "waiting for nodes: 1 of 2 ready", CreatedAt: created},
		done:    &rdzvv1.Job{State: rdzvv1.JobState_JOB_STATE_SUCCEEDED, Reason: "all 2 nodes finished", CreatedAt: created},
	}
	jobs := serveFailingOver(t, f)
	get := func(ctx context.Context) (*rdzvv1.Job, error) {
		r, err := jobs.GetJob(ctx, &rdzvv1.GetJobRequest{Name: "train"})
		return r.GetJob(), err
	}
	var out bytes.Buffer
	job, err := waitForJob(context.Background(), jobs, "train", get, &out, func(error) {})
	require.NoError(t, err)
	require.Equal(t, rdzvv1.JobState_JOB_STATE_SUCCEEDED, job.GetState())
	require.Contains(t, out.String(), "pending")
	require.Contains(t, out.String(), "waiting for nodes: 1 of 2 ready")
	require.Contains(t, out.String(), "event 1")
}

// status JOB shows each incident's phases as the time after detection,
// "-" for a phase not reached.
func TestStatusShowsIncidents(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }
	var out bytes.Buffer
	printJob(&out, &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "train"}, Incidents: []*rdzvv1.Incident{
		{Generation: 1, Reason: "node node-a (rank 0): workers exited with code 1", FaultAt: ts(0), DetectedAt: ts(time.Second),
			FencedAt: ts(1500 * time.Millisecond), CommittedAt: ts(3 * time.Second), StartedAt: ts(4 * time.Second), FirstStepAt: ts(9 * time.Second)},
		{Generation: 2, Reason: "hang", FaultAt: ts(time.Minute), DetectedAt: ts(time.Minute)},
	}}, view{})
	lines := strings.Split(out.String(), "\n")
	var table []string
	for i, l := range lines {
		if strings.HasPrefix(l, "#") {
			table = lines[i : i+3]
		}
	}
	require.NotNil(t, table, out.String())
	require.Equal(t, []string{"#", "GEN", "DETECTED", "FAULT", "+FENCE", "+COMMIT", "+STARTED", "+FIRST", "STEP", "REASON"}, strings.Fields(table[0]))
	require.Equal(t, []string{"1", "1", "-1s", "+500ms", "+2s", "+3s", "+8s", "node"}, dropTime(strings.Fields(table[1]))[:8])
	require.Equal(t, []string{"2", "2", "-0s", "-", "-", "-", "-", "hang"}, dropTime(strings.Fields(table[2])))
}

// dropTime removes a row's date and time of day.
func dropTime(f []string) []string { return append(f[:2:2], f[4:]...) }
