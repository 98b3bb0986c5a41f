package wire

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
)

// A relay and the controller exchange many agents' messages as frames of
// one stream (rdzv.v1.RelayService.Carry). Each side queues the frames it
// sends in a FrameQueue, and the controller queues those it handles in
// order in one too.

// CarryQueue bounds the frames waiting in one FrameQueue. A peer this far
// behind is given up: the call ends, and its agents reconnect and
// re-synchronise, as a direct agent whose own queue overflows does.
const CarryQueue = 64 << 10

// CarryBatchBytes bounds the frames of one message; a frame larger than
// this goes alone (no larger than on a direct stream).
const CarryBatchBytes = 1 << 20

// ErrFramesBacklog is why a FrameQueue refused a frame: CarryQueue frames
// wait.
var ErrFramesBacklog = fmt.Errorf("%d frames wait: the call fell behind", CarryQueue)

// CarryPace is the least time between two batches of one FrameQueue: a
// frame that finds the queue idle leaves at once, and under load frames
// gather for up to CarryPace. Batches taken as soon as the previous one
// was sent are small during a recovery's bursts (a stop order, a report
// and an assignment per node), so relays and the controller would spend
// their CPU per message and healthy nodes' heartbeats could arrive late
// enough to be declared lost; a fixed linger before every batch would
// cost timer wake-ups at steady, where a message rarely waits.
const CarryPace = 2 * time.Millisecond

// FrameQueue queues frames without blocking and hands them on in batches
// (Run): whatever queued while the previous batch was taken care of, and
// at least CarryPace after it started, goes in the next one. Its writer,
// Run, runs for the queue's life (Queue).
type FrameQueue[F any] struct {
	// size is a frame's encoded size, for CarryBatchBytes; nil when the
	// batches are not sent but handled in this process, whole.
	size func(F) int
	q    *Queue[F]
}

// NewFrameQueue makes an empty queue of frames to send.
func NewFrameQueue[F proto.Message]() *FrameQueue[F] {
	return &FrameQueue[F]{q: NewQueue[F](CarryQueue), size: func(f F) int { return proto.Size(f) }}
}

// NewHandleQueue makes an empty queue of frames to handle in this process:
// Run hands on all that queued in one batch.
func NewHandleQueue[F any]() *FrameQueue[F] {
	return &FrameQueue[F]{q: NewQueue[F](CarryQueue)}
}

// Put queues f without blocking. It fails once the queue failed (Run
// returned, or CarryQueue frames wait, which fails it and drops them).
func (o *FrameQueue[F]) Put(f F) error {
	_, err := o.q.Put(f)
	if errors.Is(err, ErrQueueFull) {
		o.q.Fail(ErrFramesBacklog)
		return ErrFramesBacklog
	}
	return err
}

// Run hands what is queued to send, in order, in batches of at most
// CarryBatchBytes of frames (a message's worth; any size for a handle
// queue), until ctx ends, send fails or the queue overflows; it returns
// why, and refuses frames from then on.
func (o *FrameQueue[F]) Run(ctx context.Context, send func([]F) error) error {
	o.q.Fail(o.run(ctx, send))
	return o.q.Err()
}

func (o *FrameQueue[F]) run(ctx context.Context, send func([]F) error) error {
	var last time.Time
	wake := o.q.Wake()
	pace := time.NewTimer(0)
	defer pace.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-wake:
		}
		if wait := CarryPace - time.Since(last); wait > 0 {
			pace.Reset(wait)
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-pace.C:
			}
		}
		last = time.Now()
		frames := o.q.Take()
		if err := o.q.Err(); err != nil {
			return err
		}
		for len(frames) > 0 {
			n := len(frames)
			if o.size != nil {
				n = o.batch(frames)
			}
			if err := send(frames[:n]); err != nil {
				return fmt.Errorf("sending: %w", err)
			}
			frames = frames[n:]
		}
	}
}

// batch is how many of frames (at least one) fit in a message.
func (o *FrameQueue[F]) batch(frames []F) int {
	n, size := 1, o.size(frames[0])
	for n < len(frames) {
		if size += o.size(frames[n]); size > CarryBatchBytes {
			break
		}
		n++
	}
	return n
}
