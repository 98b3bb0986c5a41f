package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func stateWord(s rdzvv1.JobState) string { return strings.TrimPrefix(s.String(), "JOB_STATE_") }

func table(out io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(out, 0, 4, 2, ' ', 0) }

// view is what rows print with: -o wide, the time ages are counted to,
// and --all (every worker of a large job, not a summary).
type view struct {
	wide bool
	now  time.Time
	all  bool
}

// summaryAbove is how many nodes, or workers of a job, a table lists one by
// one; more are summarized unless --all is given. Thousands of rows scroll
// the one that matters out of sight.
const summaryAbove = 100

// maxNoted is how many rows a summary lists of those that need a look.
const maxNoted = 20

func (v view) age(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return v.now.Sub(ts.AsTime()).Round(time.Second).String()
}

// jobs is how lists of jobs print; the reason comes last, as the widest.
var jobs = listing[*rdzvv1.Job]{
	field:      "jobs",
	header:     "NAME\tSTATE\tGENERATION\tRESTARTS\tNODES\tMASTER\tAGE",
	wideHeader: "GPUS/NODE\tPROCS/NODE\tSELECTOR\tSTEP",
	last:       "REASON",
	row: func(w io.Writer, j *rdzvv1.Job, v view) {
		master := "-"
		if j.GetMasterAddr() != "" {
			master = fmt.Sprintf("%s:%d", j.GetMasterAddr(), j.GetMasterPort())
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\t%s", j.GetSpec().GetName(), stateWord(j.GetState()), j.GetGeneration(),
			j.GetRestarts(), len(j.GetAssignments()), master, v.age(j.GetCreatedAt()))
		if v.wide {
			spec := j.GetSpec()
			fmt.Fprintf(w, "\t%d\t%d\t%s\t%d", spec.GetGpusPerNode(), spec.GetProcsPerNode(), labels(spec.GetSelector()), j.GetStep())
		}
		fmt.Fprintf(w, "\t%s\n", j.GetReason())
	},
	name: func(j *rdzvv1.Job) string { return j.GetSpec().GetName() },
}

func printJob(out io.Writer, j *rdzvv1.Job, v view) {
	spec := j.GetSpec()
	fmt.Fprintf(out, "Job:         %s\n", spec.GetName())
	fmt.Fprintf(out, "State:       %s\n", stateWord(j.GetState()))
	fmt.Fprintf(out, "Reason:      %s\n", j.GetReason())
	fmt.Fprintf(out, "Generation:  %d\n", j.GetGeneration())
	fmt.Fprintf(out, "Nodes:       %d-%d, %d GPUs and %d processes per node\n", spec.GetNodesMin(), spec.GetNodesMax(), spec.GetGpusPerNode(), spec.GetProcsPerNode())
	if n := spec.GetNodesSpares(); n > 0 {
		fmt.Fprintf(out, "Spares:      %d of %d held %s\n", len(j.GetSpares()), n, strings.Join(j.GetSpares(), ","))
	}
	if j.GetMasterAddr() != "" {
		fmt.Fprintf(out, "Master:      %s:%d\n", j.GetMasterAddr(), j.GetMasterPort())
	}
	fmt.Fprintf(out, "Command:     %s\n", strings.Join(spec.GetCommand(), " "))
	fmt.Fprintf(out, "Restarts:    %d of %d\n", j.GetRestarts(), spec.GetRestartMaxRestarts())
	fmt.Fprintf(out, "Checkpoint:  %s\n", checkpointLine(j.GetLatestCheckpoint(), v))
	fmt.Fprintf(out, "Progress:    %s\n", progressLine(j, v))
	if m := j.GetMetrics(); len(m) > 0 {
		fmt.Fprintf(out, "Metrics:     %s\n", metricsLine(m))
	}
	fmt.Fprintf(out, "Training:    %s\n", trainingLine(j))
	fmt.Fprintf(out, "Created:     %s\n", v.when(j.GetCreatedAt()))
	fmt.Fprintf(out, "Started:     %s\n", v.when(j.GetStartedAt()))
	fmt.Fprintf(out, "Finished:    %s\n", v.when(j.GetFinishedAt()))
	incidentTable(out, j.GetIncidents())
	rows := j.GetAssignments()
	if len(rows) == 0 {
		return
	}
	if len(rows) > summaryAbove && !v.all {
		rows = workerSummary(out, rows)
		if len(rows) == 0 {
			return
		}
	}
	fmt.Fprintln(out)
	w := table(out)
	fmt.Fprintln(w, "RANK\tNODE\tADDRESS\tINTERFACE\tGPUS\tWORKERS\tEXIT\tMESSAGE")
	for _, a := range rows {
		exit := "-"
		if terminal(a.GetState()) {
			exit = fmt.Sprint(a.GetExitCode())
			if a.GetSignal() != "" {
				exit = a.GetSignal()
			}
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.GetNodeRank(), a.GetNode(), a.GetAddress(), a.GetNcclInterface(),
			uints(a.GetGpuIndices()), strings.TrimPrefix(a.GetState().String(), "WORKER_STATE_"), exit, a.GetMessage())
	}
	_ = w.Flush()
}

