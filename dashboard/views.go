package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

var funcs = template.FuncMap{
	"jobState":  jobState,
	"nodeState": nodeState,
	"workerState": func(s rdzvv1.WorkerState) string {
		return strings.ToLower(strings.TrimPrefix(s.String(), "WORKER_STATE_"))
	},
	"ifaceKind": func(k rdzvv1.InterfaceKind) string {
		return strings.ToLower(strings.TrimPrefix(k.String(), "INTERFACE_KIND_"))
	},
	"when": when,
	// trainingPhase is empty when the job's phase is unknown.
	"trainingPhase": func(p rdzvv1.TrainingPhase) string {
		if p == rdzvv1.TrainingPhase_TRAINING_PHASE_UNSPECIFIED {
			return ""
		}
		return strings.ToLower(strings.TrimPrefix(p.String(), "TRAINING_PHASE_"))
	},
	"duration": func(d *durationpb.Duration) string { return d.AsDuration().String() },
	"gib":      func(b uint64) string { return fmt.Sprintf("%.0f GiB", float64(b)/(1<<30)) },
	"join":     strings.Join,
	"uints": func(v []uint32) string {
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = fmt.Sprint(x)
		}
		return strings.Join(s, ",")
	},
}

func jobState(s rdzvv1.JobState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "JOB_STATE_"))
}

func nodeState(s rdzvv1.NodeState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "NODE_STATE_"))
}

func when(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format("2006-01-02 15:04:05.000Z")
}

func (h *handler) call(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), readTimeout)
}

type overviewPage struct {
	Title string
	// Nodes is the table's first page; the counts are of every node.
	Nodes      []*rdzvv1.Node
	MoreNodes  bool
	NodeCount  int
	States     []stateCount
	GPUs, Busy int
	Jobs       []*rdzvv1.Job
	MoreJobs   bool
	JobStates  []stateCount
}

type stateCount struct {
	State string
	N     int
}

func count(states []string) []stateCount {
	n := map[string]int{}
	for _, s := range states {
		n[s]++
	}
	var out []stateCount
	for _, s := range slices.Sorted(maps.Keys(n)) {
		out = append(out, stateCount{s, n[s]})
	}
	return out
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.call(r)
	defer cancel()
	nodes, err := h.src.ListNodes(ctx, &rdzvv1.ListNodesRequest{PageSize: maxNodesShown})
	if err != nil {
		h.fail(w, err)
		return
	}
	// Counted by the controller: the table shows a page of a large
	// cluster, the cards all of it.
	summary, err := h.src.SummarizeNodes(ctx, &rdzvv1.SummarizeNodesRequest{})
	if err != nil {
		h.fail(w, err)
		return
	}
	jobs, err := h.src.ListJobs(ctx, &rdzvv1.ListJobsRequest{PageSize: maxJobsShown})
	if err != nil {
		h.fail(w, err)
		return
	}
	p := overviewPage{Title: "rdzv cluster", Nodes: nodes.GetNodes(), MoreNodes: nodes.GetNextPageToken() != "",
		NodeCount: int(summary.GetNodes()), GPUs: int(summary.GetGpus()), Jobs: jobs.GetJobs(), MoreJobs: jobs.GetNextPageToken() != ""}
	for _, sc := range summary.GetStates() {
		p.States = append(p.States, stateCount{nodeState(sc.GetState()), int(sc.GetNodes())})
		if sc.GetState() == rdzvv1.NodeState_NODE_STATE_BUSY {
			p.Busy = int(sc.GetGpus())
		}
	}
	var jobStates []string
	for _, j := range p.Jobs {
		jobStates = append(jobStates, jobState(j.GetState()))
	}
	p.JobStates = count(jobStates)
	h.render(w, "overview.html", p, nil)
}

type jobPage struct {
	Title       string
	Job         *rdzvv1.Job
	ETTR        string
	Generations []*rdzvv1.Event
	Events      []*rdzvv1.Event
	Timelines   []timeline
}

