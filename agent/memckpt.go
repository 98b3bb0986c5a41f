package agent

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// In-memory checkpoints (docs/checkpoints.md). Each worker writes its
// rank's shard of a step into its generation's directory in shared memory
// (the rdzv Python package's rdzv.checkpoint.save) and reports it; the
// agent indexes it, copies it to its replica peers over mutual TLS
// (memckpt_peer.go), and keeps the replicas its peers send it in memory,
// within the job's checkpoint.memory.max_bytes for everything together.
// The index rides on the progress reports to the controller, which picks
// the step a recovery resumes from and tells each agent where each of its
// ranks' shards is; the agent fetches them before its workers start.

// Environment of the workers with checkpoint.memory.
const (
	memDirEnv    = "RDZV_MEMCKPT_DIR"
	memResumeEnv = "RDZV_RESUME_MEMORY"
	// memResumeWorldEnv is the world size that saved the step of
	// memResumeEnv: another than the generation's when the job's state is
	// replicated (checkpoint.memory.replicated), and rank R then reads the
	// shard of rank R modulo it, which prepare fetched under that rank.
	memResumeWorldEnv = "RDZV_RESUME_MEMORY_WORLD"
	// memPersistEnv is checkpoint.memory.persist_every, for the workers'
	// rdzv.checkpoint.save (python/src/rdzv/checkpoint.py).
	memPersistEnv = "RDZV_MEMCKPT_PERSIST_EVERY"
)

// shardName is the file name of rank's shard of step in a generation's
// directory (python/src/rdzv/checkpoint.py writes it).
func shardName(step uint64, rank uint32) string {
	return "step-" + strconv.FormatUint(step, 10) + "-rank-" + strconv.FormatUint(uint64(rank), 10) + ".pt"
}

// shardKey is one rank's shard of one step of one generation.
type shardKey struct {
	gen, step uint64
	rank      uint32
}

func (k shardKey) stepOf() stepKey { return stepKey{k.gen, k.step} }

type stepKey struct{ gen, step uint64 }

func (a stepKey) compare(b stepKey) int {
	return cmp.Or(cmp.Compare(a.gen, b.gen), cmp.Compare(a.step, b.step))
}

// shard is a shard held here: an own one in a file (path), or a peer's
// replica in memory (data).
type shard struct {
	size int64
	sum  [sha256.Size]byte
	path string
	data []byte
}

// memMaxSteps bounds the steps a node keeps of a job, whatever their
// size: a recovery wants the newest complete one, and the holdings ride on
// every progress report that follows a change (the controller takes at
// most 64 entries).
const memMaxSteps = 16

// memIndex is one job's shards on this node within maxBytes and
// memMaxSteps steps. A plain value without I/O; memStore's lock guards it.
type memIndex struct {
	maxBytes int64
	bytes    int64
	shards   map[shardKey]*shard
}

// add enters s as k (replacing what k held), then evicts the oldest steps,
// by generation then step, other than k's until the index is within
// maxBytes. It returns the shards evicted, whose files the caller removes,
// and whether k itself was kept: not when it does not fit even alone with
// its step.
func (x *memIndex) add(k shardKey, s *shard) (evicted []*shard, kept bool) {
	if x.shards == nil {
		x.shards = map[shardKey]*shard{}
	}
	if old := x.shards[k]; old != nil {
		x.bytes -= old.size
		evicted = append(evicted, old)
	}
	x.shards[k], x.bytes = s, x.bytes+s.size
	steps := map[stepKey]bool{}
	for key := range x.shards {
		steps[key.stepOf()] = true
	}
	if x.bytes <= x.maxBytes && len(steps) <= memMaxSteps {
		return evicted, true
	}
	keys := slices.SortedFunc(func(yield func(shardKey) bool) {
		for key := range x.shards {
			if !yield(key) {
				return
			}
		}
	}, func(a, b shardKey) int { return cmp.Or(a.stepOf().compare(b.stepOf()), cmp.Compare(a.rank, b.rank)) })
	for _, key := range keys {
		if x.bytes <= x.maxBytes && len(steps) <= memMaxSteps {
			break
		}
		if key.stepOf() == k.stepOf() {
			continue
		}
		evicted = append(evicted, x.remove(key))
		if !x.holdsStep(key.stepOf()) {
			delete(steps, key.stepOf())
		}
	}
	if x.bytes > x.maxBytes {
		evicted = append(evicted, x.remove(k))
		return evicted, false
	}
	return evicted, true
}