// workerSummary prints how many of a large job's nodes are in each worker
// state, and returns the rows worth a look: the first maxNoted (by rank)
// whose workers are neither running nor succeeded.
func workerSummary(out io.Writer, rows []*rdzvv1.NodeAssignment) []*rdzvv1.NodeAssignment {
	counts := map[rdzvv1.WorkerState]int{}
	var noted []*rdzvv1.NodeAssignment
	for _, a := range rows {
		counts[a.GetState()]++
		if s := a.GetState(); s != rdzvv1.WorkerState_WORKER_STATE_RUNNING && s != rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED {
			noted = append(noted, a)
		}
	}
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%d %s", counts[s], strings.TrimPrefix(s.String(), "WORKER_STATE_")))
	}
	fmt.Fprintf(out, "Workers:     %s (%d nodes; --all lists every one)\n", strings.Join(parts, ", "), len(rows))
	if len(noted) > maxNoted {
		fmt.Fprintf(out, "Not running: the first %d of %d by rank\n", maxNoted, len(noted))
		noted = noted[:maxNoted]
	}
	return noted
}

func terminal(s rdzvv1.WorkerState) bool {
	return s == rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED || s == rdzvv1.WorkerState_WORKER_STATE_FAILED || s == rdzvv1.WorkerState_WORKER_STATE_STOPPED
}

func (v view) when(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return fmt.Sprintf("%s (%s ago)", ts.AsTime().Local().Format(time.RFC3339), v.age(ts))
}