func (h *handler) job(w http.ResponseWriter, r *http.Request) {
	n, err := name(r, "job")
	if err != nil {
		h.fail(w, err)
		return
	}
	ctx, cancel := h.call(r)
	defer cancel()
	resp, err := h.src.GetJob(ctx, &rdzvv1.GetJobRequest{Name: n})
	if err != nil {
		h.fail(w, err)
		return
	}
	evs, err := h.src.ListEvents(ctx, &rdzvv1.ListEventsRequest{Job: n, Limit: jobEvents, PageSize: jobEvents})
	if err != nil {
		h.fail(w, err)
		return
	}
	j := resp.GetJob()
	p := jobPage{Title: "job " + n, Job: j, ETTR: ettr(j)}
	created := j.GetCreatedAt().AsTime()
	for _, ev := range evs.GetEvents() {
		if ev.GetTime().AsTime().Before(created) {
			continue // an earlier run of the name
		}
		p.Events = append(p.Events, ev)
		if ev.GetKind() == "rendezvous_committed" || ev.GetKind() == "attempt_failed" || ev.GetKind() == "recovered" {
			p.Generations = append(p.Generations, ev)
		}
	}
	slices.Reverse(p.Events) // newest first
	for i, inc := range j.GetIncidents() {
		p.Timelines = append(p.Timelines, newTimeline(i+1, inc))
	}
	h.render(w, "job.html", p, nil)
}

// ettr is the effective training time ratio: training over training and
// recovery.
func ettr(j *rdzvv1.Job) string {
	train, recover := j.GetTrainingTime().AsDuration(), j.GetRecoveryTime().AsDuration()
	if train+recover <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%% (training %s, recovering %s)", 100*float64(train)/float64(train+recover),
		train.Round(time.Second), recover.Round(time.Millisecond))
}

type nodePage struct {
	Title string
	Node  *rdzvv1.Node
	Jobs  []*rdzvv1.Job
}

func (h *handler) node(w http.ResponseWriter, r *http.Request) {
	n, err := name(r, "node")
	if err != nil {
		h.fail(w, err)
		return
	}
	ctx, cancel := h.call(r)
	defer cancel()
	// The node and the one after it in name order: ListNodes has no lookup
	// by name, and pages start after a token only.
	var node *rdzvv1.Node
	var token string
	for node == nil {
		resp, err := h.src.ListNodes(ctx, &rdzvv1.ListNodesRequest{PageToken: token})
		if err != nil {
			h.fail(w, err)
			return
		}
		for _, x := range resp.GetNodes() {
			if x.GetInfo().GetName() == n {
				node = x
			}
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if node == nil {
		h.fail(w, fmt.Errorf("%w: node %s is not registered", errBadName, n))
		return
	}
	jobs, err := h.src.ListJobs(ctx, &rdzvv1.ListJobsRequest{PageSize: maxJobsShown})
	if err != nil {
		h.fail(w, err)
		return
	}
	p := nodePage{Title: "node " + n, Node: node}
	for _, j := range slices.Backward(jobs.GetJobs()) {
		for _, a := range j.GetAssignments() {
			if a.GetNode() == n {
				p.Jobs = append(p.Jobs, j)
				break
			}
		}
	}
	h.render(w, "node.html", p, nil)
}

// events is a Server-Sent Events stream of the cluster's events (a job's
// with ?job=NAME), fed by WatchEvents: pages listen to it and reload what
// they show. A browser reconnecting sends Last-Event-ID, the cursor of
// the last event it got, and goes on from there.
func (h *handler) events(w http.ResponseWriter, r *http.Request) {
	req := &rdzvv1.WatchEventsRequest{Job: r.URL.Query().Get("job"), Cursor: r.Header.Get("Last-Event-ID")}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	err := h.src.WatchEvents(r.Context(), req, func(m *rdzvv1.WatchEventsResponse) error {
		if m.GetEvent() == nil {
			return nil // caught up: nothing for a page to reload
		}
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m.GetEvent())
		if err != nil {
			return err
		}
		// protojson output holds no newline, so it is one data line.
		if _, err := fmt.Fprintf(w, "id: %s\nevent: rdzv\ndata: %s\n\n", m.GetCursor(), b); err != nil {
			return err
		}
		flusher.Flush()
		return nil
	})
	if err != nil && r.Context().Err() == nil {
		// The browser reconnects by itself (after its retry delay) from
		// Last-Event-ID; say why in the stream for whoever looks.
		h.log.Info("event stream ended", zap.Error(err))
		msg, _ := json.Marshal(err.Error())
		_, _ = fmt.Fprintf(w, "retry: 2000\nevent: ended\ndata: %s\n\n", msg)
		flusher.Flush()
	}
}
