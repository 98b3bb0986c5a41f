package controller

// Lists (jobs, nodes, events) a page at a time. A page is bounded in items
// and in encoded bytes (wire.MaxPageBytes), so that no number of jobs,
// nodes or events, each within its own limits, can make a list answer
// outgrow the gRPC message limit and fail for everyone.

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/rendezvous"
	"github.com/rdzv/rdzv/wire"
)

// Page sizes: the default when a request asks for none, and the most a page
// holds whatever it asks.
const (
	defaultJobPageSize   = 100
	maxJobPageSize       = 1000
	defaultNodePageSize  = 1000
	maxNodePageSize      = 10000
	defaultEventPageSize = 1000
	maxEventPageSize     = 10000
	// maxPageTokenBytes bounds a page token a client sends back; ours are
	// far shorter.
	maxPageTokenBytes = 1024
	// maxStateFilters bounds a list's states filter (a state named twice
	// is allowed, not a thousand of them).
	maxStateFilters = 16
)

// The lists a page token continues.
const (
	jobsToken   = "jobs"
	nodesToken  = "nodes"
	eventsToken = "events/"
)

// pageToken is what a next_page_token carries, opaque to clients.
type pageToken struct {
	// List is the list it continues (jobsToken, nodesToken, eventsToken+scope);
	// any other list refuses it.
	List string `json:"l"`
	// After is the sort key of the previous page's last item.
	After string `json:"a"`
	// Left is how many of the newest-limit events remain (events only).
	Left int `json:"n,omitempty"`
}

