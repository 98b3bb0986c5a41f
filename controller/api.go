package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/jobspec"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

const (
	defaultEventLimit = 1000
	maxEventLimit     = 10000
	// logBuffer is how many chunks may queue between an agent and a slow
	// `rdzvctl logs` reader before the stream is cut.
	logBuffer = 256
	// maxReasonBytes bounds an operator's cordon reason.
	maxReasonBytes = 1024
	// maxLogStreams and maxLogStreamsPerJob bound concurrent StreamLogs
	// calls: each holds a buffer here and an open file and a reader on a
	// node (where maxLogTails bounds them again).
	maxLogStreams       = 64
	maxLogStreamsPerJob = 8
)

// toStatus maps internal errors to gRPC status codes at the API boundary.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	var etcdErr rpctypes.EtcdError
	switch {
	case errors.Is(err, jobspec.ErrInvalid), errors.Is(err, store.ErrBadCursor):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, errNotFinished):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, errTooManyJobs):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, errNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, errAlreadyExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, store.ErrConflict):
		return status.Error(codes.Aborted, err.Error()+"; retry")
	case errors.Is(err, store.ErrNotLeader):
		// Lost the lead while serving: the client looks for the new leader.
		return wire.Error(wire.ReasonNoLeader, "", err.Error()+"; retry")
	case errors.Is(err, store.ErrUnavailable):
		return wire.Error(wire.ReasonEtcdUnavailable, "", err.Error()+"; changes are refused until etcd is back, running jobs continue")
	case errors.Is(err, errUnavailable), errors.As(err, &etcdErr):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	// The etcd client reports connectivity trouble as gRPC statuses
	// (Unavailable, DeadlineExceeded); keep their code, add our context.
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return status.Error(s.Code(), err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

type jobService struct {
	rdzvv1.UnimplementedJobServiceServer
	c          *Controller
	logStreams logStreamLimit
}

// logStreamLimit counts StreamLogs calls in flight, in all and per job.
// Viewers get at most half of either, so that however many streams a
// read-only certificate opens, operators can still follow a job.
type logStreamLimit struct {
	mu     sync.Mutex
	total  streamCount
	perJob map[string]streamCount
}

type streamCount struct{ all, viewers int }

// admit refuses one more stream where limit are open, or a viewer's where
// viewers hold half of them.
func (n streamCount) admit(limit int, viewer bool, where string) error {
	switch {
	case n.all >= limit:
		return status.Errorf(codes.ResourceExhausted, "%d log streams %s are open, the most allowed; retry later", n.all, where)
	case viewer && n.viewers >= limit/2:
		return status.Errorf(codes.ResourceExhausted, "viewers hold %d log streams %s, the most they may (half of %d, so that operators can always follow); retry later",
			n.viewers, where, limit)
	}
	return nil
}

func (n *streamCount) add(viewer bool, d int) {
	n.all += d
	if viewer {
		n.viewers += d
	}
}

// acquire takes a place for a stream of job's log, or says why there is
// none; release gives it back.
func (l *logStreamLimit) acquire(job string, viewer bool) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.total.admit(maxLogStreams, viewer, "on this controller"); err != nil {
		return nil, err
	}
	if err := l.perJob[job].admit(maxLogStreamsPerJob, viewer, "of job "+job); err != nil {
		return nil, err
	}
	if l.perJob == nil {
		l.perJob = map[string]streamCount{}
	}
	l.take(job, viewer, 1)
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.take(job, viewer, -1)
	}, nil
}

// take counts d more streams of job. Callers hold l.mu.
func (l *logStreamLimit) take(job string, viewer bool, d int) {
	l.total.add(viewer, d)
	n := l.perJob[job]
	n.add(viewer, d)
	if n.all == 0 {
		delete(l.perJob, job)
		return
	}
	l.perJob[job] = n
}

func (s *jobService) StartJob(ctx context.Context, req *rdzvv1.StartJobRequest) (*rdzvv1.StartJobResponse, error) {
	job, err := s.c.startJob(ctx, req.GetSpec())
	if err != nil {
		return nil, toStatus(err)
	}
	return &rdzvv1.StartJobResponse{Job: job}, nil
}

func (s *jobService) GetJob(_ context.Context, req *rdzvv1.GetJobRequest) (*rdzvv1.GetJobResponse, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	js := s.c.jobs[req.GetName()]
	if js == nil {
		return nil, status.Errorf(codes.NotFound, "job %s not found", req.GetName())
	}
	return &rdzvv1.GetJobResponse{Job: s.c.jobView(js)}, nil
}

