package controller

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// In-memory checkpoints (docs/checkpoints.md): every node reports, riding
// on its progress messages, which shards of which (generation, step) it
// holds, its own and its peers' replicas. The controller keeps that in
// memory only (jobState.memHeld): after a controller failover the next
// recovery resumes from the durable checkpoint, as before, until the agents
// report again. At a commit, pickMemory chooses the step to resume from:
// one saved by a world of the new generation's size or, for a job whose
// state is replicated (checkpoint.memory.replicated), by any. The world
// size of each generation is kept beside the holdings (memWorld), also in
// memory only; after a failover only the running generation's is known
// (its round), so only its steps count then.
//
// A node of the current generation also reports shards of earlier
// generations: its own and its replicas, and those it fetched to resume.
// Such a shard must have been known before its generation was fenced: a
// fenced generation's node that resumes later (a stall, a frozen machine)
// can still push a shard to a peer that runs on in the next generation,
// and that peer would report it. So each commit seals what the job's
// holdings show of the generations up to the one ending (sealMemory), and
// later reports count shards of those generations only where sealed
// (sealedOnly).

// Event kinds of the checkpoint a new generation resumes from.
const (
	// EventResumeMemory: the generation resumes from an in-memory step held
	// by the nodes.
	EventResumeMemory = "resume_memory"
	// EventResumeDurable: checkpoint.memory is on but no complete in-memory
	// step survived (or the world changed and the state is not replicated,
	// or fetching one failed): the
	// generation resumes from the durable checkpoint.
	EventResumeDurable = "resume_durable"
)

// memKey is one in-memory step of one generation.
type memKey struct {
	generation, step uint64
}

// memPlan is where each rank of a generation resuming from memory finds
// its shard of step key.
type memPlan struct {
	key memKey
	// saved is the world size that saved the step; holders are the nodes
	// holding each of its ranks' shards, sorted.
	saved   uint32
	holders [][]string
}

// pickMemory is the newest in-memory step whose every rank, of the world
// that saved it, is held by a node alive says is usable, and that fits a
// generation of world ranks: saved by a world of that size, or by any
// when replicated (every rank's state is the same, so a rank takes that of
// its rank modulo the saving world's). Newest by generation first, then
// step, as a later generation trained on from an older state and its steps
// are the job's lineage now. worldOf gives a generation's world size, 0
// when unknown: its steps are never picked. Only shards of generations up
// to current count (no report can name a later one), and never skip (a
// step whose fetch failed before). A rank's shard counts only whole,
// within one (generation, step): shards of different generations are
// never mixed. ok is false when no step fits.
func pickMemory(held map[string][]*rdzvv1.MemoryHeld, alive func(node string) bool, worldOf func(gen uint64) uint32, world uint32, replicated bool, current uint64, skip map[memKey]bool) (memPlan, bool) {
	if world == 0 {
		return memPlan{}, false
	}
	byKey := map[memKey][][]string{}
	for _, node := range slices.Sorted(maps.Keys(held)) {
		if !alive(node) {
			continue
		}
		for _, h := range held[node] {
			k := memKey{h.GetGeneration(), h.GetStep()}
			saved := worldOf(k.generation)
			if k.generation > current || skip[k] || saved == 0 || (saved != world && !replicated) {
				continue
			}
			ranks := byKey[k]
			if ranks == nil {
				ranks = make([][]string, saved)
				byKey[k] = ranks
			}
			for _, r := range h.GetRanks() {
				if r < saved && !slices.Contains(ranks[r], node) {
					ranks[r] = append(ranks[r], node)
				}
			}
		}
	}
	keys := slices.SortedFunc(maps.Keys(byKey), func(a, b memKey) int {
		return cmp.Or(cmp.Compare(b.generation, a.generation), cmp.Compare(b.step, a.step))
	})
	for _, k := range keys {
		ranks := byKey[k]
		if !slices.ContainsFunc(ranks, func(nodes []string) bool { return len(nodes) == 0 }) {
			return memPlan{key: k, saved: uint32(len(ranks)), holders: ranks}, true
		}
	}
	return memPlan{}, false
}

// sources are where node, of node rank rank with ppn ranks, fetches the
// shards its ranks resume from, each once: that of saved rank r modulo
// the saving world's size for its rank r, from itself when it holds one,
// else from the first holder. addr gives a node's peer address.
func (p memPlan) sources(node string, rank, ppn uint32, addr func(node string) string) []*rdzvv1.ShardSource {
	out := make([]*rdzvv1.ShardSource, 0, ppn)
	if p.saved == 0 {
		return out
	}
	for r := rank * ppn; r < (rank+1)*ppn; r++ {
		s := r % p.saved
		if slices.ContainsFunc(out, func(src *rdzvv1.ShardSource) bool { return src.GetRank() == s }) {
			continue
		}
		from := p.holders[s][0]
		if slices.Contains(p.holders[s], node) {
			from = node
		}
		out = append(out, &rdzvv1.ShardSource{Rank: s, Node: from, Addr: addr(from)})
	}
	return out
}

