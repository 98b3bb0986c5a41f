// Package rendezvous decides which nodes run a job and with which ranks. It
// is pure logic with no I/O or clock of its own, so every rule is table
// tested; the controller feeds it snapshots and commits its decisions.
//
// Everything here is O(n log n) in the number of candidate nodes: a round
// over wire.MaxNodes nodes is one filter and one sort.
package rendezvous

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// TopologyLabel groups nodes for rank ordering: nodes sharing a value (for
// example "pod1/rack3") get adjacent ranks, which keeps ring neighbours
// close in the network.
const TopologyLabel = "topology"

// Requirements is what a job asks of its nodes.
type Requirements struct {
	Min, Max    int
	GPUsPerNode int
	Selector    map[string]string
	// Prefer are nodes Plan takes first when more qualify than Max: those
	// that already keep a warm standby of the job, whose workers start
	// without a Python start. Ranks are still by topology and name.
	Prefer map[string]bool
}

// Candidate is a node as the controller sees it at decision time.
type Candidate struct {
	Name      string
	Labels    map[string]string
	GPUs      []uint32 // GPU indices present on the node
	Address   string
	Interface string
	// Free is true when the node is registered, heartbeating, idle and not
	// cordoned.
	Free bool
	// Cordoned nodes (by an operator, a fault or a drain) take no work
	// however free; told apart from busy ones in Explain.
	Cordoned bool
	// Unhealthy is why the node's health checks keep it out of new rounds
	// (the failing checks in words); empty when they pass.
	Unhealthy string
}

// Placed is one node of a committed round.
type Placed struct {
	Candidate
	Rank       int
	GPUIndices []uint32
}

// ErrNotEnoughNodes is returned by Plan when fewer than Min nodes qualify.
var ErrNotEnoughNodes = errors.New("not enough eligible nodes")

// Eligible reports whether c can run a job with req, and if not, why.
func Eligible(req Requirements, c Candidate) (bool, Ineligibility) {
	switch {
	case c.Cordoned:
		return false, Cordoned
	case !c.Free:
		return false, NotFree
	case c.Unhealthy != "":
		return false, Unhealthy
	case len(c.GPUs) < req.GPUsPerNode:
		return false, TooFewGPUs
	case !Matches(req.Selector, c.Labels):
		return false, SelectorMismatch
	}
	return true, 0
}

// Ineligibility is why a node cannot take a job.
type Ineligibility int

const (
	NotFree Ineligibility = iota + 1
	TooFewGPUs
	Cordoned
	SelectorMismatch
	Unhealthy
)

// namedUnhealthy is how many unhealthy nodes Explain names, with their
// failing checks; maxUnhealthyText clips each one's.
const (
	namedUnhealthy   = 3
	maxUnhealthyText = 200
)

// Matches reports whether labels include every label of selector.
func Matches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Plan picks up to req.Max eligible nodes and ranks them deterministically:
// by topology label, then name. The same cluster state always yields the
// same ranks, so a rerun lands where an operator expects.
func Plan(req Requirements, candidates []Candidate) ([]Placed, error) {
	var eligible []Candidate
	for _, c := range candidates {
		if ok, _ := Eligible(req, c); ok {
			eligible = append(eligible, c)
		}
	}
	if len(eligible) < req.Min {
		return nil, fmt.Errorf("%w: %s", ErrNotEnoughNodes, Explain(req, candidates))
	}
	if len(eligible) > req.Max && len(req.Prefer) > 0 {
		sort.Slice(eligible, func(i, j int) bool {
			if pi, pj := req.Prefer[eligible[i].Name], req.Prefer[eligible[j].Name]; pi != pj {
				return pi
			}
			return less(eligible[i], eligible[j])
		})
		eligible = eligible[:req.Max]
	}
	sort.Slice(eligible, func(i, j int) bool { return less(eligible[i], eligible[j]) })
	if len(eligible) > req.Max {
		eligible = eligible[:req.Max]
	}
	placed := make([]Placed, len(eligible))
	for i, c := range eligible {
		placed[i] = Placed{Candidate: c, Rank: i, GPUIndices: pickGPUs(c.GPUs, req.GPUsPerNode)}
	}
	return placed, nil
}

func less(a, b Candidate) bool {
	ta, tb := a.Labels[TopologyLabel], b.Labels[TopologyLabel]
	if ta != tb {
		return ta < tb
	}
	return a.Name < b.Name
}

