package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

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
	if req.GetDryRun() {
		s.c.mu.Lock()
		err := s.c.jobs.admit(req.GetSpec().GetName(), s.c.cfg.Limits.MaxActiveJobs)
		candidates := s.c.nodes.candidates()
		s.c.mu.Unlock()
		if err != nil {
			return nil, toStatus(err)
		}
		job, preview := previewJob(req.GetSpec(), candidates, s.c.clock.Now())
		return &rdzvv1.StartJobResponse{Job: job, Placement: preview, Warnings: submitWarnings(req.GetSpec(), candidates)}, nil
	}
	job, warnings, err := s.c.startJob(ctx, req.GetSpec())
	if err != nil {
		return nil, toStatus(err)
	}
	return &rdzvv1.StartJobResponse{Job: job, Warnings: warnings}, nil
}

func (s *jobService) GetJob(_ context.Context, req *rdzvv1.GetJobRequest) (*rdzvv1.GetJobResponse, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	js := s.c.jobs[req.GetName()]
	if js == nil {
		return nil, status.Errorf(codes.NotFound, "job %s not found", req.GetName())
	}
	return &rdzvv1.GetJobResponse{Job: js.apiView(s.c.clock.Now())}, nil
}

func (s *jobService) ListJobs(_ context.Context, req *rdzvv1.ListJobsRequest) (*rdzvv1.ListJobsResponse, error) {
	tok, err := decodePageToken(req.GetPageToken(), jobsToken)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.jobs.list(req, tok, s.c.clock.Now()), nil
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
	if job := req.GetJob(); job != "" && req.GetPageToken() == "" {
		// As GetJob answers: a job's events go with the job (DeleteJob).
		s.c.mu.Lock()
		known := s.c.jobs[job] != nil
		s.c.mu.Unlock()
		if !known {
			return nil, status.Errorf(codes.NotFound, "job %s not found", job)
		}
	}
	resp, err := s.listEvents(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

// listEvents reads a page of events from etcd.
func (s *jobService) listEvents(ctx context.Context, req *rdzvv1.ListEventsRequest) (*rdzvv1.ListEventsResponse, error) {
	// Events are read from etcd: first let every decision made so far land
	// there, so that events agree with the states the API has shown.
	if err := s.c.settle(ctx); err != nil {
		return nil, fmt.Errorf("listing events: %w", err)
	}
	scope := store.ClusterScope
	if req.GetJob() != "" {
		scope = req.GetJob()
	}
	list := eventsToken + scope
	tok, err := decodePageToken(req.GetPageToken(), list)
	if err != nil {
		return nil, err
	}
	// The newest `limit` events in all pages: the first page finds where
	// they start, each token carries how many are left.
	left := int(req.GetLimit())
	if left == 0 {
		left = defaultEventLimit
	}
	if tok.After != "" {
		left = tok.Left
	}
	events, cursor, more, err := s.c.store.ListEvents(ctx, scope, store.EventPage{
		After: tok.After, Newest: left, MaxBytes: wire.MaxPageBytes,
		Limit: min(left, pageSize(req.GetPageSize(), defaultEventPageSize, maxEventPageSize)),
	})
	if err != nil {
		return nil, err
	}
	resp := &rdzvv1.ListEventsResponse{Events: events}
	if left -= len(events); more && left > 0 {
		resp.NextPageToken = pageToken{List: list, After: cursor, Left: left}.encode()
	}
	return resp, nil
}

// StreamLogs relays a job's log from the nodes that hold it: each agent
// reads its local file and sends chunks over its stream, so output is never
// shipped anywhere unless an operator asks for it. With all_nodes every
// node of the current generation is read at once and the chunks are
// merged as they come, each response naming its node.
func (s *jobService) StreamLogs(req *rdzvv1.StreamLogsRequest, stream rdzvv1.JobService_StreamLogsServer) error {
	caller, _ := identityFrom(stream.Context())
	release, err := s.logStreams.acquire(req.GetJob(), caller.Role == pki.RoleViewer)
	if err != nil {
		return err
	}
	defer release()
	targets, createdAt, err := s.logTargets(req)
	if err != nil {
		return err
	}
	type tagged struct {
		t     logTarget
		chunk *rdzvv1.LogChunk
		err   error
	}
	ctx, stop := context.WithCancel(stream.Context())
	defer stop()
	merged := make(chan tagged)
	for _, t := range targets {
		id := newID()
		chunks := t.sess.expect(id, logBuffer)
		t.sess.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_LogTail{LogTail: &rdzvv1.LogTail{
			RequestId: id, Job: req.GetJob(), TailBytes: req.GetTailBytes(), Follow: req.GetFollow(),
			TailLines: req.GetTailLines(), Since: req.GetSince(), RunCreatedAt: createdAt,
		}}})
		go func() {
			defer t.sess.forget(id)
			for {
				var m tagged
				select {
				case <-ctx.Done():
					// The operator left, or another node's stream ended it.
					t.sess.send(&rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_LogCancel{LogCancel: &rdzvv1.LogCancel{RequestId: id}}})
					return
				case <-t.sess.ctx.Done():
					m = tagged{t: t, err: status.Errorf(codes.Unavailable, "node %s disconnected while streaming logs", t.node)}
				case c := <-chunks:
					m = tagged{t: t, chunk: c.GetLogChunk()}
					if len(chunks) == cap(chunks) {
						m.err = status.Errorf(codes.ResourceExhausted, "log stream of %s fell behind; retry with a smaller --tail", t.node)
					}
				}
				select {
				case merged <- m:
				case <-ctx.Done():
				}
				if m.err != nil || m.chunk.GetEof() {
					return
				}
			}
		}()
	}
	for open := len(targets); open > 0; {
		var m tagged
		select {
		case <-stream.Context().Done():
			return nil
		case m = <-merged:
		}
		switch {
		case m.err != nil:
			return m.err
		case m.chunk.GetError() != "":
			return status.Errorf(codes.NotFound, "reading logs of job %s on %s: %s", req.GetJob(), m.t.node, m.chunk.GetError())
		case len(m.chunk.GetData()) > 0:
			if err := stream.Send(&rdzvv1.StreamLogsResponse{Node: m.t.node, NodeRank: m.t.rank, Data: m.chunk.GetData()}); err != nil {
				return fmt.Errorf("sending logs: %w", err)
			}
		}
		if m.chunk.GetEof() {
			open--
		}
	}
	return nil
}