// usage is the index's bytes in own shards (files in shared memory) and in
// peers' replicas (in the agent's memory), and its steps.
func (x *memIndex) usage() (own, replica int64, steps int) {
	seen := map[stepKey]bool{}
	for k, s := range x.shards {
		if s.data != nil {
			replica += s.size
		} else {
			own += s.size
		}
		seen[k.stepOf()] = true
	}
	return own, replica, len(seen)
}

func (x *memIndex) holdsStep(s stepKey) bool {
	for k := range x.shards {
		if k.stepOf() == s {
			return true
		}
	}
	return false
}

func (x *memIndex) remove(k shardKey) *shard {
	s := x.shards[k]
	delete(x.shards, k)
	x.bytes -= s.size
	return s
}

// held summarises the index for the controller: the ranks of each step,
// oldest step first, ranks in order.
func (x *memIndex) held() []*rdzvv1.MemoryHeld {
	by := map[stepKey][]uint32{}
	for k := range x.shards {
		by[k.stepOf()] = append(by[k.stepOf()], k.rank)
	}
	steps := slices.SortedFunc(func(yield func(stepKey) bool) {
		for k := range by {
			if !yield(k) {
				return
			}
		}
	}, stepKey.compare)
	out := make([]*rdzvv1.MemoryHeld, 0, len(steps))
	for _, k := range steps {
		ranks := by[k]
		slices.Sort(ranks)
		out = append(out, &rdzvv1.MemoryHeld{Generation: k.gen, Step: k.step, Ranks: ranks})
	}
	return out
}

// memJob is one job's in-memory checkpoints on this node.
type memJob struct {
	idx memIndex
	// gen is the generation running here, dir its directory, cred its
	// workers' user, peers where its shards are copied.
	gen   uint64
	dir   string
	cred  *syscall.Credential
	peers []*rdzvv1.ReplicaPeer
	// queue holds the own shards to copy to the peers, one at a time, in
	// the order reported; drop closes it.
	queue chan shardKey
}

// memStore holds this node's in-memory checkpoints. One lock guards jobs;
// files and the network are used outside it.
type memStore struct {
	// root is this node's directory in shared memory; each job has
	// root/JOB (root's, 0755) and in it one directory per generation
	// (the job's user's, 0700).
	root string
	node string
	log  *zap.Logger
	// peerTLS is the TLS configuration for dialing node's peer listener;
	// nil when the agent runs without TLS: shards then stay on the node.
	peerTLS func(node string) *tls.Config
	// clients are the HTTP clients to peers, with their connections.
	clients peerClients

	mu   sync.Mutex
	jobs map[string]*memJob
}

func newMemStore(root, node string, log *zap.Logger) *memStore {
	return &memStore{root: filepath.Join(root, node), node: node, log: log, jobs: map[string]*memJob{}}
}

var (
	// errMemOff marks a shard for a job without checkpoint.memory here.
	errMemOff = errors.New("no in-memory checkpoints of this job on this node")
	// errShardMissing marks a shard this node does not hold.
	errShardMissing = errors.New("shard not held on this node")
	// errShardTooBig marks a shard beyond the job's checkpoint.memory.max_bytes.
	errShardTooBig = errors.New("shard exceeds checkpoint.memory.max_bytes")
	// errShardSum marks a shard whose bytes do not match its checksum.
	errShardSum = errors.New("shard does not match its sha256")
)

