package wire

import (
	"errors"
	"sync"
)

// ErrQueueFull is why Queue.Put refused an item: the queue holds its
// limit. The queue is unchanged; what a full queue means (the peer fell
// behind and is dropped, the call ends) is the caller's to decide.
var ErrQueueFull = errors.New("the queue is full")

// Queue is a FIFO that producers add to without blocking and one writer
// drains, in order: the controller's writes to etcd, an agent's stream,
// a relay's agent connection, a Carry call. Its one lock, mu, guards all
// of it.
//
// The writer runs in one of two ways. On demand: Put says when no writer
// runs, and that caller becomes the writer (on a goroutine of its own or
// on its own), draining with Next or TakeAll until they find the queue
// empty, which ends its turn; an idle queue then costs no goroutine. Or
// for the queue's life: it waits on Wake and takes what queued with Take.
type Queue[T any] struct {
	mu    sync.Mutex
	items []T
	// limit bounds len(items); 0: no bound.
	limit int
	// failed refuses every Put from now on (Fail, Close).
	failed error
	// writing says a writer's turn is under way (on demand); idle, if
	// not nil, is closed when it ends (Close waits on it).
	writing bool
	idle    chan struct{}
	// wake, made by the first Wake, is signalled by every Put and Fail.
	wake chan struct{}
}

// NewQueue makes an empty queue of at most limit items; 0: no bound.
func NewQueue[T any](limit int) *Queue[T] { return &Queue[T]{limit: limit} }

// Put queues v. start says that no writer was running and the caller must
// now run one (on demand). err is the queue's failure (Fail, Close), or
// ErrQueueFull; v is not queued then.
func (q *Queue[T]) Put(v T) (start bool, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.failed != nil {
		return false, q.failed
	}
	if q.limit > 0 && len(q.items) >= q.limit {
		return false, ErrQueueFull
	}
	q.items = append(q.items, v)
	q.signal()
	if q.writing {
		return false, nil
	}
	q.writing = true
	return true, nil
}

// Next takes the oldest item for the writer. When none is queued it ends
// the writer's turn and says false: the next Put starts a writer.
func (q *Queue[T]) Next() (T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var v T
	if len(q.items) == 0 {
		q.endTurn()
		return v, false
	}
	v = q.items[0]
	var zero T
	q.items[0] = zero // the queue keeps no reference to what it handed on
	q.items = q.items[1:]
	return v, true
}

// TakeAll takes every queued item for the writer, in order. When none is
// queued it ends the writer's turn and returns nil: the next Put starts
// a writer.
func (q *Queue[T]) TakeAll() []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		q.endTurn()
		return nil
	}
	items := q.items
	q.items = nil
	return items
}

// EndTurn ends the writer's turn now, dropping what is queued: a writer
// that can write no more (its stream failed) stops.
func (q *Queue[T]) EndTurn() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.endTurn()
}

// endTurn ends the writer's turn; the backing array of a burst is not
// kept. Callers hold mu.
func (q *Queue[T]) endTurn() {
	q.writing = false
	q.items = nil
	if q.idle != nil {
		close(q.idle)
		q.idle = nil
	}
}

// Take takes every queued item, in order, for a writer that runs for the
// queue's life (Wake); nil when none is queued.
func (q *Queue[T]) Take() []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}

// Wake is signalled (one slot, never blocking the signaller) by every Put
// and Fail: a writer that runs for the queue's life waits on it.
func (q *Queue[T]) Wake() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.wake == nil {
		q.wake = make(chan struct{}, 1)
		if len(q.items) > 0 || q.failed != nil {
			q.signal()
		}
	}
	return q.wake
}

// signal wakes a writer waiting on Wake. Callers hold mu.
func (q *Queue[T]) signal() {
	if q.wake == nil {
		return
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Fail refuses every Put from now on with err (the first failure stays:
// Err), and returns what was queued, which is dropped.
func (q *Queue[T]) Fail(err error) []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.failed == nil {
		q.failed = err
	}
	items := q.items
	q.items = nil
	q.signal()
	return items
}

// Err is why the queue refuses items (Fail, Close), nil while it takes
// them.
func (q *Queue[T]) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.failed
}

// Close refuses every Put from now on with err, as Fail, but leaves what
// is queued to the writer, and waits until the writer's turn (on demand)
// ends: a writer blocked in a write holds it up.
func (q *Queue[T]) Close(err error) {
	q.mu.Lock()
	if q.failed == nil {
		q.failed = err
	}
	var idle chan struct{}
	if q.writing {
		if q.idle == nil {
			q.idle = make(chan struct{})
		}
		idle = q.idle
	}
	q.mu.Unlock()
	if idle != nil {
		<-idle
	}
}