func (s *jobService) ListJobs(_ context.Context, req *rdzvv1.ListJobsRequest) (*rdzvv1.ListJobsResponse, error) {
	resp, err := s.c.listJobs(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return resp, nil
}

func (s *jobService) StopJob(ctx context.Context, req *rdzvv1.StopJobRequest) (*rdzvv1.StopJobResponse, error) {
	job, err := s.c.stopJob(ctx, req.GetName())
	if err != nil {
		return nil, toStatus(err)
	}
	return &rdzvv1.StopJobResponse{Job: job}, nil
}

func (s *jobService) DeleteJob(ctx context.Context, req *rdzvv1.DeleteJobRequest) (*rdzvv1.DeleteJobResponse, error) {
	if err := s.c.deleteJob(ctx, req.GetName()); err != nil {
		return nil, toStatus(err)
	}
	return &rdzvv1.DeleteJobResponse{}, nil
}

func (s *jobService) ListEvents(ctx context.Context, req *rdzvv1.ListEventsRequest) (*rdzvv1.ListEventsResponse, error) {
	resp, err := s.c.listEvents(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

// StreamLogs relays a job's log from the node that holds it: the agent
// reads its local file and sends chunks over its stream, so output is never
// shipped anywhere unless an operator asks for it.
func (s *jobService) StreamLogs(req *rdzvv1.StreamLogsRequest, stream rdzvv1.JobService_StreamLogsServer) error {
	c := s.c
	caller, _ := identityFrom(stream.Context())
	release, err := s.logStreams.acquire(req.GetJob(), caller.Role == pki.RoleViewer)
	if err != nil {
		return err
	}
	defer release()
	c.mu.Lock()
	js := c.jobs[req.GetJob()]
	if js == nil {
		c.mu.Unlock()
		return status.Errorf(codes.NotFound, "job %s not found", req.GetJob())
	}
	node := req.GetNode()
	if node == "" {
		if len(js.round.GetNodes()) == 0 {
			c.mu.Unlock()
			return status.Errorf(codes.FailedPrecondition, "job %s has not run on any node yet", req.GetJob())
		}
		node = js.round.GetNodes()[0].GetNode()
	}
	ns := c.nodes[node]
	var sess *session
	if ns != nil {
		sess = ns.session
	}
	c.mu.Unlock()
	if ns == nil {
		return status.Errorf(codes.NotFound, "node %s not found", node)
	}
	if sess == nil {
		return status.Errorf(codes.Unavailable, "node %s is not connected; its logs are on the node under the agent's state directory", node)
	}

	id := newID()
	chunks := sess.expect(id, logBuffer)
	defer sess.forget(id)
	sess.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_LogTail{LogTail: &rdzvv1.LogTail{
		RequestId: id, Job: req.GetJob(), TailBytes: req.GetTailBytes(), Follow: req.GetFollow(),
	}}})
	cancel := func() {
		sess.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_LogCancel{LogCancel: &rdzvv1.LogCancel{RequestId: id}}})
	}
	for {
		select {
		case <-stream.Context().Done():
			cancel()
			return nil
		case <-sess.ctx.Done():
			return status.Errorf(codes.Unavailable, "node %s disconnected while streaming logs", node)
		case m := <-chunks:
			chunk := m.GetLogChunk()
			if chunk.GetError() != "" {
				return status.Errorf(codes.NotFound, "reading logs of job %s on %s: %s", req.GetJob(), node, chunk.GetError())
			}
			if len(chunk.GetData()) > 0 {
				if err := stream.Send(&rdzvv1.StreamLogsResponse{Node: node, Data: chunk.GetData()}); err != nil {
					cancel()
					return fmt.Errorf("sending logs: %w", err)
				}
			}
			if chunk.GetEof() {
				return nil
			}
			if len(chunks) == cap(chunks) {
				cancel()
				return status.Errorf(codes.ResourceExhausted, "log stream of %s fell behind; retry with a smaller --tail", node)
			}
		}
	}
}

type nodeService struct {
	rdzvv1.UnimplementedNodeServiceServer
	c *Controller
}

func (s *nodeService) ListNodes(_ context.Context, req *rdzvv1.ListNodesRequest) (*rdzvv1.ListNodesResponse, error) {
	resp, err := s.c.listNodes(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return resp, nil
}

func (s *nodeService) CordonNode(ctx context.Context, req *rdzvv1.CordonNodeRequest) (*rdzvv1.CordonNodeResponse, error) {
	reason := req.GetReason()
	if reason == "" {
		reason = "by operator"
	}
	n, err := s.c.cordon(ctx, req.GetName(), true, reason)
	if err != nil {
		return nil, toStatus(err)
	}
	return &rdzvv1.CordonNodeResponse{Node: n}, nil
}

func (s *nodeService) UncordonNode(ctx context.Context, req *rdzvv1.UncordonNodeRequest) (*rdzvv1.UncordonNodeResponse, error) {
	n, err := s.c.cordon(ctx, req.GetName(), false, "")
	if err != nil {
		return nil, toStatus(err)
	}
	return &rdzvv1.UncordonNodeResponse{Node: n}, nil
}
