package store

import (
	"context"
	"fmt"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultMaxTxnOps is etcd's default --max-txn-ops: comparisons and
// operations one transaction may have each. A Store packs transactions up
// to the limit it is given (New), this one unless told otherwise.
const DefaultMaxTxnOps = 128

// txnBytes bounds one transaction's keys and values, at etcd's default
// --max-request-bytes (1.5 MiB) less room for framing.
const txnBytes = 1 << 20

// Change is one atomic state change: the keys it writes and what must hold
// for it to apply. The builders in store.go make one per kind of write;
// Commit packs consecutive changes into as few transactions as etcd
// accepts, so a burst of worker reports costs a few transactions, not one
// each.
//
// Guards are implicit: a change names the records it depends on (a job, a
// node), and Commit checks each is still at the revision this Store last
// read or wrote it at, or still absent if it never saw it. Only the
// leading controller writes these keys, so a failed guard means its view
// is stale (ErrConflict) and a missing leader key that it no longer leads
// (ErrNotLeader).
type Change struct {
	what string
	l    opList
	// guard are records that must be as this Store last saw them, or absent
	// if it never saw them (unless known is set).
	guard []string
	// known refuses the change when the Store never saw its guarded
	// records: an update of a job that does not exist must not create it.
	known bool
	// absent are keys that must not exist yet.
	absent []string
	// track are the records written, whose new revision guards later
	// changes.
	track []string
	// keys and ranges are everything written or deleted; etcd refuses a
	// transaction that touches a key twice, so a change that overlaps an
	// earlier one goes into the next transaction.
	keys   []string
	ranges []keyRange
	// supersedes are ranges whose earlier puts this change makes moot
	// without deleting anything (Elide): a round's commit supersedes the
	// job's worker records of older generations, which readers ignore.
	supersedes []keyRange
	// untrack are records deleted.
	untrack []string
	size    int
}

type keyRange struct{ from, to string }

func (r keyRange) has(key string) bool { return key >= r.from && (r.to == "" || key < r.to) }

func (r keyRange) overlaps(o keyRange) bool {
	return (o.to == "" || r.from < o.to) && (r.to == "" || o.from < r.to)
}

func newChange(what string) *Change { return &Change{what: what} }

// String names the change for logs and errors.
func (c *Change) String() string { return c.what }

func (c *Change) put(key string, value []byte) {
	c.l.ops = append(c.l.ops, clientv3.OpPut(key, string(value)))
	c.keys = append(c.keys, key)
	c.size += len(key) + len(value)
}

func (c *Change) deleteRange(from, to string) {
	if to == "" {
		c.l.ops = append(c.l.ops, clientv3.OpDelete(from))
		c.keys = append(c.keys, from)
		return
	}
	c.l.ops = append(c.l.ops, clientv3.OpDelete(from, clientv3.WithRange(to)))
	c.ranges = append(c.ranges, keyRange{from, to})
}

func (c *Change) deletePrefix(prefix string) {
	c.deleteRange(prefix, clientv3.GetPrefixRangeEnd(prefix))
}

func (c *Change) supersede(prefix string) {
	c.supersedes = append(c.supersedes, keyRange{prefix, clientv3.GetPrefixRangeEnd(prefix)})
}

// Elides says whether c can make an earlier change's puts moot (Elide):
// whether it deletes a range or supersedes one. nil (a barrier) cannot.
func (c *Change) Elides() bool { return c != nil && (len(c.ranges) > 0 || len(c.supersedes) > 0) }

// Elide drops from changes the puts that a later change of the slice
// deletes with a range or supersedes (a round's commit supersedes the
// job's worker records, so the STOPPED reports queued before it, one per
// node, need not be stored first), and sets a change left with no operation to
// nil. pinned(i) marks a change someone waits on (an answer, a message
// that rests on it): every change before it keeps all its writes, and so
// does it, so that whatever learns of a durable change finds everything
// before it durable too. An unpinned change's elided writes were never
// promised to anyone; once the deleting or superseding change is durable
// they would be gone or ignored anyway, and a crash before that loses only
// what a crash before their own transaction would have. A put of a key a
// change guards or tracks is kept: its revision matters. nil entries
// (barriers) are left as they are.
func Elide(changes []*Change, pinned func(i int) bool) {
	var ranges []keyRange // deleted or superseded by later changes, back to the last pin
	for i := len(changes) - 1; i >= 0; i-- {
		if pinned(i) {
			ranges = nil
		}
		ch := changes[i]
		if ch == nil {
			continue
		}
		if len(ranges) > 0 && !pinned(i) && ch.l.err == nil {
			changes[i] = ch.without(ranges)
		}
		ranges = append(append(ranges, ch.ranges...), ch.supersedes...)
	}
}

// without is c less its puts of keys in ranges, nil if nothing is left.
func (c *Change) without(ranges []keyRange) *Change {
	covered := func(key string) bool {
		for _, r := range ranges {
			if r.has(key) {
				return true
			}
		}
		return false
	}
	var drop map[int]bool
	for i, op := range c.l.ops {
		if !op.IsPut() {
			continue
		}
		key := string(op.KeyBytes())
		if covered(key) && !slices.Contains(c.guard, key) && !slices.Contains(c.track, key) {
			if drop == nil {
				drop = map[int]bool{}
			}
			drop[i] = true
		}
	}
	if drop == nil {
		return c
	}
	if len(drop) == len(c.l.ops) {
		return nil
	}
	out := &Change{what: c.what, guard: c.guard, known: c.known, absent: c.absent, track: c.track, ranges: c.ranges, supersedes: c.supersedes, untrack: c.untrack}
	for i, op := range c.l.ops {
		if drop[i] {
			continue
		}
		out.l.ops = append(out.l.ops, op)
		switch {
		case op.IsPut():
			out.keys = append(out.keys, string(op.KeyBytes()))
			out.size += len(op.KeyBytes()) + len(op.ValueBytes())
		case op.IsDelete() && len(op.RangeBytes()) == 0:
			out.keys = append(out.keys, string(op.KeyBytes()))
		}
	}
	return out
}

// batch is the transaction being packed.
type batch struct {
	cmps    []clientv3.Cmp
	ops     []clientv3.Op
	guarded map[string]bool
	keys    map[string]bool
	ranges  []keyRange
	size    int
}

// fits reports whether ch can join b without exceeding etcd's limits
// (maxOps operations and comparisons) or touching a key b already touches.
func (b *batch) fits(ch *Change, cmps, maxOps int) bool {
	if len(b.ops) == 0 {
		return true // alone it goes anyway; etcd says if it is too big
	}
	if len(b.ops)+len(ch.l.ops) > maxOps || len(b.cmps)+cmps > maxOps-1 || b.size+ch.size > txnBytes {
		return false
	}
	for _, k := range ch.keys {
		if b.keys[k] || b.inRanges(k) {
			return false
		}
	}
	for _, r := range ch.ranges {
		for k := range b.keys {
			if r.has(k) {
				return false
			}
		}
		for _, o := range b.ranges {
			if r.overlaps(o) {
				return false
			}
		}
	}
	return true
}

func (b *batch) inRanges(key string) bool {
	for _, r := range b.ranges {
		if r.has(key) {
			return true
		}
	}
	return false
}

// Commit writes the longest prefix of changes that fits one transaction,
// all or nothing, and returns how many it wrote and at which revision. It
// fails with ErrConflict or ErrNotLeader (see Change), ErrUnavailable, or
// an encoding error; then nothing was written.
func (s *Store) Commit(ctx context.Context, changes []*Change) (n int, rev int64, err error) {
	if len(changes) == 0 {
		return 0, 0, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b := batch{guarded: map[string]bool{}, keys: map[string]bool{}}
	for _, ch := range changes {
		if ch.l.err != nil {
			if n == 0 {
				return 0, 0, fmt.Errorf("%s: %w", ch.what, ch.l.err)
			}
			break // commit what came before; the next call reports it
		}
		var cmps []clientv3.Cmp
		for _, k := range ch.guard {
			// etcd compares against the state before the transaction: a
			// record an earlier change of it guards or writes is covered
			// by that change's comparison.
			if b.guarded[k] || b.keys[k] {
				continue
			}
			if rev := s.revs[k]; ch.known && rev == 0 {
				// Never seen: a comparison no revision meets fails the
				// transaction as a conflict, or as a lost lead if that is
				// what it is.
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", -1))
			} else {
				cmps = append(cmps, revCmp(k, rev))
			}
		}
		for _, k := range ch.absent {
			if !b.keys[k] {
				cmps = append(cmps, revCmp(k, 0))
			}
		}
		if !b.fits(ch, len(cmps), s.maxTxnOps) {
			break
		}
		for _, k := range ch.guard {
			b.guarded[k] = true
		}
		b.cmps = append(b.cmps, cmps...)
		b.ops = append(b.ops, ch.l.ops...)
		for _, k := range ch.keys {
			b.keys[k] = true
		}
		b.ranges = append(b.ranges, ch.ranges...)
		b.size += ch.size
		n++
	}
	resp, err := s.commit(ctx, b.cmps, &opList{ops: b.ops})
	if err != nil {
		whats := make([]string, 0, min(n, 3))
		for _, ch := range changes[:min(n, 3)] {
			whats = append(whats, ch.what)
		}
		if n > 3 {
			whats = append(whats, fmt.Sprintf("and %d more", n-3))
		}
		return 0, 0, fmt.Errorf("%s: %w", strings.Join(whats, ", "), err)
	}
	rev = resp.Header.Revision
	for _, ch := range changes[:n] {
		for _, k := range ch.untrack {
			delete(s.revs, k)
		}
		for _, k := range ch.track {
			s.revs[k] = rev
		}
	}
	return n, rev, nil
}

// CommitAll writes every change, in order, in as few transactions as
// they fit.
func (s *Store) CommitAll(ctx context.Context, changes ...*Change) (rev int64, err error) {
	for len(changes) > 0 {
		n, r, err := s.Commit(ctx, changes)
		if err != nil {
			return 0, err
		}
		changes, rev = changes[n:], r
	}
	return rev, nil
}