// prepare makes generation a's directory for its workers, fetches the
// shards a resumes from, and returns the variables that tell the workers.
// Nothing when the job has no checkpoint.memory. An error means the
// generation cannot resume as told (wire.FailureMemoryFetch).
func (m *memStore) prepare(ctx context.Context, a *rdzvv1.Assignment, cred *syscall.Credential) (map[string]string, error) {
	spec := a.GetSpec()
	mc := spec.GetCheckpointMemory()
	if mc == nil {
		return nil, nil
	}
	job, gen := spec.GetName(), a.GetGeneration()
	jobDir := filepath.Join(m.root, job)
	dir := filepath.Join(jobDir, "g"+strconv.FormatUint(gen, 10))
	if err := os.MkdirAll(jobDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating in-memory checkpoint directory: %w", err)
	}
	// A leftover of an agent before this one: nothing in the index.
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("clearing in-memory checkpoint directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating in-memory checkpoint directory: %w", err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("handing the in-memory checkpoint directory to the job's user: %w", err)
		}
	}
	j := m.track(a, dir, cred)

	env := map[string]string{memDirEnv: dir}
	if n := mc.GetPersistEvery(); n > 0 {
		env[memPersistEnv] = strconv.FormatUint(uint64(n), 10)
	}
	srcs := a.GetMemorySources()
	if len(srcs) == 0 {
		return env, nil
	}
	from := a.GetResumeMemoryGeneration()
	step := a.GetResumeMemoryStep()
	for _, src := range srcs {
		k := shardKey{from, step, src.GetRank()}
		fctx, cancel := context.WithTimeout(ctx, peerTimeout)
		data, sum, err := m.shardFor(fctx, job, k, src)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("fetching rank %d's shard of in-memory step %d (generation %d) from node %s: %w", k.rank, step, from, src.GetNode(), err)
		}
		path := filepath.Join(dir, shardName(step, k.rank))
		if err := writeShard(path, data, cred); err != nil {
			return nil, fmt.Errorf("writing rank %d's shard of in-memory step %d: %w", k.rank, step, err)
		}
		m.mu.Lock()
		if j.idx.shards[k] == nil {
			// Now held here too, for the next recovery.
			j.idx.add(k, &shard{size: int64(len(data)), sum: sum, path: path})
		}
		m.mu.Unlock()
	}
	env[memResumeEnv] = strconv.FormatUint(step, 10)
	env[memResumeWorldEnv] = strconv.FormatUint(uint64(cmp.Or(a.GetResumeMemoryWorldSize(), a.GetNnodes()*a.GetProcsPerNode())), 10)
	return env, nil
}

// track makes a's generation the one whose shards job's index takes from
// now on, in dir, and returns the job's entry.
func (m *memStore) track(a *rdzvv1.Assignment, dir string, cred *syscall.Credential) *memJob {
	job := a.GetSpec().GetName()
	m.mu.Lock()
	defer m.mu.Unlock()
	j := m.jobs[job]
	if j == nil {
		j = &memJob{queue: make(chan shardKey, 256)}
		m.jobs[job] = j
		go m.replicateLoop(job, j)
	}
	j.idx.maxBytes = int64(min(a.GetSpec().GetCheckpointMemory().GetMaxBytes(), 1<<62))
	j.gen, j.dir, j.cred, j.peers = a.GetGeneration(), dir, cred, a.GetReplicaPeers()
	return j
}

// adopt takes the reports of new shards from a's generation, whose workers
// a previous agent left running (Supervisor.Adopt), as prepare would have
// for its start. The shards they saved before are not indexed: that
// agent's index, with their checksums, went with it. Their files stay in
// the generation's directory, at most the job's max_bytes, until the job
// ends (drop).
func (m *memStore) adopt(a *rdzvv1.Assignment, cred *syscall.Credential) {
	if a.GetSpec().GetCheckpointMemory() == nil || wire.ValidateName("job", a.GetSpec().GetName()) != nil {
		return
	}
	m.track(a, filepath.Join(m.root, a.GetSpec().GetName(), "g"+strconv.FormatUint(a.GetGeneration(), 10)), cred)
}

// sweep frees what a previous agent left in shared memory, every job's
// directory but keep's (the adopted workers' job; "" for none): that
// agent's index of them went with it, so nothing would ever serve or free
// them, and tmpfs pages are the node's memory. Call it before the first
// registration, once adoption is done.
func (m *memStore) sweep(keep string) {
	entries, err := os.ReadDir(m.root)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			m.log.Warn("listing in-memory checkpoints left by a previous agent failed", zap.String("dir", m.root), zap.Error(err))
		}
		return
	}
	for _, e := range entries {
		if e.Name() == keep {
			continue
		}
		if err := os.RemoveAll(filepath.Join(m.root, e.Name())); err != nil {
			m.log.Warn("removing in-memory checkpoints left by a previous agent failed", zap.String("job", e.Name()), zap.Error(err))
			continue
		}
		m.log.Info("in-memory checkpoints left by a previous agent freed", zap.String("job", e.Name()))
	}
}

