package wire

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"
)

// A relay and the controller exchange many agents' messages as frames of
// one stream (rdzv.v1.RelayService.Carry), each way through an Outbox.

// CarryQueue bounds the frames waiting to be sent on one Carry call. A
// peer this far behind is given up: the call ends, and its agents
// reconnect and re-synchronise, as a direct agent whose own queue
// overflows does.
const CarryQueue = 64 << 10

// CarryBatchBytes bounds the frames of one message; a frame larger than
// this goes alone (no larger than on a direct stream).
const CarryBatchBytes = 1 << 20

// ErrOutboxFull is why an outbox refused a frame: CarryQueue frames wait.
var ErrOutboxFull = fmt.Errorf("%d frames wait to be sent: the peer fell behind", CarryQueue)

// Outbox queues frames for one stream and sends them in batches: whatever
// queued while the previous message was being sent goes in the next one.
// Batches grow with the load, with no timer: a frame that finds the stream
// idle leaves at once (a 2 ms linger for company cost the relays more CPU,
// in timer wake-ups, than it saved, and quadrupled the heartbeat p99 of
// make bench-scale through relays).
type Outbox[F proto.Message] struct {
	mu     sync.Mutex
	queue  []F
	failed error
	wake   chan struct{}
}

// NewOutbox makes an empty outbox.
func NewOutbox[F proto.Message]() *Outbox[F] {
	return &Outbox[F]{wake: make(chan struct{}, 1)}
}

// Put queues f without blocking. It fails once the outbox failed (Run
// returned, or CarryQueue frames wait, which fails it).
func (o *Outbox[F]) Put(f F) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failed != nil {
		return o.failed
	}
	if len(o.queue) >= CarryQueue {
		o.failed = ErrOutboxFull
		o.queue = nil
		o.signal()
		return o.failed
	}
	o.queue = append(o.queue, f)
	o.signal()
	return nil
}

func (o *Outbox[F]) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// Run sends what is queued, in messages of at most CarryBatchBytes of
// frames (send), until ctx ends, a send fails or the outbox overflows; it
// returns why, and refuses frames from then on.
func (o *Outbox[F]) Run(ctx context.Context, send func([]F) error) error {
	err := o.run(ctx, send)
	o.mu.Lock()
	if o.failed == nil {
		o.failed = err
	}
	err, o.queue = o.failed, nil
	o.mu.Unlock()
	return err
}

func (o *Outbox[F]) run(ctx context.Context, send func([]F) error) error {
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-o.wake:
		}
		o.mu.Lock()
		frames, failed := o.queue, o.failed
		o.queue = nil
		o.mu.Unlock()
		if failed != nil {
			return failed
		}
		for len(frames) > 0 {
			n, size := 1, proto.Size(frames[0])
			for n < len(frames) {
				if size += proto.Size(frames[n]); size > CarryBatchBytes {
					break
				}
				n++
			}
			if err := send(frames[:n]); err != nil {
				return fmt.Errorf("sending: %w", err)
			}
			frames = frames[n:]
		}
	}
}
