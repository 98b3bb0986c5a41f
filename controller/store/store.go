package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rdzv/rdzv/controller/keyring"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// ErrConflict means a guarded write lost a race: the record changed since it
// was read. The caller reloads and decides again.
var ErrConflict = errors.New("record changed concurrently")

// ErrNotLeader means a write was refused because this controller does not
// (or no longer) lead: its leader key is gone or was never set. The caller
// steps down; nothing was written.
var ErrNotLeader = errors.New("this controller is not the leader")

// ErrUnavailable means etcd did not answer in time or refused the request
// (typically: no quorum). Nothing is known to have been written.
var ErrUnavailable = errors.New("etcd unavailable (no quorum?)")

// DefaultRequestTimeout bounds one etcd request when New is not told
// otherwise.
const DefaultRequestTimeout = 5 * time.Second

// pageSize bounds each range read so loading wire.MaxNodes nodes never
// builds one huge response.
const pageSize = 500

// Store reads and writes the key schema in keys.go. Every write is guarded
// by the controller's leadership (see Lead); a new Store refuses writes
// until it is told it leads.
type Store struct {
	cli *clientv3.Client
	seq atomic.Uint64
	// timeout bounds each request, so that a lost quorum fails calls
	// instead of hanging them (and whoever holds a lock around them).
	timeout time.Duration
	lead    atomic.Pointer[Leadership]

	// mu serialises commits; revs is the mod revision of every job and node
	// record as this store last read or wrote it: the guards of Commit.
	mu   sync.Mutex
	revs map[string]int64
	// keys seals jobs' secret_env values in etcd and opens them on read.
	keys *keyring.Keyring
	// maxTxnOps is the etcd servers' --max-txn-ops.
	maxTxnOps int
}

// Leadership identifies the leader key a write is guarded on: the key
// must still exist with this create revision, which no other campaign can
// reproduce, so a deposed leader's late writes fail.
type Leadership struct {
	Key string
	Rev int64
}

// New wraps an etcd client; requestTimeout bounds each request (0: the
// default); keys seals the jobs' secret_env values at rest; maxTxnOps is
// how many operations the etcd servers accept in one transaction (their
// --max-txn-ops; 0: etcd's default, DefaultMaxTxnOps).
func New(cli *clientv3.Client, requestTimeout time.Duration, keys *keyring.Keyring, maxTxnOps int) *Store {
	if requestTimeout <= 0 {
		requestTimeout = DefaultRequestTimeout
	}
	if maxTxnOps <= 0 {
		maxTxnOps = DefaultMaxTxnOps
	}
	return &Store{cli: cli, timeout: requestTimeout, revs: map[string]int64{}, keys: keys, maxTxnOps: maxTxnOps}
}

// Lead guards every later write on l.
func (s *Store) Lead(l Leadership) { s.lead.Store(&l) }

// Follow makes every later write fail with ErrNotLeader.
func (s *Store) Follow() { s.lead.Store(nil) }

// Client is the etcd client under the store, for the election and
// compaction, which are not key-schema operations.
func (s *Store) Client() *clientv3.Client { return s.cli }