// shardFor is k's shard: this node's when src names it, else src's.
func (m *memStore) shardFor(ctx context.Context, job string, k shardKey, src *rdzvv1.ShardSource) ([]byte, [sha256.Size]byte, error) {
	if src.GetNode() == m.node {
		return m.get(job, k)
	}
	if m.peerTLS == nil {
		return nil, [sha256.Size]byte{}, errors.New("this agent runs without TLS, so it has no peers to fetch from")
	}
	return fetchShard(ctx, m.clients.get(src.GetNode(), m.peerTLS, time.Now()), src.GetAddr(), job, k, m.limit(job))
}

// writeShard creates path, a new file, with data, for cred's user, 0600.
func writeShard(path string, data []byte, cred *syscall.Credential) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if cred != nil {
		if err := f.Chown(int(cred.Uid), int(cred.Gid)); err != nil {
			f.Close()
			return err
		}
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// reported enters a shard the running generation gen of job wrote, as its
// worker reported it, and queues its copy to the peers.
func (m *memStore) reported(job string, gen, step uint64, rank uint32, size int64, sum [sha256.Size]byte) error {
	m.mu.Lock()
	j := m.jobs[job]
	if j == nil || j.gen != gen {
		m.mu.Unlock()
		return fmt.Errorf("job %s generation %d: %w", job, gen, errMemOff)
	}
	if size > j.idx.maxBytes {
		m.mu.Unlock()
		return fmt.Errorf("%d bytes: %w (%d)", size, errShardTooBig, j.idx.maxBytes)
	}
	k := shardKey{gen, step, rank}
	evicted, kept := j.idx.add(k, &shard{size: size, sum: sum, path: filepath.Join(j.dir, shardName(step, rank))})
	queued := true
	if kept {
		// Under the lock: drop closes the queue under it.
		select {
		case j.queue <- k:
		default:
			queued = false
		}
	}
	limit := j.idx.maxBytes
	m.mu.Unlock()
	m.free(evicted)
	if !kept {
		return fmt.Errorf("%d bytes: %w (%d) with this node's other shards of the step", size, errShardTooBig, limit)
	}
	if !queued {
		m.log.Warn("replication queue full, shard kept on this node only", zap.String("job", job), zap.Uint64("step", step), zap.Uint32("rank", rank))
	}
	return nil
}

// free removes the files of evicted own shards; replicas go with the GC.
func (m *memStore) free(evicted []*shard) {
	for _, s := range evicted {
		if s.path != "" {
			if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
				m.log.Warn("removing evicted shard failed", zap.String("path", s.path), zap.Error(err))
			}
		}
	}
}

// replicateLoop copies job's queued shards to its peers, one at a time,
// until the job is dropped (its queue closed).
func (m *memStore) replicateLoop(job string, j *memJob) {
	for k := range j.queue {
		m.mu.Lock()
		peers := j.peers
		m.mu.Unlock()
		if m.peerTLS == nil || len(peers) == 0 {
			continue
		}
		data, sum, err := m.get(job, k)
		if err != nil {
			m.log.Warn("reading shard to replicate failed", zap.String("job", job), zap.Uint64("step", k.step), zap.Uint32("rank", k.rank), zap.Error(err))
			continue
		}
		for _, p := range peers {
			ctx, cancel := context.WithTimeout(context.Background(), peerTimeout)
			err := pushShard(ctx, m.clients.get(p.GetNode(), m.peerTLS, time.Now()), p.GetAddr(), job, k, data, sum)
			cancel()
			if err != nil {
				m.log.Warn("replicating shard failed", zap.String("job", job), zap.String("peer", p.GetNode()), zap.Uint64("step", k.step), zap.Uint32("rank", k.rank), zap.Error(err))
				continue
			}
			m.log.Debug("shard replicated", zap.String("job", job), zap.String("peer", p.GetNode()), zap.Uint64("step", k.step), zap.Uint32("rank", k.rank))
		}
	}
}

