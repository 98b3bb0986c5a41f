package controller

import (
	"context"
	"sync"

	"github.com/rdzv/rdzv/controller/store"
)

// The leader decides under c.mu and applies each decision to memory at
// once, so that the next decision (the next worker report, the next
// scheduling pass) builds on it; it persists decisions through one ordered
// writer that no lock waits on. Whatever leaves the controller because of a
// decision (an assignment, a stop, an API answer) leaves only once the
// decision and every one before it are durable. A write that fails steps
// the controller down, which drops memory and reloads it from etcd, so
// memory never holds a state etcd does not get.
//
// The writer commits what queued while its previous transaction was in
// flight as one batch (store.Commit packs it into as few transactions as
// etcd accepts): a burst of 10,000 worker reports is about ten
// transactions at the embedded etcd's EmbeddedMaxTxnOps, not 10,000 round
// trips under a lock.

// pendingWrite is a queued change (nil: a barrier that only waits for the
// writes before it), what to do once it is durable, and who waits for it.
type pendingWrite struct {
	ch *store.Change
	// then runs under c.mu once ch and everything before it is durable.
	then  func()
	reply chan error
}

// writer is the queue of one lead; a new lead starts a new one.
type writer struct {
	mu     sync.Mutex
	queue  []pendingWrite
	failed error
	wake   chan struct{}
}

func newWriter() *writer { return &writer{wake: make(chan struct{}, 1)} }

func (w *writer) push(p pendingWrite) {
	w.mu.Lock()
	if err := w.failed; err != nil {
		w.mu.Unlock()
		if p.reply != nil {
			p.reply <- err
		}
		return
	}
	w.queue = append(w.queue, p)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *writer) take() []pendingWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.queue
	w.queue = nil
	return q
}

// fail refuses everything queued and everything pushed from now on.
func (w *writer) fail(err error, inFlight []pendingWrite) {
	w.mu.Lock()
	if w.failed == nil {
		w.failed = err
	}
	q := append(inFlight, w.queue...)
	w.queue = nil
	w.mu.Unlock()
	for _, p := range q {
		if p.reply != nil {
			p.reply <- err
		}
	}
}

// persist queues ch behind every change queued before it; then, if not
// nil, runs under c.mu once it is durable. Callers hold c.mu and have
// applied the change to memory already.
func (c *Controller) persist(ch *store.Change, then func()) {
	c.queueWrite(pendingWrite{ch: ch, then: then})
}

// persistWait is persist for an API call, whose answer must wait until the
// change is durable: the caller waits on the channel after releasing c.mu.
func (c *Controller) persistWait(ch *store.Change) <-chan error {
	reply := make(chan error, 1)
	c.queueWrite(pendingWrite{ch: ch, reply: reply})
	return reply
}

// barrier is answered once every change queued so far is durable. Callers
// hold c.mu and wait on it after releasing it.
func (c *Controller) barrier() <-chan error {
	reply := make(chan error, 1)
	c.queueWrite(pendingWrite{reply: reply})
	return reply
}

// settle waits until every decision made so far is durable.
func (c *Controller) settle(ctx context.Context) error {
	c.mu.Lock()
	reply := c.barrier()
	c.mu.Unlock()
	return await(ctx, reply)
}

// afterDurable runs then under c.mu once every change queued so far is
// durable: for messages that rest on state decided but maybe not yet
// written (an assignment re-sent to a reconnecting agent).
func (c *Controller) afterDurable(then func()) {
	c.queueWrite(pendingWrite{then: then})
}

func (c *Controller) queueWrite(p pendingWrite) {
	if c.writes == nil {
		// Not leading: nothing may be written, and the view that made this
		// decision is dropped before the next lead.
		if p.reply != nil {
			p.reply <- store.ErrNotLeader
		}
		return
	}
	c.writes.push(p)
}

// await waits for a persistWait answer without holding c.mu.
func await(ctx context.Context, reply <-chan error) error {
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writeLoop is the writer of one lead, until ctx ends or a write fails.
func (c *Controller) writeLoop(ctx context.Context, w *writer) {
	for {
		select {
		case <-ctx.Done():
			w.fail(store.ErrNotLeader, nil)
			return
		case <-w.wake:
		}
		queued := w.take()
		for len(queued) > 0 {
			// The changes up to the next barrier (or the end).
			var changes []*store.Change
			for _, p := range queued {
				if p.ch == nil {
					break
				}
				changes = append(changes, p.ch)
			}
			done := max(len(changes), 1)
			if len(changes) > 0 {
				n, _, err := c.store.Commit(ctx, changes)
				if err != nil {
					c.mu.Lock()
					c.writeFailed(changes[0].String(), err)
					c.mu.Unlock()
					w.fail(err, queued)
					return
				}
				done = n
			}
			c.mu.Lock()
			for _, p := range queued[:done] {
				if p.then != nil {
					p.then()
				}
			}
			c.mu.Unlock()
			for _, p := range queued[:done] {
				if p.reply != nil {
					p.reply <- nil
				}
			}
			queued = queued[done:]
		}
	}
}
