package controller

import (
	"context"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// ReadOnly is the API's read methods, called in process (the dashboard):
// what a viewer's certificate may call, answered as the gRPC API answers
// it, refusals of a controller that does not lead included. It has no
// method that changes anything.
type ReadOnly struct {
	jobs  *jobService
	nodes *nodeService
}

// ReadOnly is c's read API in process.
func (c *Controller) ReadOnly() ReadOnly {
	return ReadOnly{jobs: &jobService{c: c}, nodes: &nodeService{c: c}}
}

// check is what the gRPC interceptors check before a read: the lead, and
// the request itself.
func (r ReadOnly) check(req any) error {
	if err := r.jobs.c.gate.check(); err != nil {
		return err
	}
	return validateRequest(req)
}

func (r ReadOnly) ListNodes(ctx context.Context, req *rdzvv1.ListNodesRequest) (*rdzvv1.ListNodesResponse, error) {
	if err := r.check(req); err != nil {
		return nil, err
	}
	return r.nodes.ListNodes(ctx, req)
}

func (r ReadOnly) SummarizeNodes(ctx context.Context, req *rdzvv1.SummarizeNodesRequest) (*rdzvv1.SummarizeNodesResponse, error) {
	if err := r.check(req); err != nil {
		return nil, err
	}
	return r.nodes.SummarizeNodes(ctx, req)
}

func (r ReadOnly) ListJobs(ctx context.Context, req *rdzvv1.ListJobsRequest) (*rdzvv1.ListJobsResponse, error) {
	if err := r.check(req); err != nil {
		return nil, err
	}
	return r.jobs.ListJobs(ctx, req)
}

func (r ReadOnly) GetJob(ctx context.Context, req *rdzvv1.GetJobRequest) (*rdzvv1.GetJobResponse, error) {
	if err := r.check(req); err != nil {
		return nil, err
	}
	return r.jobs.GetJob(ctx, req)
}

func (r ReadOnly) ListEvents(ctx context.Context, req *rdzvv1.ListEventsRequest) (*rdzvv1.ListEventsResponse, error) {
	if err := r.check(req); err != nil {
		return nil, err
	}
	return r.jobs.ListEvents(ctx, req)
}

// WatchEvents calls send with each message of the watch, until ctx ends
// (nil), send fails or the watch ends (its error, as a gRPC status).
func (r ReadOnly) WatchEvents(ctx context.Context, req *rdzvv1.WatchEventsRequest, send func(*rdzvv1.WatchEventsResponse) error) error {
	if err := r.check(req); err != nil {
		return err
	}
	err := r.jobs.c.watchEvents(ctx, req, send)
	if err != nil && ctx.Err() == nil {
		return toStatus(err)
	}
	return nil
}