// get is k's shard of job as held here. An own shard's file is read as the
// job's user, without following a link (the directory is that user's), and
// checked against the checksum its worker reported: the file may have
// changed since. A replica is in this agent's memory, checked when it was
// received and immutable since, so it is not hashed again (a gigabyte's
// hash is about a second on a loaded core); whoever fetches it checks the
// checksum sent with it anyway.
func (m *memStore) get(job string, k shardKey) ([]byte, [sha256.Size]byte, error) {
	m.mu.Lock()
	j := m.jobs[job]
	var s *shard
	var cred *syscall.Credential
	if j != nil {
		s, cred = j.idx.shards[k], j.cred
	}
	m.mu.Unlock()
	if s == nil {
		return nil, [sha256.Size]byte{}, errShardMissing
	}
	if s.data != nil {
		return s.data, s.sum, nil
	}
	data, err := readShard(s.path, s.size, cred)
	if err != nil {
		return nil, s.sum, err
	}
	if sha256.Sum256(data) != s.sum {
		return nil, s.sum, errShardSum
	}
	return data, s.sum, nil
}

func readShard(path string, size int64, cred *syscall.Credential) ([]byte, error) {
	var data []byte
	err := asUser(cred, func() error {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return &os.PathError{Op: "open", Path: path, Err: err}
		}
		f := os.NewFile(uintptr(fd), path)
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() || st.Size() != size {
			return fmt.Errorf("%s: not the regular file of %d bytes reported", path, size)
		}
		data = make([]byte, size)
		_, err = io.ReadFull(f, data)
		return err
	})
	return data, err
}

// receive keeps a peer's replica of k of job, when this node runs the job.
func (m *memStore) receive(job string, k shardKey, data []byte, sum [sha256.Size]byte) error {
	if sha256.Sum256(data) != sum {
		return errShardSum
	}
	m.mu.Lock()
	j := m.jobs[job]
	if j == nil {
		m.mu.Unlock()
		return errMemOff
	}
	evicted, kept := j.idx.add(k, &shard{size: int64(len(data)), sum: sum, data: data})
	m.mu.Unlock()
	m.free(evicted)
	if !kept {
		return errShardTooBig
	}
	return nil
}

// heldAll is what this node holds of every job's in-memory checkpoints,
// for a registration: at most wire.MaxRegisterMemoryJobs jobs, by name.
func (m *memStore) heldAll() []*rdzvv1.JobMemoryHeld {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*rdzvv1.JobMemoryHeld
	for _, name := range slices.Sorted(maps.Keys(m.jobs)) {
		if held := m.jobs[name].idx.held(); len(held) > 0 && len(out) < wire.MaxRegisterMemoryJobs {
			out = append(out, &rdzvv1.JobMemoryHeld{Job: name, Held: held})
		}
	}
	return out
}

// limit is the most bytes a shard of job may have here; 0 when this node
// keeps none of job's.
func (m *memStore) limit(job string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if j := m.jobs[job]; j != nil {
		return j.idx.maxBytes
	}
	return 0
}

// held is what this node holds of job's in-memory checkpoints, and how
// many bytes.
func (m *memStore) held(job string) ([]*rdzvv1.MemoryHeld, int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if j := m.jobs[job]; j != nil {
		return j.idx.held(), j.idx.bytes
	}
	return nil, 0
}

// memUsage is one job's in-memory checkpoints on this node, for the
// metrics.
type memUsage struct {
	job                 string
	own, replica, limit int64
	steps               int
}

// usage is every job's memUsage, in no order.
func (m *memStore) usage() []memUsage {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]memUsage, 0, len(m.jobs))
	for name, j := range m.jobs {
		own, replica, steps := j.idx.usage()
		out = append(out, memUsage{job: name, own: own, replica: replica, limit: j.idx.maxBytes, steps: steps})
	}
	return out
}

// drop frees everything of job: it runs no further generation.
func (m *memStore) drop(job string) {
	if err := wire.ValidateName("job", job); err != nil {
		return
	}
	m.mu.Lock()
	j := m.jobs[job]
	delete(m.jobs, job)
	if j != nil {
		close(j.queue)
	}
	m.mu.Unlock()
	// Files too when the index has none: an adopted generation's shards
	// from before this agent started are in no index.
	dir := filepath.Join(m.root, job)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		m.log.Warn("removing in-memory checkpoints failed", zap.String("job", job), zap.Error(err))
	}
	m.log.Info("in-memory checkpoints freed", zap.String("job", job))
}
