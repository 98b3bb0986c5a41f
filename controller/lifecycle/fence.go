package lifecycle

import (
	"time"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Member is what fencing needs to know of a node of a generation's round.
type Member struct {
	// Running: the node is connected (known and not lost) and its
	// workers' exit is not reported yet.
	Running bool
	// FencedBy is, for a lost node, when its agent, if merely cut off,
	// has killed its own workers; zero for any other node. Its workers'
	// status says failed, but only because it was lost: the processes may
	// live on until then.
	FencedBy time.Time
}

// FencedAt is when no worker of the round's generation can still be
// running: each node's workers have exited, or its node is lost and past
// FencedBy. ok is false while a connected node's workers run, which only
// their exit report can change. Only once fenced may the next generation
// start: two generations never run at once. member says what is known of
// a node; cursor is the caller's search cache for the round (Find).
func FencedAt(r *rdzvv1.Round, cursor *int, member func(node string) Member) (at time.Time, ok bool) {
	if Find(r, cursor, func(a *rdzvv1.NodeAssignment) bool { return member(a.GetNode()).Running }) {
		return time.Time{}, false
	}
	for _, a := range r.GetNodes() {
		if by := member(a.GetNode()).FencedBy; by.After(at) {
			at = by
		}
	}
	return at, true
}

// Find reports whether any node of the round satisfies match. It starts
// where its last search (*from) found one, wrapping around, and leaves
// *from at the node it finds. Whether one is found does not depend on
// where the search starts; starting there is what keeps a burst of N
// worker reports, each asking whether any node is still running (or not
// yet running), from costing O(N²): reports arrive about in rank order,
// so the node found last time is the next to report, and a search from
// the first rank would pass every node that reported already.
func Find(r *rdzvv1.Round, from *int, match func(*rdzvv1.NodeAssignment) bool) bool {
	nodes := r.GetNodes()
	if len(nodes) == 0 {
		return false
	}
	start := *from % len(nodes)
	for i := range nodes {
		j := (start + i) % len(nodes)
		if match(nodes[j]) {
			*from = j
			return true
		}
	}
	return false
}
