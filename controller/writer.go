package controller

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/wire"
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
// etcd accepts): a burst of a worker report per node is about ten
// transactions at wire.MaxNodes and the embedded etcd's
// EmbeddedMaxTxnOps, not a round trip per report under a lock.

// pendingWrite is a queued change (nil: a barrier that only waits for the
// writes before it), what to do once it is durable, and who waits for it.
type pendingWrite struct {
	ch *store.Change
	// then runs under the Controller's mu once ch and everything before it
	// is durable.
	then  func()
	reply chan error
	// lazy marks a change no one waits on that a change soon to follow may
	// make moot (persistLazy); held is when it was queued.
	lazy bool
	held time.Time
}

// lazyWait bounds how long a lazy change waits for company: longer than a
// recovery at wire.MaxNodes takes from its first STOPPED report to its
// commit,
// short enough that a recovery waiting on a long fencing deadline still
// has the reports stored soon.
const lazyWait = 5 * time.Second

// writer persists one lead's decisions in order; a new lead starts a new
// one. Its queue takes changes from whoever decides (holding the
// Controller's mu); its one goroutine, run, commits them for the lead's
// life and runs what waits on them under mu. A nil writer (not leading)
// refuses everything: the view that made the decision is dropped before
// the next lead.
type writer struct {
	q     *wire.Queue[pendingWrite]
	store *store.Store
	// mu is the Controller's: then runs under it.
	mu *sync.Mutex
	// failed is told, under mu, of the write that failed (the lead steps
	// down).
	failed func(what string, err error)
}

func newWriter(st *store.Store, mu *sync.Mutex, failed func(what string, err error)) *writer {
	return &writer{q: wire.NewQueue[pendingWrite](0), store: st, mu: mu, failed: failed}
}

// queue adds p behind everything queued before it.
func (w *writer) queue(p pendingWrite) {
	if w == nil {
		if p.reply != nil {
			p.reply <- store.ErrNotLeader
		}
		return
	}
	if _, err := w.q.Put(p); err != nil && p.reply != nil {
		p.reply <- err
	}
}

// fail refuses everything queued and everything pushed from now on.
func (w *writer) fail(err error, inFlight []pendingWrite) {
	for _, p := range append(inFlight, w.q.Fail(err)...) {
		if p.reply != nil {
			p.reply <- err
		}
	}
}

// persist queues ch behind every change queued before it; then, if not
// nil, runs under mu once it is durable. The caller has applied the change
// to memory already.
func (w *writer) persist(ch *store.Change, then func()) {
	w.queue(pendingWrite{ch: ch, then: then})
}

// persistLazy is persist for a change that no one waits on and that the
// next round's commit is likely to make moot: a report of the failed
// generation's workers having stopped, which that commit supersedes with
// the rest of the job's worker records (store.CommitRound). Unless
// something that must be written queues behind it, it waits up to
// lazyWait, so that the commit finds it still queued and it is never
// written (elideSuperseded). Written or not, nothing is lost: the agent
// reports its workers again whenever it registers, and a controller that
// takes over without the report treats the node's workers as maybe
// running, as before the report.
func (w *writer) persistLazy(ch *store.Change) {
	w.queue(pendingWrite{ch: ch, lazy: true, held: time.Now()})
}

// persistWait is persist for an API call, whose answer must wait until the
// change is durable: the caller waits on the channel after releasing mu.
func (w *writer) persistWait(ch *store.Change) <-chan error {
	reply := make(chan error, 1)
	w.queue(pendingWrite{ch: ch, reply: reply})
	return reply
}

// barrier is answered once every change queued so far is durable; the
// caller waits on it after releasing mu.
func (w *writer) barrier() <-chan error {
	reply := make(chan error, 1)
	w.queue(pendingWrite{reply: reply})
	return reply
}

// afterDurable runs then under mu once every change queued so far is
// durable: for messages that rest on state decided but maybe not yet
// written (an assignment re-sent to a reconnecting agent).
func (w *writer) afterDurable(then func()) {
	w.queue(pendingWrite{then: then})
}

