package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func stateWord(s rdzvv1.JobState) string { return strings.TrimPrefix(s.String(), "JOB_STATE_") }

func table(out io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(out, 0, 4, 2, ' ', 0) }

func age(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return time.Since(ts.AsTime()).Round(time.Second).String()
}

const jobsHeader = "NAME\tSTATE\tGENERATION\tRESTARTS\tNODES\tMASTER\tAGE\tREASON"

func jobRow(w io.Writer, j *rdzvv1.Job) {
	master := "-"
	if j.GetMasterAddr() != "" {
		master = fmt.Sprintf("%s:%d", j.GetMasterAddr(), j.GetMasterPort())
	}
	fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", j.GetSpec().GetName(), stateWord(j.GetState()), j.GetGeneration(),
		j.GetRestarts(), len(j.GetAssignments()), master, age(j.GetCreatedAt()), j.GetReason())
}

func printJob(out io.Writer, j *rdzvv1.Job) {
	spec := j.GetSpec()
	fmt.Fprintf(out, "Job:         %s\n", spec.GetName())
	fmt.Fprintf(out, "State:       %s\n", stateWord(j.GetState()))
	fmt.Fprintf(out, "Reason:      %s\n", j.GetReason())
	fmt.Fprintf(out, "Generation:  %d\n", j.GetGeneration())
	fmt.Fprintf(out, "Nodes:       %d-%d, %d GPUs and %d processes per node\n", spec.GetNodesMin(), spec.GetNodesMax(), spec.GetGpusPerNode(), spec.GetProcsPerNode())
	if j.GetMasterAddr() != "" {
		fmt.Fprintf(out, "Master:      %s:%d\n", j.GetMasterAddr(), j.GetMasterPort())
	}
	fmt.Fprintf(out, "Command:     %s\n", strings.Join(spec.GetCommand(), " "))
	fmt.Fprintf(out, "Restarts:    %d of %d\n", j.GetRestarts(), spec.GetRestartMaxRestarts())
	fmt.Fprintf(out, "Checkpoint:  %s\n", checkpointLine(j.GetLatestCheckpoint()))
	fmt.Fprintf(out, "Progress:    %s\n", progressLine(j))
	fmt.Fprintf(out, "Training:    %s\n", trainingLine(j))
	fmt.Fprintf(out, "Created:     %s\n", when(j.GetCreatedAt()))
	fmt.Fprintf(out, "Started:     %s\n", when(j.GetStartedAt()))
	fmt.Fprintf(out, "Finished:    %s\n", when(j.GetFinishedAt()))
	incidentTable(out, j.GetIncidents())
	if len(j.GetAssignments()) == 0 {
		return
	}
	fmt.Fprintln(out)
	w := table(out)
	fmt.Fprintln(w, "RANK\tNODE\tADDRESS\tINTERFACE\tGPUS\tWORKERS\tEXIT\tMESSAGE")
	for _, a := range j.GetAssignments() {
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

func terminal(s rdzvv1.WorkerState) bool {
	return s == rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED || s == rdzvv1.WorkerState_WORKER_STATE_FAILED || s == rdzvv1.WorkerState_WORKER_STATE_STOPPED
}

func when(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return fmt.Sprintf("%s (%s ago)", ts.AsTime().Local().Format(time.RFC3339), age(ts))
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

const nodesHeader = "NAME\tSTATE\tJOB\tGPUS\tINTERFACE\tADDRESS\tHEARTBEAT\tLABELS"

func nodeRow(w io.Writer, n *rdzvv1.Node) {
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
	if n.GetCordoned() {
		state += ",CORDONED (" + n.GetCordonReason() + ")"
	}
	if hold := n.GetRestartHoldUntil(); hold != nil {
		state += ",AGENT RESTARTING (held until " + hold.AsTime().Local().Format(time.TimeOnly) + ")"
	}
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s ago\t%s\n", info.GetName(), state,
		job, gpus, info.GetNcclInterface(), info.GetAddress(), age(n.GetLastHeartbeat()), labels(info.GetLabels()))
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

const eventsHeader = "TIME\tKIND\tNODE\tGENERATION\tMESSAGE"

func eventRow(w io.Writer, e *rdzvv1.Event) {
	node := e.GetNode()
	if node == "" {
		node = "-"
	}
	fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", e.GetTime().AsTime().Local().Format("2006-01-02 15:04:05.000"), e.GetKind(), node, e.GetGeneration(), e.GetMessage())
}

// listOut prints a list as its pages arrive, never holding all of it: a
// table whose header comes once (each page aligned on its own), or with
// -o json one object {"<field>": [...]}.
type listOut struct {
	out    io.Writer
	json   bool
	field  string
	header string
	// n counts the items printed; limit, when positive, ends the list
	// there.
	n, limit int
	// started is set once the header (or the object's opening) is out.
	started bool
	// widths are the table's column widths so far.
	widths []int
}

// align writes tab-separated lines padded to the widest cell of each column
// so far (as tabwriter does, with two spaces between columns): later
// pages line up with earlier ones unless a cell is wider than any before.
func (l *listOut) align(text string) error {
	var rows [][]string
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if line == "" {
			continue
		}
		cells := strings.Split(line, "\t")
		for i, cell := range cells[:len(cells)-1] {
			if i == len(l.widths) {
				l.widths = append(l.widths, 0)
			}
			l.widths[i] = max(l.widths[i], utf8.RuneCountInString(cell))
		}
		rows = append(rows, cells)
	}
	var b strings.Builder
	for _, cells := range rows {
		for i, cell := range cells[:len(cells)-1] {
			b.WriteString(cell + strings.Repeat(" ", l.widths[i]-utf8.RuneCountInString(cell)+2))
		}
		b.WriteString(strings.TrimRight(cells[len(cells)-1], " ") + "\n")
	}
	_, err := io.WriteString(l.out, b.String())
	return err
}

// full reports whether the list has printed all it may.
func (l *listOut) full() bool { return l.limit > 0 && l.n >= l.limit }

// printPage prints the items of one page, up to the list's limit.
func printPage[M proto.Message](l *listOut, items []M, row func(io.Writer, M)) error {
	if l.limit > 0 {
		items = items[:min(len(items), l.limit-l.n)]
	}
	if !l.json {
		var b strings.Builder
		if !l.started {
			fmt.Fprintln(&b, l.header)
			l.started = true
		}
		for _, m := range items {
			row(&b, m)
		}
		l.n += len(items)
		return l.align(b.String())
	}
	for _, m := range items {
		b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true, Indent: "  "}.Marshal(m)
		if err != nil {
			return err
		}
		sep := ",\n"
		if !l.started {
			sep = fmt.Sprintf("{\n  %q: [\n", l.field)
			l.started = true
		}
		if _, err := fmt.Fprint(l.out, sep+"    "+strings.ReplaceAll(string(b), "\n", "\n    ")); err != nil {
			return err
		}
		l.n++
	}
	return nil
}

// end closes a JSON list (a table needs nothing more).
func (l *listOut) end() error {
	var err error
	switch {
	case !l.json:
	case !l.started:
		_, err = fmt.Fprintf(l.out, "{\n  %q: []\n}\n", l.field)
	default:
		_, err = fmt.Fprint(l.out, "\n  ]\n}\n")
	}
	return err
}

func checkpointLine(cp *rdzvv1.Checkpoint) string {
	if cp == nil {
		return "none yet"
	}
	return fmt.Sprintf("step %d at %s (generation %d, %s, %s ago)", cp.GetStep(), cp.GetPath(), cp.GetGeneration(), cp.GetSource(), age(cp.GetReportedAt()))
}

func progressLine(j *rdzvv1.Job) string {
	timeout := j.GetSpec().GetHealthProgressTimeout().AsDuration()
	switch {
	case j.GetProgressAt() == nil && timeout > 0:
		return "no steps reported yet (hang detection starts with the first report)"
	case j.GetProgressAt() == nil:
		return "no steps reported; hang detection off"
	case timeout == 0:
		return fmt.Sprintf("step %d, %s ago; hang detection off (health.progress_timeout)", j.GetStep(), age(j.GetProgressAt()))
	}
	return fmt.Sprintf("step %d, %s ago; hang after %s without progress", j.GetStep(), age(j.GetProgressAt()), timeout)
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

func printRevocations(out io.Writer, rs []*rdzvv1.Revocation) {
	w := table(out)
	fmt.Fprintln(w, "SERIAL\tIDENTITY\tISSUED BEFORE\tREVOKED\tBY\tUNTIL\tREASON")
	for _, r := range rs {
		serial, id, before := r.GetSerial(), r.GetIdentity(), "-"
		if serial == "" {
			serial, before = "*", when(r.GetIssuedBefore())
		} else {
			id = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", serial, id, before, when(r.GetRevokedAt()), r.GetRevokedBy(), when(r.GetNotAfter()), r.GetReason())
	}
	_ = w.Flush()
}