func uints(v []uint32) string {
	if len(v) == 0 {
		return "-"
	}
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

// nodes is how lists of nodes print.
var nodes = listing[*rdzvv1.Node]{
	field:      "nodes",
	header:     "NAME\tSTATE\tJOB\tGPUS\tINTERFACE\tADDRESS\tHEARTBEAT",
	wideHeader: "GPU MODELS\tAGENT\tREGISTERED\tINTERFACE REASON",
	last:       "LABELS",
	row:        nodeRow,
	name:       func(n *rdzvv1.Node) string { return n.GetInfo().GetName() },
}

func nodeRow(w io.Writer, n *rdzvv1.Node, v view) {
	info := n.GetInfo()
	gpus := fmt.Sprint(len(info.GetGpus()))
	if info.GetFakeGpus() {
		gpus += " (fake)"
	}
	job := "-"
	if n.GetJob() != "" {
		job = fmt.Sprintf("%s/%d", n.GetJob(), n.GetGeneration())
	}
	state := strings.TrimPrefix(n.GetState().String(), "NODE_STATE_")
	switch {
	case n.GetState() == rdzvv1.NodeState_NODE_STATE_DRAINED:
		state += " (" + n.GetCordonReason() + ")"
	case n.GetDraining():
		state += ",DRAINING (" + n.GetCordonReason() + ")"
	case n.GetCordoned():
		state += ",CORDONED (" + n.GetCordonReason() + ")"
	}
	for _, h := range n.GetHealthChecks() {
		if !h.GetOk() {
			state += fmt.Sprintf(",UNHEALTHY (%s failing for %s: %s)", h.GetName(), v.age(h.GetSince()), strings.ReplaceAll(h.GetMessage(), "\n", " | "))
		}
	}
	if hold := n.GetRestartHoldUntil(); hold != nil {
		state += ",AGENT RESTARTING (held until " + hold.AsTime().Local().Format(time.TimeOnly) + ")"
	}
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s ago", info.GetName(), state,
		job, gpus, info.GetNcclInterface(), info.GetAddress(), v.age(n.GetLastHeartbeat()))
	if v.wide {
		models := map[string]int{}
		var order []string
		for _, g := range info.GetGpus() {
			if models[g.GetName()] == 0 {
				order = append(order, g.GetName())
			}
			models[g.GetName()]++
		}
		var parts []string
		for _, m := range order {
			parts = append(parts, fmt.Sprintf("%dx %s", models[m], m))
		}
		fmt.Fprintf(w, "\t%s\t%s\t%s\t%s", orDash(strings.Join(parts, ",")), orDash(info.GetAgentVersion()), v.when(n.GetRegisteredAt()), orDash(info.GetNcclInterfaceReason()))
	}
	fmt.Fprintf(w, "\t%s\n", labels(info.GetLabels()))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func labels(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(m))
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// events is how lists of events print; wide adds the job (for cluster
// events) and the detection latency of failures.
var events = listing[*rdzvv1.Event]{
	field:      "events",
	header:     "TIME\tKIND\tNODE\tGENERATION",
	wideHeader: "JOB\tDETECTED AFTER",
	last:       "MESSAGE",
	row: func(w io.Writer, e *rdzvv1.Event, v view) {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d", e.GetTime().AsTime().Local().Format("2006-01-02 15:04:05.000"), e.GetKind(), orDash(e.GetNode()), e.GetGeneration())
		if v.wide {
			latency := "-"
			if d := e.GetDetectionLatency(); d != nil {
				latency = d.AsDuration().String()
			}
			fmt.Fprintf(w, "\t%s\t%s", orDash(e.GetJob()), latency)
		}
		fmt.Fprintf(w, "\t%s\n", e.GetMessage())
	},
	name: func(e *rdzvv1.Event) string { return e.GetKind() },
}

func checkpointLine(cp *rdzvv1.Checkpoint, v view) string {
	if cp == nil {
		return "none yet"
	}
	return fmt.Sprintf("step %d at %s (generation %d, %s, %s ago)", cp.GetStep(), cp.GetPath(), cp.GetGeneration(), cp.GetSource(), v.age(cp.GetReportedAt()))
}

func progressLine(j *rdzvv1.Job, v view) string {
	s := "no steps reported yet"
	if j.GetProgressAt() != nil {
		s = fmt.Sprintf("step %d, %s ago", j.GetStep(), v.age(j.GetProgressAt()))
	}
	phase := j.GetPhase()
	switch phase {
	case rdzvv1.TrainingPhase_TRAINING_PHASE_UNSPECIFIED:
		if j.GetState() == rdzvv1.JobState_JOB_STATE_RUNNING && j.GetProgressAt() == nil {
			return s + "; hang detection starts with the first step report"
		}
		return s
	case rdzvv1.TrainingPhase_TRAINING_PHASE_STARTUP:
		s += "; starting"
	case rdzvv1.TrainingPhase_TRAINING_PHASE_SAVING:
		s += "; saving a checkpoint"
	case rdzvv1.TrainingPhase_TRAINING_PHASE_DONE:
		return s + "; past the last step (never a hang: the workers' exit decides)"
	}
	if t := j.GetHangTimeout(); t != nil {
		return s + fmt.Sprintf("; hang after %s without progress", t.AsDuration())
	}
	return s + "; hang detection off"
}

// metricsLine is the latest metrics, sorted by name.
func metricsLine(m map[string]float64) string {
	parts := make([]string, 0, len(m))
	for _, name := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%.6g", name, m[name]))
	}
	return strings.Join(parts, " ")
}

// trainingLine is the effective training time ratio: time spent training
// over training plus recovering.
func trainingLine(j *rdzvv1.Job) string {
	train, recover := j.GetTrainingTime().AsDuration(), j.GetRecoveryTime().AsDuration()
	if train+recover == 0 {
		return "-"
	}
	return fmt.Sprintf("%s training, %s recovering (%.1f%% effective)", train.Round(time.Second), recover.Round(time.Second),
		100*train.Seconds()/(train+recover).Seconds())
}

// revocations is how the deny-list prints.
var revocations = listing[*rdzvv1.Revocation]{
	field:      "revocations",
	header:     "SERIAL\tIDENTITY\tISSUED BEFORE\tREVOKED\tBY\tUNTIL",
	wideHeader: "",
	last:       "REASON",
	row: func(w io.Writer, r *rdzvv1.Revocation, v view) {
		serial, id, before := r.GetSerial(), r.GetIdentity(), "-"
		if serial == "" {
			serial, before = "*", v.when(r.GetIssuedBefore())
		} else {
			id = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", serial, id, before, v.when(r.GetRevokedAt()), r.GetRevokedBy(), v.when(r.GetNotAfter()), r.GetReason())
	},
	name: func(r *rdzvv1.Revocation) string {
		if r.GetSerial() != "" {
			return r.GetSerial()
		}
		return r.GetIdentity()
	},
}