// logTarget is one node a log stream reads from.
type logTarget struct {
	node string
	rank uint32
	sess *session
}

// logTargets are the nodes a StreamLogs call reads from, and when the
// job's current run was created (its older runs' output is skipped).
func (s *jobService) logTargets(req *rdzvv1.StreamLogsRequest) ([]logTarget, *timestamppb.Timestamp, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	js := c.jobs[req.GetJob()]
	if js == nil {
		return nil, nil, status.Errorf(codes.NotFound, "job %s not found", req.GetJob())
	}
	var targets []logTarget
	for _, a := range js.members.Round().GetNodes() {
		if req.GetAllNodes() || req.GetNode() == a.GetNode() || req.GetNode() == "" && a.GetNodeRank() == 0 {
			targets = append(targets, logTarget{node: a.GetNode(), rank: a.GetNodeRank()})
		}
	}
	if req.GetNode() != "" && len(targets) == 0 {
		// A node outside the current generation may still hold output
		// of an earlier one.
		targets = append(targets, logTarget{node: req.GetNode()})
	}
	if len(targets) == 0 {
		return nil, nil, status.Errorf(codes.FailedPrecondition, "job %s has not run on any node yet", req.GetJob())
	}
	for i, t := range targets {
		ns := c.nodes[t.node]
		if ns == nil {
			return nil, nil, status.Errorf(codes.NotFound, "node %s not found", t.node)
		}
		if ns.session == nil {
			return nil, nil, status.Errorf(codes.Unavailable, "node %s is not connected; its logs are on the node under the agent's state directory", t.node)
		}
		targets[i].sess = ns.session
	}
	return targets, js.rec.GetCreatedAt(), nil
}

type nodeService struct {
	rdzvv1.UnimplementedNodeServiceServer
	c *Controller
}

func (s *nodeService) ListNodes(_ context.Context, req *rdzvv1.ListNodesRequest) (*rdzvv1.ListNodesResponse, error) {
	tok, err := decodePageToken(req.GetPageToken(), nodesToken)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.nodes.list(req, tok), nil
}

func (s *nodeService) SummarizeNodes(_ context.Context, req *rdzvv1.SummarizeNodesRequest) (*rdzvv1.SummarizeNodesResponse, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.nodes.summarize(req), nil
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

func (s *nodeService) DrainNode(ctx context.Context, req *rdzvv1.DrainNodeRequest) (*rdzvv1.DrainNodeResponse, error) {
	reason := req.GetReason()
	if reason == "" {
		reason = "drained by operator"
	}
	n, err := s.c.drain(ctx, req.GetName(), reason, req.GetNow())
	if err != nil {
		return nil, toStatus(err)
	}
	return &rdzvv1.DrainNodeResponse{Node: n}, nil
}

func (s *nodeService) UncordonNode(ctx context.Context, req *rdzvv1.UncordonNodeRequest) (*rdzvv1.UncordonNodeResponse, error) {
	n, err := s.c.cordon(ctx, req.GetName(), false, "")
	if err != nil {
		return nil, toStatus(err)
	}
	return &rdzvv1.UncordonNodeResponse{Node: n}, nil
}