func (t pageToken) encode() string {
	b, err := json.Marshal(t)
	if err != nil {
		panic(fmt.Sprintf("encoding a page token: %v", err)) // strings and an int always encode
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodePageToken reads the page token s of list; "" is the first page.
func decodePageToken(s, list string) (pageToken, error) {
	var t pageToken
	if s == "" {
		return t, nil
	}
	if len(s) > maxPageTokenBytes {
		return t, fmt.Errorf("page_token: at most %d bytes, got %d", maxPageTokenBytes, len(s))
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &t)
	}
	if err != nil || t.List != list || t.After == "" || t.Left < 0 || t.Left > maxEventLimit {
		return pageToken{}, fmt.Errorf("page_token: %q is not the next_page_token of a previous page of this list; list again without it", clip(s))
	}
	return t, nil
}

// pageSize is the items a page may hold when a request asks for n.
func pageSize(n int32, def, most int) int {
	if n <= 0 {
		return def
	}
	return min(int(n), most)
}

func pageSizeErr(n int32) error {
	if n < 0 {
		return fmt.Errorf("page_size: must be 0 (the default) or more, got %d", n)
	}
	return nil
}

// statesErr checks a states filter against an enum's names.
func statesErr[E ~int32](field string, states []E, names map[int32]string) error {
	if len(states) > maxStateFilters {
		return fmt.Errorf("%s: at most %d, got %d", field, maxStateFilters, len(states))
	}
	for _, s := range states {
		if _, ok := names[int32(s)]; !ok || s == 0 {
			return fmt.Errorf("%s: %d is not a state; want one of %v", field, s, stateNames(names))
		}
	}
	return nil
}

func stateNames(names map[int32]string) []string {
	var out []string
	for _, v := range slices.Sorted(maps.Keys(names)) {
		if v != 0 {
			out = append(out, names[v])
		}
	}
	return out
}

// keyed is an item of a list with its sort key.
type keyed[T any] struct {
	key  string
	item T
}

// fillPage turns items (sorted by key, all after the request's token) into
// a page of views of at most limit items and wire.MaxPageBytes (but at
// least one item), and returns it with the next page's token, "" when
// nothing is left.
func fillPage[T any, V proto.Message](list string, items []keyed[T], limit int, view func(T) V) ([]V, string) {
	var page []V
	size := 0
	for i, it := range items {
		if i == limit {
			return page, pageToken{List: list, After: items[i-1].key}.encode()
		}
		v := view(it.item)
		n := wire.ItemBytes(proto.Size(v))
		if i > 0 && size+n > wire.MaxPageBytes {
			return page, pageToken{List: list, After: items[i-1].key}.encode()
		}
		page, size = append(page, v), size+n
	}
	return page, ""
}

func sortKeyed[T any](items []keyed[T]) {
	sort.Slice(items, func(i, j int) bool { return items[i].key < items[j].key })
}

// jobSortKey orders jobs by creation, then name: the order `rdzvctl list`
// shows.
func jobSortKey(js *jobState) string {
	return fmt.Sprintf("%020d/%s", max(js.rec.GetCreatedAt().AsTime().UnixNano(), 0), js.rec.GetSpec().GetName())
}

// list is the page of jobs req asks for, from tok on, as seen at now.
func (jt jobTable) list(req *rdzvv1.ListJobsRequest, tok pageToken, now time.Time) *rdzvv1.ListJobsResponse {
	var items []keyed[*jobState]
	for _, js := range jt {
		if len(req.GetStates()) > 0 && !slices.Contains(req.GetStates(), js.rec.GetState()) {
			continue
		}
		if key := jobSortKey(js); key > tok.After {
			items = append(items, keyed[*jobState]{key, js})
		}
	}
	sortKeyed(items)
	view := func(js *jobState) *rdzvv1.Job { return js.apiView(now) }
	if req.GetView() != rdzvv1.JobView_JOB_VIEW_FULL {
		view = func(js *jobState) *rdzvv1.Job { return summarize(js.apiView(now)) }
	}
	jobs, next := fillPage(jobsToken, items, pageSize(req.GetPageSize(), defaultJobPageSize, maxJobPageSize), view)
	return &rdzvv1.ListJobsResponse{Jobs: jobs, NextPageToken: next}
}

// summarize trims a job view to JOB_VIEW_SUMMARY: without the fields whose
// sum over a page is large (the spec's command, environment, launcher
// arguments and custom launcher argv, up to 512 KiB a job; the assignments'
// messages, up to 4 KiB a node; the incidents). What is left is at most some 100 KiB plus under 1 KiB per node,
// so a summary after a full page still fits a message
// (TestLargestJobSummaryFitsAfterAFullPage).
func summarize(j *rdzvv1.Job) *rdzvv1.Job {
	s := j.GetSpec()
	s.Command, s.Env, s.SecretEnv, s.EnvFiles, s.LauncherExtraArgs, s.LauncherArgv = nil, nil, nil, nil, nil, nil
	j.Incidents = nil
	for _, a := range j.GetAssignments() {
		a.Message = ""
	}
	return j
}

// list is the page of nodes req asks for, from tok on.
func (nt nodeTable) list(req *rdzvv1.ListNodesRequest, tok pageToken) *rdzvv1.ListNodesResponse {
	var items []keyed[*nodeState]
	for name, ns := range nt {
		if name <= tok.After || !nodeMatches(ns, viewState(ns), req.GetStates(), req.GetSelector()) {
			continue
		}
		items = append(items, keyed[*nodeState]{name, ns})
	}
	sortKeyed(items)
	nodes, next := fillPage(nodesToken, items, pageSize(req.GetPageSize(), defaultNodePageSize, maxNodePageSize), (*nodeState).apiView)
	return &rdzvv1.ListNodesResponse{Nodes: nodes, NextPageToken: next}
}

// nodeMatches is the filter of node lists and summaries: one of states
// (any, if none), and every label of selector.
func nodeMatches(ns *nodeState, state rdzvv1.NodeState, states []rdzvv1.NodeState, selector map[string]string) bool {
	return (len(states) == 0 || slices.Contains(states, state)) && rendezvous.Matches(selector, ns.info.labels)
}

// maxAttention is how many of the nodes that need attention a summary
// names: the rest are a --state away.
const maxAttention = 20

// summarize counts the nodes that match req in one pass (no copy of any
// node but the few it names), so a summary of the whole cluster costs what
// one page of a list does.
func (nt nodeTable) summarize(req *rdzvv1.SummarizeNodesRequest) *rdzvv1.SummarizeNodesResponse {
	resp := &rdzvv1.SummarizeNodesResponse{}
	states := map[rdzvv1.NodeState]*rdzvv1.NodeStateCount{}
	jobs := map[string]int32{}
	var attention []keyed[*nodeState]
	for name, ns := range nt {
		state := viewState(ns)
		if !nodeMatches(ns, state, req.GetStates(), req.GetSelector()) {
			continue
		}
		gpus := int32(len(ns.info.gpuIndices))
		resp.Nodes++
		resp.Gpus += gpus
		sc := states[state]
		if sc == nil {
			sc = &rdzvv1.NodeStateCount{State: state}
			states[state] = sc
		}
		sc.Nodes++
		sc.Gpus += gpus
		if ns.job != "" {
			jobs[ns.job]++
		}
		needs := state == rdzvv1.NodeState_NODE_STATE_LOST || state == rdzvv1.NodeState_NODE_STATE_DRAINED
		if ns.rec.GetCordoned() {
			resp.Cordoned++
			needs = true
		}
		if ns.rec.GetDraining() {
			resp.Draining++
			needs = true
		}
		if slices.ContainsFunc(ns.health, func(r *rdzvv1.HealthCheckResult) bool { return !r.GetOk() }) {
			resp.Unhealthy++
			needs = true
		}
		if ns.rec.GetRestartHoldUntil() != nil {
			resp.AgentRestarting++
			needs = true
		}
		if needs {
			attention = append(attention, keyed[*nodeState]{name, ns})
		}
	}
	resp.AttentionTotal = int32(len(attention))
	sortKeyed(attention)
	for _, k := range attention[:min(len(attention), maxAttention)] {
		resp.Attention = append(resp.Attention, k.item.apiView())
	}
	for _, sc := range states {
		resp.States = append(resp.States, sc)
	}
	slices.SortFunc(resp.States, func(a, b *rdzvv1.NodeStateCount) int { return int(a.GetState() - b.GetState()) })
	for _, job := range slices.Sorted(maps.Keys(jobs)) {
		resp.Jobs = append(resp.Jobs, &rdzvv1.JobNodeCount{Job: job, Nodes: jobs[job]})
	}
	return resp
}
