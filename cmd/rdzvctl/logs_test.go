package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// logServer plays a job for logs -f: GetJob answers the job as it is
// now, which only the streams change (at points of their scripts), so that
// however often rdzvctl asks, it sees the same; StreamLogs plays the next
// script and records its request.
type logServer struct {
	rdzvv1.UnimplementedJobServiceServer
	mu sync.Mutex
	// before are answered first, one a call; then job.
	before  []*rdzvv1.Job
	job     *rdzvv1.Job
	streams []logScript
	reqs    []*rdzvv1.StreamLogsRequest
}

// logScript is one StreamLogs call: chunks; then the job becomes then (if
// set) and more is sent; then the call ends with err, or with hold stays
// open until rdzvctl ends it.
type logScript struct {
	chunks, more []*rdzvv1.StreamLogsResponse
	then         *rdzvv1.Job
	hold         bool
	err          error
}

func (s *logServer) GetJob(context.Context, *rdzvv1.GetJobRequest) (*rdzvv1.GetJobResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.before) > 0 {
		job := s.before[0]
		s.before = s.before[1:]
		return &rdzvv1.GetJobResponse{Job: job}, nil
	}
	return &rdzvv1.GetJobResponse{Job: s.job}, nil
}

func (s *logServer) StreamLogs(req *rdzvv1.StreamLogsRequest, stream rdzvv1.JobService_StreamLogsServer) error {
	s.mu.Lock()
	s.reqs = append(s.reqs, proto.CloneOf(req))
	script := s.streams[0]
	s.streams = s.streams[1:]
	s.mu.Unlock()
	send := func(chunks []*rdzvv1.StreamLogsResponse) error {
		for _, c := range chunks {
			if req.GetNode() != "" && c.GetNode() != req.GetNode() {
				continue
			}
			if err := stream.Send(c); err != nil {
				return err
			}
		}
		return nil
	}
	if err := send(script.chunks); err != nil {
		return err
	}
	if script.then != nil {
		s.mu.Lock()
		s.job = script.then
		s.mu.Unlock()
	}
	if err := send(script.more); err != nil {
		return err
	}
	if script.hold {
		<-stream.Context().Done()
		return nil
	}
	return script.err
}

// chunk is a piece of a node's log.
func chunk(node string, rank uint32, lines ...string) *rdzvv1.StreamLogsResponse {
	return &rdzvv1.StreamLogsResponse{Node: node, NodeRank: rank, Data: []byte(strings.Join(lines, ""))}
}

func marker(node string, gen, rank, nodes int) string {
	return fmt.Sprintf("=== rdzv: job train generation %d node %s rank %d/%d started 2026-03-04T11:0%d:00Z: torchrun train.py\n", gen, node, rank, nodes, gen)
}

func ended(gen int, state string) string {
	return fmt.Sprintf("=== rdzv: generation %d ended: WORKER_STATE_%s exit_code=1 signal=\"\" \n", gen, state)
}

func running(gen uint64, restarts uint32, nodes ...string) *rdzvv1.Job {
	j := &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "train"}, State: rdzvv1.JobState_JOB_STATE_RUNNING, Generation: gen, Restarts: restarts}
	for i, n := range nodes {
		j.Assignments = append(j.Assignments, &rdzvv1.NodeAssignment{Node: n, NodeRank: uint32(i)})
	}
	return j
}

var succeeded = &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "train"}, State: rdzvv1.JobState_JOB_STATE_SUCCEEDED, Generation: 2, Reason: "all workers exited 0"}

// A job that fails and recovers: a stream dropped midway and opened again,
// a node whose workers run on into the next generation (which keeps the
// stream open), a node whose next stream starts at the generation already
// printed.
func followScript() *logServer {
	gen1 := []*rdzvv1.StreamLogsResponse{
		chunk("gpu-01", 0, marker("gpu-01", 1, 0, 2), "step 1\n", "step 2 (no newline yet"),
		chunk("gpu-02", 1, marker("gpu-02", 1, 1, 2), "loss 0.9\n"),
	}
	gen1End := append(gen1,
		chunk("gpu-01", 0, ")\nstep 3\n", ended(1, "STOPPED")),
		chunk("gpu-02", 1, "CUDA error\n", ended(1, "FAILED")))
	return &logServer{
		job: running(1, 0, "gpu-01", "gpu-02"),
		streams: []logScript{
			// Generation 1, dropped by a failover.
			{chunks: gen1, err: wire.Error(wire.ReasonNoLeader, "", "stopped leading")},
			// Generation 1 again, to its end; gpu-01 runs on into
			// generation 2, its stream open.
			{chunks: gen1End, then: running(2, 1, "gpu-01", "gpu-03"),
				more: []*rdzvv1.StreamLogsResponse{chunk("gpu-01", 0, marker("gpu-01", 2, 0, 2), "resumed from step 3\n")}, hold: true},
			// Generation 2; gpu-01's log read from generation 1's start.
			{chunks: append(gen1End,
				chunk("gpu-01", 0, marker("gpu-01", 2, 0, 2), "resumed from step 3\n"),
				chunk("gpu-03", 1, marker("gpu-03", 2, 1, 2), "resumed from step 3\n", ended(2, "SUCCEEDED")),
				chunk("gpu-01", 0, "step 4\n", ended(2, "SUCCEEDED"))), then: succeeded},
		},
	}
}

