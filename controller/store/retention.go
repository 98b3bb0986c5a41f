package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// PruneEvents deletes a scope's events from before cutoff, then its oldest
// ones beyond keep, and returns how many it deleted. Event keys sort by
// time, so each bound is one range delete.
func (s *Store) PruneEvents(ctx context.Context, scope string, cutoff time.Time, keep int) (int64, error) {
	prefix := EventsPrefix(scope)
	resp, err := s.commit(ctx, nil, &opList{ops: []clientv3.Op{clientv3.OpDelete(prefix, clientv3.WithRange(EventKey(scope, cutoff, 0)))}})
	if err != nil {
		return 0, fmt.Errorf("pruning events of %s older than %s: %w", scope, cutoff.Format(time.RFC3339), err)
	}
	deleted := resp.Responses[0].GetResponseDeleteRange().GetDeleted()

	rctx, cancel := s.request(ctx)
	count, err := s.cli.Get(rctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	cancel()
	if err != nil {
		return deleted, fmt.Errorf("counting events of %s: %w", scope, unavailable(ctx, err))
	}
	excess := count.Count - int64(keep)
	if excess <= 0 {
		return deleted, nil
	}
	rctx, cancel = s.request(ctx)
	oldest, err := s.cli.Get(rctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithLimit(excess))
	cancel()
	if err != nil {
		return deleted, fmt.Errorf("listing the oldest events of %s: %w", scope, unavailable(ctx, err))
	}
	if len(oldest.Kvs) == 0 {
		return deleted, nil
	}
	last := string(oldest.Kvs[len(oldest.Kvs)-1].Key)
	if resp, err = s.commit(ctx, nil, &opList{ops: []clientv3.Op{clientv3.OpDelete(prefix, clientv3.WithRange(last+"\x00"))}}); err != nil {
		return deleted, fmt.Errorf("pruning events of %s to the newest %d: %w", scope, keep, err)
	}
	return deleted + resp.Responses[0].GetResponseDeleteRange().GetDeleted(), nil
}

// DeleteJob removes a finished job and everything kept for it (rounds,
// worker statuses, checkpoint catalog, events), guarded on the job as last
// seen, and raises the generation floor to floor (see keys.go): the
// caller's highest generation of every job deleted so far.
func (s *Store) DeleteJob(job string, floor uint64, events ...*rdzvv1.Event) *Change {
	ch := newChange("deleting job " + job)
	ch.guard, ch.untrack = []string{JobKey(job)}, []string{JobKey(job)}
	ch.known = true
	ch.deleteRange(JobKey(job), "")
	for _, prefix := range []string{RoundsPrefix(job), WorkersPrefix(job), CheckpointsPrefix(job), EventsPrefix(job)} {
		ch.deletePrefix(prefix)
	}
	ch.putMsg(GenerationFloorKey(), wrapperspb.UInt64(floor))
	s.events(ch, events)
	return ch
}

// DeleteNode removes a node's record, guarded on it as last seen.
func (s *Store) DeleteNode(node string, events ...*rdzvv1.Event) *Change {
	ch := newChange("deleting node " + node)
	ch.guard, ch.untrack = []string{NodeKey(node)}, []string{NodeKey(node)}
	ch.known = true
	ch.deleteRange(NodeKey(node), "")
	s.events(ch, events)
	return ch
}

// Revision is etcd's current revision.
func (s *Store) Revision(ctx context.Context) (int64, error) {
	rctx, cancel := s.request(ctx)
	defer cancel()
	resp, err := s.cli.Get(rctx, JobsPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("reading etcd revision: %w", unavailable(ctx, err))
	}
	return resp.Header.Revision, nil
}

// Compact discards etcd's history before rev. Compacting to a revision
// that is already compacted is not an error: another run got there first.
func (s *Store) Compact(ctx context.Context, rev int64) error {
	rctx, cancel := s.request(ctx)
	defer cancel()
	if _, err := s.cli.Compact(rctx, rev); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("compacting etcd to revision %d: %w", rev, unavailable(ctx, err))
	}
	return nil
}