// request bounds one etcd call.
func (s *Store) request(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// unavailable marks an etcd failure that is not the caller's own
// cancellation as ErrUnavailable, keeping the cause.
func unavailable(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// Versioned is a record with the etcd mod revision it was read or written
// at; guarded writes compare against it.
type Versioned[T any] struct {
	Value       T
	ModRevision int64
}

// Snapshot is everything the controller needs in memory at start. Records
// are keyed by the name in their etcd key; whether a record is valid (its
// own name agrees, its fields are in bounds) is for the caller to check,
// like any other input.
type Snapshot struct {
	Nodes map[string]Versioned[*rdzvv1.Node]
	Jobs  map[string]Versioned[*rdzvv1.Job]
	// Rounds holds each job's latest round.
	Rounds map[string]*rdzvv1.Round
	// Workers maps job to node to that node's worker status in the job's
	// generation (older ones are superseded: CommitRound).
	Workers map[string]map[string]*rdzvv1.WorkerStatus
	// Checkpoints holds each job's catalog steps, oldest first.
	Checkpoints map[string][]uint64
	// UnreadableNodes and UnreadableJobs are the node and job records that
	// could not be decoded (or a job's secrets opened, or its latest round
	// decoded), by name; they are in neither Nodes nor Jobs.
	UnreadableNodes map[string]Unreadable
	UnreadableJobs  map[string]Unreadable
	// Dropped are other records left out because they could not be read:
	// worker statuses, catalog entries, and keys that name nothing.
	Dropped []Unreadable
	// GenerationFloor is the highest generation of the jobs deleted so far
	// (see keys.go).
	GenerationFloor uint64
	// Unsealed names the jobs whose secret_env is not sealed with the
	// primary key (stored in plaintext by an older version, or sealed with
	// an older key): writing them again seals them with it.
	Unsealed []string
}

// Unreadable is a record that could not be read, and why.
type Unreadable struct {
	Key         string
	ModRevision int64
	Err         error
	// Generation is a job's, when its record decoded: a job replacing it
	// counts on from there, so late reports of the old run stay stale.
	Generation uint64
}

// Load reads the whole durable state. A record that cannot be read is
// reported in the snapshot rather than failing the load, so that one bad
// key cannot keep every controller from leading.
func (s *Store) Load(ctx context.Context) (*Snapshot, error) {
	snap := &Snapshot{
		Nodes:           map[string]Versioned[*rdzvv1.Node]{},
		Jobs:            map[string]Versioned[*rdzvv1.Job]{},
		Rounds:          map[string]*rdzvv1.Round{},
		Workers:         map[string]map[string]*rdzvv1.WorkerStatus{},
		Checkpoints:     map[string][]uint64{},
		UnreadableNodes: map[string]Unreadable{},
		UnreadableJobs:  map[string]Unreadable{},
	}
	err := s.rangeAll(ctx, NodesPrefix(), func(key string, value []byte, modRev int64) error {
		name, err := nameFromKey(NodesPrefix(), key)
		if err != nil {
			snap.Dropped = append(snap.Dropped, Unreadable{Key: key, ModRevision: modRev, Err: err})
			return nil
		}
		n := &rdzvv1.Node{}
		if err := proto.Unmarshal(value, n); err != nil {
			snap.UnreadableNodes[name] = Unreadable{Key: key, ModRevision: modRev, Err: fmt.Errorf("decoding: %w", err)}
			return nil
		}
		snap.Nodes[name] = Versioned[*rdzvv1.Node]{n, modRev}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loading nodes: %w", err)
	}
	err = s.rangeAll(ctx, JobsPrefix(), func(key string, value []byte, modRev int64) error {
		name, err := nameFromKey(JobsPrefix(), key)
		if err != nil {
			snap.Dropped = append(snap.Dropped, Unreadable{Key: key, ModRevision: modRev, Err: err})
			return nil
		}
		j := &rdzvv1.Job{}
		if err := proto.Unmarshal(value, j); err != nil {
			snap.UnreadableJobs[name] = Unreadable{Key: key, ModRevision: modRev, Err: fmt.Errorf("decoding: %w", err)}
			return nil
		}
		sealed, err := s.openSecrets(name, j)
		if err != nil {
			snap.UnreadableJobs[name] = Unreadable{Key: key, ModRevision: modRev, Err: err, Generation: j.GetGeneration()}
			return nil
		}
		if !sealed {
			snap.Unsealed = append(snap.Unsealed, name)
		}
		snap.Jobs[name] = Versioned[*rdzvv1.Job]{j, modRev}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("loading jobs: %w", err)
	}
	if err := s.loadFloor(ctx, snap); err != nil {
		return nil, err
	}
	// Guards of later commits start from what was read, and from nothing
	// of an earlier lead.
	revs := make(map[string]int64, len(snap.Nodes)+len(snap.Jobs))
	for name, v := range snap.Nodes {
		revs[NodeKey(name)] = v.ModRevision
	}
	for name, v := range snap.Jobs {
		revs[JobKey(name)] = v.ModRevision
	}
	// Unreadable records exist all the same: rewriting one (a node that
	// registers again, a job started again) is guarded like any other.
	for name, u := range snap.UnreadableNodes {
		revs[NodeKey(name)] = u.ModRevision
	}
	for name, u := range snap.UnreadableJobs {
		revs[JobKey(name)] = u.ModRevision
	}
	s.mu.Lock()
	s.revs = revs
	s.mu.Unlock()
	for name, v := range snap.Jobs {
		round, err := s.LatestRound(ctx, name)
		if errors.Is(err, errUndecodable) {
			snap.UnreadableJobs[name] = Unreadable{Key: JobKey(name), ModRevision: v.ModRevision, Err: err, Generation: v.Value.GetGeneration()}
			delete(snap.Jobs, name)
			continue
		}
		if err != nil {
			return nil, err
		}
		if round != nil {
			snap.Rounds[name] = round
		}
		workers, dropped, err := s.Workers(ctx, name)
		if err != nil {
			return nil, err
		}
		for node, w := range workers {
			if w.GetGeneration() < v.Value.GetGeneration() {
				delete(workers, node) // superseded (CommitRound)
			}
		}
		snap.Workers[name] = workers
		snap.Dropped = append(snap.Dropped, dropped...)
		cps, dropped, err := s.Checkpoints(ctx, name)
		if err != nil {
			return nil, err
		}
		snap.Dropped = append(snap.Dropped, dropped...)
		for _, cp := range cps {
			snap.Checkpoints[name] = append(snap.Checkpoints[name], cp.GetStep())
		}
	}
	return snap, nil
}

// loadFloor reads the generation floor into snap; an undecodable one is
// dropped like any unreadable record.
func (s *Store) loadFloor(ctx context.Context, snap *Snapshot) error {
	rctx, cancel := s.request(ctx)
	defer cancel()
	resp, err := s.cli.Get(rctx, GenerationFloorKey())
	if err != nil {
		return fmt.Errorf("loading the generation floor: %w", unavailable(ctx, err))
	}
	for _, kv := range resp.Kvs {
		floor := &wrapperspb.UInt64Value{}
		if err := proto.Unmarshal(kv.Value, floor); err != nil {
			snap.Dropped = append(snap.Dropped, Unreadable{Key: string(kv.Key), ModRevision: kv.ModRevision, Err: fmt.Errorf("decoding: %w", err)})
			continue
		}
		snap.GenerationFloor = floor.GetValue()
	}
	return nil
}

// errUndecodable marks a stored record that is not the message its key
// holds.
var errUndecodable = errors.New("undecodable record")

// LatestRound returns a job's newest round, or nil if it never ran.
func (s *Store) LatestRound(ctx context.Context, job string) (*rdzvv1.Round, error) {
	rctx, cancel := s.request(ctx)
	defer cancel()
	resp, err := s.cli.Get(rctx, RoundsPrefix(job), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil {
		return nil, fmt.Errorf("reading latest round of job %s: %w", job, unavailable(ctx, err))
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	r := &rdzvv1.Round{}
	if err := proto.Unmarshal(resp.Kvs[0].Value, r); err != nil {
		return nil, fmt.Errorf("%w %s: %w", errUndecodable, resp.Kvs[0].Key, err)
	}
	return r, nil
}

// Workers returns a job's worker statuses by node, and the ones that could
// not be read.
func (s *Store) Workers(ctx context.Context, job string) (map[string]*rdzvv1.WorkerStatus, []Unreadable, error) {
	out := map[string]*rdzvv1.WorkerStatus{}
	var dropped []Unreadable
	prefix := WorkersPrefix(job)
	err := s.rangeAll(ctx, prefix, func(key string, value []byte, modRev int64) error {
		node, err := nameFromKey(prefix, key)
		if err != nil {
			dropped = append(dropped, Unreadable{Key: key, ModRevision: modRev, Err: err})
			return nil
		}
		w := &rdzvv1.WorkerStatus{}
		if err := proto.Unmarshal(value, w); err != nil {
			dropped = append(dropped, Unreadable{Key: key, ModRevision: modRev, Err: fmt.Errorf("decoding: %w", err)})
			return nil
		}
		out[node] = w
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("loading workers of job %s: %w", job, err)
	}
	return out, dropped, nil
}

func (s *Store) rangeAll(ctx context.Context, prefix string, fn func(key string, value []byte, modRev int64) error) error {
	end := clientv3.GetPrefixRangeEnd(prefix)
	key := prefix
	for {
		rctx, cancel := s.request(ctx)
		resp, err := s.cli.Get(rctx, key, clientv3.WithRange(end), clientv3.WithLimit(pageSize),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		cancel()
		if err != nil {
			return unavailable(ctx, err)
		}
		for _, kv := range resp.Kvs {
			if err := fn(string(kv.Key), kv.Value, kv.ModRevision); err != nil {
				return err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// shallow is a copy of m that shares m's fields' values (messages, lists,
// maps): the controller never changes a record in place, only replaces it,
// so a deep copy to clear a few fields would only cost CPU on every
// registration.
func shallow[M proto.Message](m M) M {
	src := m.ProtoReflect()
	dst := src.New()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		dst.Set(fd, v)
		return true
	})
	return dst.Interface().(M)
}

// PutNode writes a node record, guarded on the node as last seen. It
// keeps n's fields' values, not n itself.
func (s *Store) PutNode(n *rdzvv1.Node, events ...*rdzvv1.Event) *Change {
	key := NodeKey(n.GetInfo().GetName())
	stored := shallow(n)
	// Liveness and job membership are in-memory views; persisting them would
	// mean a write per heartbeat.
	stored.LastHeartbeat, stored.Job, stored.Generation = nil, "", 0
	ch := newChange("writing node " + n.GetInfo().GetName())
	ch.guard, ch.track = []string{key}, []string{key}
	ch.putMsg(key, stored)
	s.events(ch, events)
	return ch
}

// CreateJob stores a new job. A finished job of the same name that this
// one replaces (the guard: as last seen, or absent) takes its rounds,
// workers and checkpoints with it; its events stay as the name's history.
func (s *Store) CreateJob(j *rdzvv1.Job, replace bool, events ...*rdzvv1.Event) *Change {
	name := j.GetSpec().GetName()
	ch := newChange("creating job " + name)
	ch.track = []string{JobKey(name)}
	if replace {
		ch.guard, ch.known = []string{JobKey(name)}, true
	} else {
		ch.absent = []string{JobKey(name)}
	}
	s.putJob(ch, j)
	if replace {
		ch.deletePrefix(RoundsPrefix(name))
		ch.deletePrefix(WorkersPrefix(name))
		// A new run of the name starts from scratch, not from the old run's
		// checkpoints (its directory may be reused for other data).
		ch.deletePrefix(CheckpointsPrefix(name))
	}
	s.events(ch, events)
	return ch
}

// UpdateJob rewrites a job record, guarded on the job as last seen.
func (s *Store) UpdateJob(j *rdzvv1.Job, events ...*rdzvv1.Event) *Change {
	name := j.GetSpec().GetName()
	ch := newChange("updating job " + name)
	ch.guard, ch.track = []string{JobKey(name)}, []string{JobKey(name)}
	ch.known = true
	s.putJob(ch, j)
	s.events(ch, events)
	return ch
}

// CommitRound moves a job to its new generation: the job record and the
// round, guarded by the job as last seen and the round not existing, so two
// rounds can never both commit. It starts a clean slate of worker statuses
// without deleting the old ones: a worker record of an older generation
// than its job's is superseded (LoadSnapshot leaves it out), and each node
// of the new round overwrites its own. Deleting them in the commit would
// be one tombstone per node in its transaction, etcd's apply time between
// a recovery's decision and its assignments.
func (s *Store) CommitRound(j *rdzvv1.Job, round *rdzvv1.Round, events ...*rdzvv1.Event) *Change {
	name := j.GetSpec().GetName()
	ch := newChange(fmt.Sprintf("committing round %d of job %s", round.GetGeneration(), name))
	ch.guard, ch.track = []string{JobKey(name)}, []string{JobKey(name)}
	ch.known = true
	ch.absent = []string{RoundKey(name, round.GetGeneration())}
	s.putJob(ch, j)
	ch.putMsg(RoundKey(name, round.GetGeneration()), round)
	ch.supersede(WorkersPrefix(name))
	s.events(ch, events)
	return ch
}

// RecordCheckpoint adds a complete checkpoint to a job's catalog and writes
// the job record (which names the latest one), guarded on the job as last
// seen. Catalog entries below keepFromStep are dropped, which bounds the
// catalog.
func (s *Store) RecordCheckpoint(j *rdzvv1.Job, cp *rdzvv1.Checkpoint, keepFromStep uint64, events ...*rdzvv1.Event) *Change {
	name := j.GetSpec().GetName()
	ch := newChange(fmt.Sprintf("recording checkpoint step %d of job %s", cp.GetStep(), name))
	ch.guard, ch.track = []string{JobKey(name)}, []string{JobKey(name)}
	ch.known = true
	s.putJob(ch, j)
	ch.putMsg(CheckpointKey(name, cp.GetStep()), cp)
	if keepFromStep > 0 {
		ch.deleteRange(CheckpointsPrefix(name), CheckpointKey(name, keepFromStep))
	}
	s.events(ch, events)
	return ch
}

// Checkpoints returns a job's catalog, oldest step first, and the entries
// that could not be read.
func (s *Store) Checkpoints(ctx context.Context, job string) ([]*rdzvv1.Checkpoint, []Unreadable, error) {
	var out []*rdzvv1.Checkpoint
	var dropped []Unreadable
	err := s.rangeAll(ctx, CheckpointsPrefix(job), func(key string, value []byte, modRev int64) error {
		cp := &rdzvv1.Checkpoint{}
		if err := proto.Unmarshal(value, cp); err != nil {
			dropped = append(dropped, Unreadable{Key: key, ModRevision: modRev, Err: fmt.Errorf("decoding: %w", err)})
			return nil
		}
		out = append(out, cp)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("loading checkpoints of job %s: %w", job, err)
	}
	return out, dropped, nil
}

// PutWorker records one node's worker status for a job, guarded on the job
// as last seen, so a report for a superseded generation cannot land.
func (s *Store) PutWorker(job, node string, w *rdzvv1.WorkerStatus, events ...*rdzvv1.Event) *Change {
	ch := newChange(fmt.Sprintf("recording worker of job %s on node %s", job, node))
	ch.guard = []string{JobKey(job)}
	ch.known = true
	ch.putMsg(WorkerKey(job, node), w)
	s.events(ch, events)
	return ch
}

// AppendEvent stores one event on its own.
func (s *Store) AppendEvent(ev *rdzvv1.Event) *Change {
	ch := newChange("appending event " + ev.GetKind())
	s.events(ch, []*rdzvv1.Event{ev})
	return ch
}

// ErrBadCursor means an event cursor is not one ListEvents returned.
var ErrBadCursor = errors.New("not an event cursor")

// EventPage asks ListEvents for one page of a scope's events.
type EventPage struct {
	// After is the cursor of the previous page's last event; empty starts
	// with the oldest of the scope's newest Newest events.
	After  string
	Newest int
	// Limit bounds the page's events and MaxBytes their encoded size (as
	// items of a message, wire.ItemBytes); a page holds at least one event
	// if any is left, whatever its size.
	Limit    int
	MaxBytes int
}

// ListEvents returns one page of a scope's events, oldest first, the cursor
// of its last event, and whether the scope has events after it.
func (s *Store) ListEvents(ctx context.Context, scope string, p EventPage) (events []*rdzvv1.Event, cursor string, more bool, err error) {
	prefix := EventsPrefix(scope)
	from := prefix
	if p.After != "" {
		key, err := eventKeyAt(scope, p.After)
		if err != nil {
			return nil, "", false, err
		}
		from = key + "\x00"
	} else {
		rctx, cancel := s.request(ctx)
		resp, err := s.cli.Get(rctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(int64(p.Newest)))
		cancel()
		if err != nil {
			return nil, "", false, fmt.Errorf("listing events of %s: %w", scope, unavailable(ctx, err))
		}
		if len(resp.Kvs) == 0 {
			return nil, "", false, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key)
	}
	end := clientv3.GetPrefixRangeEnd(prefix)
	size := 0
	// Read in chunks, so that a page cut short by MaxBytes never reads
	// much more than it returns.
	for len(events) < p.Limit {
		rctx, cancel := s.request(ctx)
		resp, err := s.cli.Get(rctx, from, clientv3.WithRange(end), clientv3.WithLimit(int64(min(p.Limit-len(events), pageSize))),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		cancel()
		if err != nil {
			return nil, "", false, fmt.Errorf("listing events of %s: %w", scope, unavailable(ctx, err))
		}
		for _, kv := range resp.Kvs {
			n := wire.ItemBytes(len(kv.Value))
			if len(events) > 0 && size+n > p.MaxBytes {
				return events, cursor, true, nil
			}
			ev := &rdzvv1.Event{}
			if err := proto.Unmarshal(kv.Value, ev); err != nil {
				return nil, "", false, fmt.Errorf("decoding %s: %w", kv.Key, err)
			}
			events, size, cursor = append(events, ev), size+n, string(kv.Key[len(prefix):])
		}
		more = resp.More
		if !more || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return events, cursor, more, nil
}

// txn commits l if cmps hold and this controller still leads. When it
// fails, the leader key is read in the same transaction to tell a lost
// leadership (ErrNotLeader) from a lost race on a record (ErrConflict).
func (s *Store) commit(ctx context.Context, cmps []clientv3.Cmp, l *opList) (*clientv3.TxnResponse, error) {
	if l.err != nil {
		return nil, l.err
	}
	lead := s.lead.Load()
	if lead == nil {
		return nil, ErrNotLeader
	}
	cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(lead.Key), "=", lead.Rev))
	rctx, cancel := s.request(ctx)
	defer cancel()
	resp, err := s.cli.Txn(rctx).If(cmps...).Then(l.ops...).Else(clientv3.OpGet(lead.Key)).Commit()
	if err != nil {
		return nil, unavailable(ctx, err)
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].CreateRevision != lead.Rev {
			return nil, ErrNotLeader
		}
		return nil, ErrConflict
	}
	return resp, nil
}

// revCmp guards a write on key being at rev; rev 0 means the key must not
// exist.
func revCmp(key string, rev int64) clientv3.Cmp {
	if rev == 0 {
		return clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(key), "=", rev)
}

// opList accumulates etcd operations and the first encoding error, so
// builders need not check every step.
type opList struct {
	ops []clientv3.Op
	err error
}

func (c *Change) putMsg(key string, m proto.Message) {
	if c.l.err != nil {
		return
	}
	b, err := proto.Marshal(m)
	if err != nil {
		c.l.err = fmt.Errorf("encoding %s: %w", key, err)
		return
	}
	c.put(key, b)
}

func (s *Store) events(ch *Change, events []*rdzvv1.Event) {
	for _, ev := range events {
		scope := ev.GetJob()
		if scope == "" {
			scope = ClusterScope
		}
		at := time.Now()
		if ev.GetTime() != nil {
			at = ev.GetTime().AsTime()
		}
		ch.putMsg(EventKey(scope, at, s.seq.Add(1)), ev)
	}
}

// putJob adds the write of a job record: without its assignments, which
// are assembled from the round and worker keys on read, and with its
// secret_env values sealed.
func (s *Store) putJob(ch *Change, j *rdzvv1.Job) {
	if ch.l.err != nil {
		return
	}
	name := j.GetSpec().GetName()
	stored := proto.Clone(j).(*rdzvv1.Job)
	stored.Assignments = nil
	for k, v := range stored.GetSpec().GetSecretEnv() {
		sealed, err := s.keys.Seal(v, secretContext(name, k))
		if err != nil {
			ch.l.err = fmt.Errorf("sealing secret_env %s of job %s: %w", k, name, err)
			return
		}
		stored.Spec.SecretEnv[k] = sealed
	}
	ch.putMsg(JobKey(name), stored)
}

// openSecrets replaces the sealed secret_env values of a job record read
// from etcd with their plaintext, and reports whether all were sealed with
// the primary key. A value stored in plaintext (before sealing existed) is
// taken as is, and reported as not sealed.
func (s *Store) openSecrets(job string, j *rdzvv1.Job) (sealed bool, err error) {
	sealed = true
	for k, v := range j.GetSpec().GetSecretEnv() {
		plain, primary, err := s.keys.Open(v, secretContext(job, k))
		switch {
		case errors.Is(err, keyring.ErrNotSealed):
			sealed = false
			continue
		case err != nil:
			// Only the variable's name: never the value, sealed or not.
			return false, fmt.Errorf("opening secret_env %s: %w", k, err)
		}
		sealed = sealed && primary
		j.Spec.SecretEnv[k] = plain
	}
	return sealed, nil
}

// secretContext binds a sealed value to its job and variable, so that it
// does not open when copied to another.
func secretContext(job, name string) []byte {
	return []byte("rdzv/v1 secret_env\x00" + job + "\x00" + name)
}