// planMemory decides, at the commit of generation gen of js onto placed
// nodes, whether it resumes from memory, and returns the event saying which
// source it uses (nil when checkpoint.memory is off or there is nothing to
// resume). It seals what is held of the generation ending (sealMemory).
// It is asked before js.members.Round() becomes the new round.
func (nt nodeTable) planMemory(js *jobState, gen uint64, nodes int, now time.Time) (*memPlan, *rdzvv1.Event) {
	spec := js.rec.GetSpec()
	name := spec.GetName()
	if spec.GetCheckpointMemory() == nil || js.members.Round() == nil {
		return nil, nil
	}
	js.memSealed = sealMemory(js.memHeld, js.rec.GetGeneration())
	ending := js.rec.GetGeneration()
	world := uint32(nodes) * spec.GetProcsPerNode()
	js.noteWorld(ending, uint32(len(js.members.Round().GetNodes()))*spec.GetProcsPerNode())
	js.noteWorld(gen, world)
	durable := "from scratch"
	if cp := js.rec.GetLatestCheckpoint(); cp != nil {
		durable = fmt.Sprintf("from durable checkpoint step %d", cp.GetStep())
	}
	alive := func(node string) bool {
		ns := nt[node]
		return ns != nil && ns.session != nil && ns.info.peerAddr != "" && ns.rec.GetState() != rdzvv1.NodeState_NODE_STATE_LOST
	}
	replicated := spec.GetCheckpointMemory().GetReplicated()
	plan, ok := pickMemory(js.memHeld, alive, func(g uint64) uint32 { return js.memWorld[g] }, world, replicated, ending, js.memSkip)
	if !ok {
		if prev := len(js.members.Round().GetNodes()); prev != nodes && !replicated {
			return nil, newEvent(now, name, "", gen, EventResumeDurable, "generation %d resumes %s: the world changed (%d nodes, was %d), so in-memory shards do not fit (checkpoint.memory.replicated is off)", gen, durable, nodes, prev)
		}
		return nil, newEvent(now, name, "", gen, EventResumeDurable, "generation %d resumes %s: no in-memory step has every rank's shard on a node still here", gen, durable)
	}
	if cp := js.rec.GetLatestCheckpoint(); cp != nil && cp.GetStep() > plan.key.step && cp.GetGeneration() >= plan.key.generation {
		return nil, newEvent(now, name, "", gen, EventResumeDurable, "generation %d resumes %s: newer than in-memory step %d", gen, durable, plan.key.step)
	}
	if plan.saved != world {
		return &plan, newEvent(now, name, "", gen, EventResumeMemory, "generation %d resumes from in-memory step %d (saved by generation %d), held by the nodes; saved by %d ranks, so rank r takes the shard of rank r mod %d", gen, plan.key.step, plan.key.generation, plan.saved, plan.saved)
	}
	return &plan, newEvent(now, name, "", gen, EventResumeMemory, "generation %d resumes from in-memory step %d (saved by generation %d), held by the nodes", gen, plan.key.step, plan.key.generation)
}

// noteWorld records gen's world size for the steps it saves (memWorld),
// forgetting those of generations no node holds a step of any longer.
func (js *jobState) noteWorld(gen uint64, world uint32) {
	if js.memWorld == nil {
		js.memWorld = map[uint64]uint32{}
	}
	js.memWorld[gen] = world
	held := map[uint64]bool{}
	for _, hs := range js.memHeld {
		for _, h := range hs {
			held[h.GetGeneration()] = true
		}
	}
	for g := range js.memWorld {
		if g < js.rec.GetGeneration() && !held[g] {
			delete(js.memWorld, g)
		}
	}
}

// sealMemory is, per step of generations up to gen, the ranks any node
// holds, sorted: what a later generation's reports may still name of
// them. Holdings of earlier generations are already sealed ones
// (sealedOnly), so sealing again keeps their seal.
func sealMemory(held map[string][]*rdzvv1.MemoryHeld, gen uint64) map[memKey][]uint32 {
	sealed := map[memKey][]uint32{}
	for _, hs := range held {
		for _, h := range hs {
			if k := (memKey{h.GetGeneration(), h.GetStep()}); k.generation <= gen {
				sealed[k] = append(sealed[k], h.GetRanks()...)
			}
		}
	}
	for k, ranks := range sealed {
		slices.Sort(ranks)
		sealed[k] = slices.Compact(ranks)
	}
	return sealed
}

