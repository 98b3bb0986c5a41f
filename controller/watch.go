package controller

// WatchEvents: events as they become durable.
//
// A watch reads etcd (a replay, then an etcd watch from where the replay's
// read ended), not the writer's queue: an event is in etcd only once its
// change committed, so nothing undone by a failed write ever reaches a
// watcher, the order is etcd's commit order (the same across a failover,
// so a cursor from one leader resumes on the next), and the write path
// does no work per watcher. etcd serves its watchers from its own history
// cache; the controller holds a bounded buffer per watcher, and drops the
// watcher that falls behind it rather than grow it.

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/controller/store"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

const (
	// watchBuffer is how many events may wait for a watcher that reads
	// slower than they are written before it is dropped.
	watchBuffer = 1024
	// maxWatches bounds concurrent WatchEvents calls: each holds an etcd
	// watch and a buffer.
	maxWatches = 256
)

// errLeadEnded ends a watch whose controller stopped leading.
var errLeadEnded = fmt.Errorf("this controller stopped leading: %w", store.ErrNotLeader)

func (s *jobService) WatchEvents(req *rdzvv1.WatchEventsRequest, stream rdzvv1.JobService_WatchEventsServer) error {
	err := s.c.watchEvents(stream.Context(), req, func(r *rdzvv1.WatchEventsResponse) error { return stream.Send(r) })
	if err != nil && stream.Context().Err() == nil {
		return toStatus(err)
	}
	return nil
}

// errFellBehind drops a watcher that did not keep up.
var errFellBehind = status.Errorf(codes.ResourceExhausted,
	"event watch fell %d events behind; watch again with the cursor of the last event received", watchBuffer)

// watchEvents sends what req asks for to send until ctx ends, the lead
// ends or the watch fails.
func (c *Controller) watchEvents(ctx context.Context, req *rdzvv1.WatchEventsRequest, send func(*rdzvv1.WatchEventsResponse) error) error {
	if n := c.watches.Add(1); n > maxWatches {
		c.watches.Add(-1)
		return status.Errorf(codes.ResourceExhausted, "%d event watches are open, the most allowed; retry later", maxWatches)
	}
	defer c.watches.Add(-1)
	c.mu.Lock()
	ended := c.leadEnded
	c.mu.Unlock()
	if ended == nil {
		return errLeadEnded
	}
	leading := func() error {
		select {
		case <-ended:
			return errLeadEnded
		default:
			return nil
		}
	}
	cursor, err := c.store.ReplayEvents(ctx, req.GetJob(), req.GetCursor(), int(req.GetTail()), func(se store.StoredEvent) error {
		if err := leading(); err != nil {
			return err
		}
		return send(&rdzvv1.WatchEventsResponse{Event: se.Event, Cursor: se.Cursor})
	})
	if err != nil {
		return err
	}
	if err := send(&rdzvv1.WatchEventsResponse{Cursor: cursor, CaughtUp: true}); err != nil {
		return err
	}

	// The etcd watch feeds a bounded buffer that this call drains into the
	// stream; when the stream is slow and the buffer full, the watch stops
	// and the watcher is told to come back from its cursor.
	buf := make(chan store.StoredEvent, watchBuffer)
	wctx, stop := context.WithCancel(ctx)
	var werr error
	var behind bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(buf)
		werr = c.store.WatchEvents(wctx, req.GetJob(), cursor, func(se store.StoredEvent) bool {
			select {
			case buf <- se:
				return true
			default:
				behind = true
				return false
			}
		})
	}()
	defer func() {
		stop()
		<-done
	}()
	for {
		select {
		case <-ended:
			return errLeadEnded
		case <-ctx.Done():
			return ctx.Err()
		case se, ok := <-buf:
			if !ok {
				// Everything buffered was sent; werr and behind were set
				// before buf closed.
				if behind {
					return errFellBehind
				}
				if werr == nil {
					werr = ctx.Err()
				}
				return werr
			}
			if err := send(&rdzvv1.WatchEventsResponse{Event: se.Event, Cursor: se.Cursor}); err != nil {
				return err
			}
		}
	}
}
