package store

// Watching events. Events are read from etcd, never from the controller's
// memory: what etcd holds is durable, and etcd orders it by commit
// revision, across leaders too. A watcher costs the write path nothing.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// StoredEvent is an event with the cursor that resumes a watch after it.
type StoredEvent struct {
	Event  *rdzvv1.Event
	Cursor string
}

// An event cursor is "<revision>-<key after the events prefix>": events
// are ordered by the revision that wrote them, then by key, since one
// transaction writes several. "<revision>-" is before every event of that
// revision: where a replay that read up to the revision before ends.
type eventPos struct {
	rev int64
	key string
}

func (p eventPos) cursor() string {
	return strconv.FormatInt(p.rev, 10) + "-" + strings.TrimPrefix(p.key, eventsPrefix)
}

// boundary is the position after everything written up to revision rev.
func boundary(rev int64) eventPos { return eventPos{rev: rev + 1} }

func (p eventPos) before(o eventPos) bool { return p.rev < o.rev || p.rev == o.rev && p.key < o.key }

// maxEventCursorBytes bounds a cursor from a client; ours are far shorter.
const maxEventCursorBytes = 256

// watchPrefix is what a watch of job covers: its events, or every event.
func watchPrefix(job string) string {
	if job == "" {
		return eventsPrefix
	}
	return EventsPrefix(job)
}

// parseEventCursor reads a cursor that a watch of job returned.
func parseEventCursor(job, cursor string) (eventPos, error) {
	rev, key, ok := strings.Cut(cursor, "-")
	n, err := strconv.ParseInt(rev, 10, 64)
	pos := eventPos{rev: n, key: eventsPrefix + key}
	if key == "" {
		pos.key = ""
	}
	if !ok || err != nil || n <= 0 || len(cursor) > maxEventCursorBytes || key != "" && !strings.HasPrefix(pos.key, watchPrefix(job)) {
		return eventPos{}, fmt.Errorf("cursor: %q is not the cursor of an event of this watch: %w", cursor, ErrBadCursor)
	}
	return pos, nil
}

// replayPage is how many events one read of a replay returns at most,
// unless a transaction may write more (see replayLimit).
const replayPage = 1000

// replayLimit is the page of a replay: more events than one transaction
// writes, so that a page holds more than one revision.
func (s *Store) replayLimit() int { return max(replayPage, s.maxTxnOps+1) }

// ReplayEvents calls fn with the stored events of job (every event when
// job is ""), in the order they were written: those after cursor, or
// without one the newest tail. It returns the cursor the replay ends at,
// from which WatchEvents goes on: whatever is written after the replay's
// read is the watch's, so nothing is missed or sent twice.
func (s *Store) ReplayEvents(ctx context.Context, job, cursor string, tail int, fn func(StoredEvent) error) (string, error) {
	prefix := watchPrefix(job)
	var after eventPos
	if cursor != "" {
		var err error
		if after, err = parseEventCursor(job, cursor); err != nil {
			return "", err
		}
	}
	// Every read is at the revision of the first, so that the replay is
	// one consistent snapshot.
	var at int64
	read := func(opts ...clientv3.OpOption) ([]eventAt, bool, error) {
		if at != 0 {
			opts = append(opts, clientv3.WithRev(at))
		}
		rctx, cancel := s.request(ctx)
		defer cancel()
		resp, err := s.cli.Get(rctx, prefix, append(opts, clientv3.WithPrefix())...)
		if err != nil {
			return nil, false, fmt.Errorf("replaying events: %w", unavailable(ctx, err))
		}
		if at == 0 {
			at = resp.Header.Revision
		}
		out := make([]eventAt, 0, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			out = append(out, eventAt{pos: eventPos{rev: kv.ModRevision, key: string(kv.Key)}, value: kv.Value})
		}
		sortEvents(out)
		return out, resp.More, nil
	}
	emit := func(evs []eventAt) error {
		for _, e := range evs {
			se, err := e.decode()
			if err != nil {
				return err
			}
			if err := fn(se); err != nil {
				return err
			}
			after = e.pos
		}
		return nil
	}

	if cursor == "" {
		if tail <= 0 {
			if _, _, err := read(clientv3.WithKeysOnly(), clientv3.WithLimit(1)); err != nil {
				return "", err
			}
			return boundary(at).cursor(), nil
		}
		evs, _, err := read(clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend), clientv3.WithLimit(int64(tail)))
		if err != nil {
			return "", err
		}
		if err := emit(evs); err != nil {
			return "", err
		}
		return boundary(at).cursor(), nil
	}
	for {
		evs, more, err := read(clientv3.WithMinModRev(after.rev), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend),
			clientv3.WithLimit(int64(s.replayLimit())))
		if err != nil {
			return "", err
		}
		if more {
			// The page may end within a revision: leave that revision
			// whole to the next page.
			last := evs[len(evs)-1].pos.rev
			evs = slices.DeleteFunc(evs, func(e eventAt) bool { return e.pos.rev == last })
		}
		evs = slices.DeleteFunc(evs, func(e eventAt) bool { return !after.before(e.pos) })
		if err := emit(evs); err != nil {
			return "", err
		}
		if !more {
			if end := boundary(at); after.before(end) {
				after = end
			}
			return after.cursor(), nil
		}
		if len(evs) == 0 {
			// A page of one revision only cannot be: a transaction has
			// fewer writes than a page.
			return "", fmt.Errorf("replaying events: revision %d has more than %d events", after.rev, s.replayLimit())
		}
	}
}

// WatchEvents calls fn with every event of job (every event when job is
// "") written after cursor (one ReplayEvents or fn returned), in the order
// they were written, until ctx ends (nil), fn returns false (nil) or the
// watch fails.
func (s *Store) WatchEvents(ctx context.Context, job, cursor string, fn func(StoredEvent) bool) error {
	after, err := parseEventCursor(job, cursor)
	if err != nil {
		return err
	}
	// Without an etcd leader the member cannot know what is written: fail
	// rather than wait silently.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cli.Watch(wctx, watchPrefix(job), clientv3.WithPrefix(), clientv3.WithRev(after.rev), clientv3.WithFilterDelete())
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watching events: %w", unavailable(ctx, err))
		}
		// etcd never splits one revision's events across responses, so
		// sorting a response is the order ReplayEvents gives.
		evs := make([]eventAt, 0, len(wr.Events))
		for _, e := range wr.Events {
			if pos := (eventPos{rev: e.Kv.ModRevision, key: string(e.Kv.Key)}); after.before(pos) {
				evs = append(evs, eventAt{pos: pos, value: e.Kv.Value})
			}
		}
		sortEvents(evs)
		for _, e := range evs {
			se, err := e.decode()
			if err != nil {
				return err
			}
			if !fn(se) {
				return nil
			}
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("watching events: %w", unavailable(ctx, wctx.Err()))
}

type eventAt struct {
	pos   eventPos
	value []byte
}

func (e eventAt) decode() (StoredEvent, error) {
	ev := &rdzvv1.Event{}
	if err := proto.Unmarshal(e.value, ev); err != nil {
		return StoredEvent{}, fmt.Errorf("decoding %s: %w", e.pos.key, err)
	}
	return StoredEvent{Event: ev, Cursor: e.pos.cursor()}, nil
}

func sortEvents(evs []eventAt) {
	slices.SortFunc(evs, func(a, b eventAt) int {
		if a.pos.before(b.pos) {
			return -1
		}
		if b.pos.before(a.pos) {
			return 1
		}
		return 0
	})
}