// A job that waits for nodes, then runs once.
func pendingScript() *logServer {
	pending := &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "train"}, State: rdzvv1.JobState_JOB_STATE_PENDING, Reason: "waiting for nodes: 1 of 2 eligible"}
	done := proto.CloneOf(succeeded)
	done.Generation = 1
	return &logServer{
		before:  []*rdzvv1.Job{pending, pending},
		job:     running(1, 0, "gpu-01"),
		streams: []logScript{{chunks: []*rdzvv1.StreamLogsResponse{chunk("gpu-01", 0, marker("gpu-01", 1, 0, 1), "done\n", ended(1, "SUCCEEDED"))}, then: done}},
	}
}

// runFollow runs logs -f against s with a fake clock that the test moves
// on whenever rdzvctl waits.
func runFollow(t *testing.T, s *logServer, args ...string) (string, []*rdzvv1.StreamLogsRequest) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	rdzvv1.RegisterJobServiceServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	clock := clockwork.NewFakeClockAt(goldenNow)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for clock.BlockUntilContext(ctx, 1) == nil {
			clock.Advance(watchEvery)
		}
	}()
	var out, errOut bytes.Buffer
	c := &command{globals: defaultGlobals(), out: &out, errOut: &errOut, clock: clock}
	code, err := runWith(context.Background(), c, append([]string{"--insecure", "--controller", lis.Addr().String()}, args...))
	cancel()
	wg.Wait()
	require.NoError(t, err)
	require.Equal(t, 0, code)
	return fmt.Sprintf("$ rdzvctl %s\n--- stdout\n%s--- stderr\n%s", strings.Join(args, " "), out.String(),
		strings.ReplaceAll(errOut.String(), lis.Addr().String(), "ADDR")), s.reqs
}

// logs -f follows the job across its generations until it ends, marking
// each change, and prints each line once though streams are opened again.
func TestLogsFollowGolden(t *testing.T) {
	// Registered first, run last: after the servers have stopped.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	stableEnv(t)
	got, reqs := runFollow(t, followScript(), "logs", "train", "-f")
	golden(t, "logs/follow.golden", got)
	require.Len(t, reqs, 3)
	require.True(t, proto.Equal(&rdzvv1.StreamLogsRequest{Job: "train", Follow: true, AllNodes: true}, reqs[0]), "%v", reqs[0])
	for _, r := range reqs[1:] {
		require.True(t, r.GetSince().AsTime().After(goldenNow), "since: when the stream was opened, %v", r.GetSince())
		require.True(t, r.GetFollow() && r.GetAllNodes())
	}

	got, reqs = runFollow(t, followScript(), "logs", "train", "-f", "--node", "gpu-01")
	golden(t, "logs/follow-node.golden", got)
	require.Len(t, reqs, 3)
	for _, r := range reqs {
		require.Equal(t, "gpu-01", r.GetNode())
	}

	got, _ = runFollow(t, pendingScript(), "logs", "train", "-f")
	golden(t, "logs/follow-pending.golden", got)
}

// A job's output is arbitrary bytes, its own lines may look like the
// agent's generation lines: logWriter never panics, prints one node's log
// as it is, and prints nothing twice when a stream of the same log is
// opened again (cut into other chunks).
func FuzzLogWriter(f *testing.F) {
	f.Add([]byte(marker("n", 1, 0, 1)+"step 1\nstep 2"), uint8(3), uint8(5))
	f.Add([]byte("x\n"+marker("n", 2, 0, 1)+marker("n", 1, 0, 1)+"=== rdzv: job a generation 99999999999999999999 node\n"), uint8(1), uint8(7))
	f.Fuzz(func(t *testing.T, data []byte, cut1, cut2 uint8) {
		var out bytes.Buffer
		w := &logWriter{out: &out, nodes: map[string]*nodeLog{}}
		send := func(cut uint8) {
			step := int(cut)%64 + 1
			for i := 0; i < len(data); i += step {
				require.NoError(t, w.write(&rdzvv1.StreamLogsResponse{Node: "n", Data: data[i:min(i+step, len(data))]}))
			}
			require.NoError(t, w.flush())
		}
		send(cut1)
		require.Equal(t, string(data), out.String(), "one node's log, unprefixed, as it is")
		w.resync()
		send(cut2)
		require.Equal(t, string(data), out.String(), "the same log again: nothing printed twice")

		// Prefixed, two nodes: whole lines, each led by its node.
		out.Reset()
		p := &logWriter{out: &out, prefix: true, nodes: map[string]*nodeLog{}}
		for i, b := range data {
			require.NoError(t, p.write(&rdzvv1.StreamLogsResponse{Node: []string{"a", "b"}[i%2], Data: []byte{b}}))
		}
		require.NoError(t, p.flush())
		for _, line := range strings.SplitAfter(out.String(), "\n") {
			if line != "" {
				require.True(t, strings.HasPrefix(line, "a/0 ") || strings.HasPrefix(line, "b/0 "), "%q", line)
			}
		}
	})
}