// sealedOnly is held, reported by a node of generation current, less the
// shards of earlier generations that sealed does not name: written, or
// made known, after their generation was fenced.
func sealedOnly(held []*rdzvv1.MemoryHeld, current uint64, sealed map[memKey][]uint32) []*rdzvv1.MemoryHeld {
	out := make([]*rdzvv1.MemoryHeld, 0, len(held))
	for _, h := range held {
		if h.GetGeneration() >= current {
			out = append(out, h)
			continue
		}
		known := sealed[memKey{h.GetGeneration(), h.GetStep()}]
		var ranks []uint32
		for _, r := range h.GetRanks() {
			if _, ok := slices.BinarySearch(known, r); ok {
				ranks = append(ranks, r)
			}
		}
		if len(ranks) > 0 {
			out = append(out, &rdzvv1.MemoryHeld{Generation: h.GetGeneration(), Step: h.GetStep(), Ranks: ranks})
		}
	}
	return out
}

// knownOnly is held less what known (what the node was known to hold) does
// not name of generations current and later: what a node outside the
// running generation registers can take away from its claims of the
// current generation, never add to them. Such a node may have been fenced,
// and have taken its workers' queued reports, late, on resuming.
func knownOnly(held []*rdzvv1.MemoryHeld, current uint64, known []*rdzvv1.MemoryHeld) []*rdzvv1.MemoryHeld {
	was := map[memKey][]uint32{}
	for _, h := range known {
		k := memKey{h.GetGeneration(), h.GetStep()}
		was[k] = append(was[k], h.GetRanks()...)
	}
	out := make([]*rdzvv1.MemoryHeld, 0, len(held))
	for _, h := range held {
		if h.GetGeneration() < current {
			out = append(out, h)
			continue
		}
		var ranks []uint32
		for _, r := range h.GetRanks() {
			if slices.Contains(was[memKey{h.GetGeneration(), h.GetStep()}], r) {
				ranks = append(ranks, r)
			}
		}
		if len(ranks) > 0 {
			out = append(out, &rdzvv1.MemoryHeld{Generation: h.GetGeneration(), Step: h.GetStep(), Ranks: ranks})
		}
	}
	return out
}

// memoryHeld records what node holds of js's in-memory checkpoints, as of
// its latest progress report or registration, less what was not known of
// earlier generations when they were fenced (sealedOnly) and, unless node
// runs in the job's running generation, anything of the current one it
// was not known to hold (knownOnly). Callers hold c.mu.
func (js *jobState) memoryHeld(node string, held []*rdzvv1.MemoryHeld) {
	if js.rec.GetSpec().GetCheckpointMemory() == nil {
		return
	}
	held = sealedOnly(held, js.rec.GetGeneration(), js.memSealed)
	if js.rec.GetState() != rdzvv1.JobState_JOB_STATE_RUNNING || !js.members.Member(node) {
		held = knownOnly(held, js.rec.GetGeneration(), js.memHeld[node])
	}
	js.setMemoryHeld(node, held)
}

// exitMemory records what node held of js's in-memory checkpoints as the
// workers of js's current generation on it exited (WorkerStatus.memory),
// in full, not only as knownOnly allows: the generation is still the
// job's, its commit has not sealed it, and node, a member not lost, is
// where those workers ran, so what they saved before exiting is of this
// lineage. That is what lets a recovery resume from the step saved just
// before the failure rather than from the one the last heartbeat carried.
// Callers hold c.mu.
func (js *jobState) exitMemory(node string, held []*rdzvv1.MemoryHeld) {
	if js.rec.GetSpec().GetCheckpointMemory() == nil {
		return
	}
	js.setMemoryHeld(node, sealedOnly(held, js.rec.GetGeneration(), js.memSealed))
}

func (js *jobState) setMemoryHeld(node string, held []*rdzvv1.MemoryHeld) {
	if js.memHeld == nil {
		js.memHeld = map[string][]*rdzvv1.MemoryHeld{}
	}
	if len(held) == 0 {
		delete(js.memHeld, node)
		return
	}
	js.memHeld[node] = held
}

// replicaPeers are the nodes a copies its shards to: those of the next
// replicas node ranks of round, wrapping, that have a peer address.
func (nt nodeTable) replicaPeers(round *rdzvv1.Round, a *rdzvv1.NodeAssignment, replicas int) []*rdzvv1.ReplicaPeer {
	nodes := round.GetNodes()
	var out []*rdzvv1.ReplicaPeer
	for i := 1; i <= replicas && i < len(nodes); i++ {
		peer := nodes[(int(a.GetNodeRank())+i)%len(nodes)].GetNode()
		if ns := nt[peer]; ns != nil && ns.info.peerAddr != "" {
			out = append(out, &rdzvv1.ReplicaPeer{Node: peer, Addr: ns.info.peerAddr})
		}
	}
	return out
}