// settle waits until every decision made so far is durable.
func (c *Controller) settle(ctx context.Context) error {
	c.mu.Lock()
	reply := c.writes.barrier()
	c.mu.Unlock()
	return await(ctx, reply)
}

// await waits for a persistWait answer without holding the Controller's mu.
func await(ctx context.Context, reply <-chan error) error {
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// holdUntil is when the oldest of queued, if they are all lazy, stops
// waiting for company; zero if something is to be written now.
func holdUntil(queued []pendingWrite) time.Time {
	if len(queued) == 0 || slices.ContainsFunc(queued, func(p pendingWrite) bool { return !p.lazy }) {
		return time.Time{}
	}
	return queued[0].held.Add(lazyWait)
}

// run writes for one lead, until ctx ends or a write fails. Lazy changes
// wait in queued, up to lazyWait, until something else comes. Their wait
// is the writer's own pacing, not the cluster's time, so it runs on the
// real clock.
func (w *writer) run(ctx context.Context) {
	var (
		queued []pendingWrite
		hold   = time.NewTimer(time.Hour)
		wake   = w.q.Wake()
	)
	hold.Stop()
	defer hold.Stop()
	for {
		select {
		case <-ctx.Done():
			w.fail(store.ErrNotLeader, queued)
			return
		case <-wake:
		case <-hold.C:
		}
		queued = appendElided(queued, w.q.Take())
		for len(queued) > 0 {
			if until := holdUntil(queued); !until.IsZero() {
				if wait := time.Until(until); wait > 0 {
					hold.Reset(wait)
					break
				}
			}
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
				n, _, err := w.store.Commit(ctx, changes)
				if err != nil {
					w.mu.Lock()
					w.failed(changes[0].String(), err)
					w.mu.Unlock()
					w.fail(err, queued)
					return
				}
				done = n
			}
			// mu only if something is to run under it: during a
			// recovery a report per node queues for it, and a writer
			// waiting its turn behind them after every transaction of
			// theirs would delay the next round's commit.
			if slices.ContainsFunc(queued[:done], func(p pendingWrite) bool { return p.then != nil }) {
				w.mu.Lock()
				for _, p := range queued[:done] {
					if p.then != nil {
						p.then()
					}
				}
				w.mu.Unlock()
			}
			for _, p := range queued[:done] {
				if p.reply != nil {
					p.reply <- nil
				}
			}
			// What queued meanwhile joins the rest now, not after it:
			// a round's commit then elides the reports still waiting
			// ahead of it.
			queued = appendElided(queued[done:], w.q.Take())
		}
	}
}

// appendElided queues taken behind queued, and drops what taken makes
// moot. Only a change that deletes or supersedes can (store.Elide): what
// was queued before is elided already, and a later change is never
// elided by an earlier one. So the reports of a recovery, a report per
// node taken a few at a time while they wait for the round's commit, do
// not each pass over all those waiting, which would grow with the square
// of the cluster.
func appendElided(queued, taken []pendingWrite) []pendingWrite {
	queued = append(queued, taken...)
	if slices.ContainsFunc(taken, func(p pendingWrite) bool { return p.ch.Elides() }) {
		return elideSuperseded(queued)
	}
	return queued
}

// elideSuperseded drops the writes of queued that a later change in it
// deletes or supersedes before they are stored (store.Elide): during a
// recovery, the survivors' STOPPED reports that the next round's commit
// supersedes with the job's other worker records. A change someone waits on (an answer, a message that
// rests on it) pins everything before it. A change left with nothing to
// write goes from the queue; only unpinned ones, which no one waits on,
// can be left so.
func elideSuperseded(queued []pendingWrite) []pendingWrite {
	changes := make([]*store.Change, len(queued))
	for i, p := range queued {
		changes[i] = p.ch
	}
	store.Elide(changes, func(i int) bool { return queued[i].then != nil || queued[i].reply != nil })
	kept := queued[:0]
	for i, p := range queued {
		if p.ch != nil && changes[i] == nil {
			continue
		}
		p.ch = changes[i]
		kept = append(kept, p)
	}
	return kept
}