func pickGPUs(gpus []uint32, n int) []uint32 {
	sorted := append([]uint32(nil), gpus...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	return sorted[:n]
}

// Count returns how many candidates are eligible.
func Count(req Requirements, candidates []Candidate) int {
	n := 0
	for _, c := range candidates {
		if ok, _ := Eligible(req, c); ok {
			n++
		}
	}
	return n
}

// Explain says, for an operator, how many nodes qualify and why the others
// do not.
func Explain(req Requirements, candidates []Candidate) string {
	var eligible, cordoned, notFree, fewGPUs, mismatch, unhealthy int
	// The first few unhealthy nodes by name, so that the reason is the same
	// from one pass to the next.
	var sick []Candidate
	for _, c := range candidates {
		ok, why := Eligible(req, c)
		switch {
		case ok:
			eligible++
		case why == Cordoned:
			cordoned++
		case why == NotFree:
			notFree++
		case why == Unhealthy:
			unhealthy++
			i := sort.Search(len(sick), func(i int) bool { return sick[i].Name > c.Name })
			if i < namedUnhealthy {
				sick = append(sick[:i], append([]Candidate{c}, sick[i:]...)...)
				sick = sick[:min(len(sick), namedUnhealthy)]
			}
		case why == TooFewGPUs:
			fewGPUs++
		case why == SelectorMismatch:
			mismatch++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d nodes eligible, need %d", eligible, len(candidates), req.Min)
	if req.GPUsPerNode > 0 {
		fmt.Fprintf(&b, " with %d GPUs", req.GPUsPerNode)
	}
	if len(req.Selector) > 0 {
		fmt.Fprintf(&b, " matching %s", formatSelector(req.Selector))
	}
	var why []string
	if cordoned > 0 {
		why = append(why, fmt.Sprintf("%d cordoned or draining", cordoned))
	}
	if notFree > 0 {
		why = append(why, fmt.Sprintf("%d busy or not ready", notFree))
	}
	if fewGPUs > 0 {
		why = append(why, fmt.Sprintf("%d with too few GPUs", fewGPUs))
	}
	if mismatch > 0 {
		why = append(why, fmt.Sprintf("%d not matching the selector", mismatch))
	}
	if unhealthy > 0 {
		named := make([]string, len(sick))
		for i, c := range sick {
			text := c.Unhealthy
			if len(text) > maxUnhealthyText {
				cut := maxUnhealthyText
				for cut > 0 && !utf8.RuneStart(text[cut]) {
					cut--
				}
				text = text[:cut] + "..."
			}
			named[i] = c.Name + ": " + text
		}
		more := ""
		if unhealthy > len(sick) {
			more = fmt.Sprintf("; +%d more", unhealthy-len(sick))
		}
		why = append(why, fmt.Sprintf("%d failing health checks [%s%s]", unhealthy, strings.Join(named, "; "), more))
	}
	if len(why) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(why, ", "))
	}
	return b.String()
}

func formatSelector(sel map[string]string) string {
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + sel[k]
	}
	return strings.Join(parts, ",")
}

// LastCall tracks one job's wait for more nodes once its minimum is met:
// commit at once with max nodes, else wait up to the last-call window for
// more to appear, then commit with what is there.
type LastCall struct {
	minMetAt time.Time
}

// OpenAt starts the window at t unless it has started already. A job that
// restarts opens it when its failed generation is fenced off: the nodes that
// appear while that generation stops have had their last call too. The
// minimum must still be met when the job is next observed, or the window
// starts over.
func (l *LastCall) OpenAt(t time.Time) {
	if l.minMetAt.IsZero() {
		l.minMetAt = t
	}
}

// Decision is the outcome of one look at a waiting job.
type Decision struct {
	Commit bool
	// RecheckAt is when the decision may change without any new node; zero
	// when only a cluster change can change it.
	RecheckAt time.Time
	Reason    string
}

// Observe decides, given how many nodes are eligible now.
func (l *LastCall) Observe(now time.Time, eligible int, req Requirements, window time.Duration) Decision {
	if eligible < req.Min {
		l.minMetAt = time.Time{}
		return Decision{Reason: fmt.Sprintf("waiting for nodes: %d of %d eligible", eligible, req.Min)}
	}
	if eligible >= req.Max {
		return Decision{Commit: true, Reason: fmt.Sprintf("%d nodes eligible, the maximum", eligible)}
	}
	if l.minMetAt.IsZero() {
		l.minMetAt = now
	}
	deadline := l.minMetAt.Add(window)
	if !now.Before(deadline) {
		return Decision{Commit: true, Reason: fmt.Sprintf("last call over with %d of at most %d nodes", eligible, req.Max)}
	}
	return Decision{
		RecheckAt: deadline,
		Reason:    fmt.Sprintf("last call: %d of at most %d nodes eligible, waiting %s for more", eligible, req.Max, deadline.Sub(now).Round(time.Second)),
	}
}

// GPUWarning says why a job that asks for no GPUs may not mean it: nodes
// its selector matches have GPUs, and its workers will see none of them
// (CUDA_VISIBLE_DEVICES=""). It is "" for a job that asks for GPUs or
// whose nodes have none. A CPU-only job on GPU nodes is legitimate, so
// this is a warning at submission, not a refusal.
func GPUWarning(req Requirements, candidates []Candidate) string {
	if req.GPUsPerNode > 0 {
		return ""
	}
	matching, withGPUs, most := 0, 0, 0
	for _, c := range candidates {
		if !Matches(req.Selector, c.Labels) {
			continue
		}
		matching++
		if len(c.GPUs) > 0 {
			withGPUs++
			most = max(most, len(c.GPUs))
		}
	}
	if withGPUs == 0 {
		return ""
	}
	return fmt.Sprintf("gpus_per_node is not set, but %d of the %d nodes the job may run on have GPUs (up to %d each): "+
		"its workers will see none (CUDA_VISIBLE_DEVICES is empty); set gpus_per_node (and procs_per_node, one worker per GPU) "+
		"for a GPU job, or ignore this for a CPU-only one", withGPUs, matching, most)
}

// Grow says whether a job of req running on running nodes should restart
// on more, given the free candidates its round does not use: to is the
// width the restart aims for, at most req.Max; ok is false when no
// eligible node would join.
func Grow(req Requirements, running int, candidates []Candidate) (to int, ok bool) {
	if running >= req.Max {
		return running, false
	}
	to = min(running+Count(req, candidates), req.Max)
	return to, to > running
}
