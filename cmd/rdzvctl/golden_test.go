package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// -update rewrites testdata/**/*.golden and docs/cli from what rdzvctl
// prints now (make docs).
var update = flag.Bool("update", false, "rewrite golden files and docs/cli")

// goldenNow is the fixed time of golden output: ages are counted to it.
var goldenNow = time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)

// testdata is the absolute path of testdata/, which tests that change
// directory still find.
var testdata string

func TestMain(m *testing.M) {
	// Times print in local time; goldens must not depend on the machine's.
	time.Local = time.UTC
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	testdata = filepath.Join(wd, "testdata")
	// No operator's config file or context reaches a test; tests of
	// contexts set their own.
	if err := errors.Join(os.Setenv("RDZV_CONFIG", filepath.Join(os.TempDir(), "rdzvctl-test-no-config.yaml")), os.Unsetenv("RDZV_CONTEXT")); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// stableEnv makes defaults that come from the environment (shown in help)
// the same on every machine.
func stableEnv(t *testing.T) {
	t.Setenv("RDZV_CONTROLLER", "")
	t.Setenv("RDZV_TLS_DIR", "")
	t.Setenv("HOME", "/home/operator")
}

// golden compares got with testdata/name, or writes it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join(testdata, name)
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "no golden file: run go test ./cmd/rdzvctl -update")
	require.Equal(t, string(want), got, "%s is stale: run go test ./cmd/rdzvctl -update and review the diff", path)
}

// runGolden runs rdzvctl at goldenNow and returns its exit code, stdout
// and error.
func runGolden(args ...string) (int, string, error) {
	var out, errOut bytes.Buffer
	c := &command{globals: defaultGlobals(), out: &out, errOut: &errOut, clock: clockwork.NewFakeClockAt(goldenNow)}
	code, err := runWith(context.Background(), c, args)
	return code, out.String(), err
}

// commandPaths lists every command of the tree, "rdzvctl" first.
func commandPaths(cmd *cobra.Command) [][]string {
	paths := [][]string{strings.Fields(cmd.CommandPath())[1:]}
	for _, sub := range cmd.Commands() {
		paths = append(paths, commandPaths(sub)...)
	}
	return paths
}

// Every command answers --help on stdout with exit 0.
func TestHelpGolden(t *testing.T) {
	stableEnv(t)
	c := &command{globals: defaultGlobals()}
	for _, path := range commandPaths(c.root()) {
		name := strings.Join(append([]string{"rdzvctl"}, path...), "_")
		t.Run(name, func(t *testing.T) {
			code, out, err := runGolden(append(path, "--help")...)
			require.NoError(t, err)
			require.Equal(t, 0, code)
			golden(t, filepath.Join("help", name+".golden"), out)
		})
	}
	// `help CMD` and `CMD -h` say the same.
	_, viaHelp, err := runGolden("help", "nodes", "drain")
	require.NoError(t, err)
	_, viaFlag, err := runGolden("nodes", "drain", "-h")
	require.NoError(t, err)
	require.Equal(t, viaFlag, viaHelp)
}

func ts(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(goldenNow.Add(-d)) }

// fixtures fills a pagedServer with a job, nodes and events whose every
// column has a value.
func fixtures(s *pagedServer) {
	s.jobs = []*rdzvv1.Job{{
		Spec: &rdzvv1.JobSpec{Name: "train", NodesMin: 2, NodesMax: 3, GpusPerNode: 8, ProcsPerNode: 8, Command: []string{"python3", "train.py"},
			Selector: map[string]string{"pool": "a100"}, RestartMaxRestarts: 3, HealthProgressTimeout: durationpb.New(10 * time.Minute)},
		State: rdzvv1.JobState_JOB_STATE_RUNNING, Reason: "running on 2 nodes", Generation: 2, MasterAddr: "10.0.0.1", MasterPort: 29500,
		Assignments: []*rdzvv1.NodeAssignment{
			{Node: "gpu-01", NodeRank: 0, Address: "10.0.0.1", NcclInterface: "ib0", GpuIndices: []uint32{0, 1, 2, 3, 4, 5, 6, 7}, State: rdzvv1.WorkerState_WORKER_STATE_RUNNING},
			{Node: "gpu-02", NodeRank: 1, Address: "10.0.0.2", NcclInterface: "ib0", GpuIndices: []uint32{0, 1, 2, 3, 4, 5, 6, 7}, State: rdzvv1.WorkerState_WORKER_STATE_RUNNING},
		},
		CreatedAt: ts(2 * time.Hour), StartedAt: ts(30 * time.Minute), Restarts: 1, Step: 1200, ProgressAt: ts(5 * time.Second),
		Phase: rdzvv1.TrainingPhase_TRAINING_PHASE_STEPS, HangTimeout: durationpb.New(10 * time.Minute),
		Metrics:          map[string]float64{"loss": 2.3125, "train/lr": 3e-4, "grad_norm": math.NaN()},
		LatestCheckpoint: &rdzvv1.Checkpoint{Step: 1000, Path: "/ckpt/step-1000", Generation: 2, Source: "helper", ReportedAt: ts(3 * time.Minute)},
		TrainingTime:     durationpb.New(110 * time.Minute), RecoveryTime: durationpb.New(2 * time.Minute),
	}, {
		Spec:  &rdzvv1.JobSpec{Name: "eval", NodesMin: 1, NodesMax: 1, GpusPerNode: 1, ProcsPerNode: 1},
		State: rdzvv1.JobState_JOB_STATE_PENDING, Reason: "waiting for nodes: 0 of 3 nodes eligible, need 1 (2 busy or not ready, 1 cordoned or draining)",
		CreatedAt: ts(time.Minute),
	}}
	gpus := func(n int) []*rdzvv1.GPU {
		var out []*rdzvv1.GPU
		for i := range n {
			out = append(out, &rdzvv1.GPU{Index: uint32(i), Name: "NVIDIA A100-SXM4-80GB"})
		}
		return out
	}
	node := func(name string, state rdzvv1.NodeState, job string) *rdzvv1.Node {
		return &rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: name, Labels: map[string]string{"pool": "a100"}, Gpus: gpus(8), NcclInterface: "ib0",
			Address: "10.0.0." + name[len(name)-1:], AgentVersion: "v1.2.0", NcclInterfaceReason: "fastest up interface"},
			State: state, Job: job, Generation: 2, RegisteredAt: ts(48 * time.Hour), LastHeartbeat: ts(time.Second)}
	}
	drained := node("gpu-03", rdzvv1.NodeState_NODE_STATE_DRAINED, "")
	drained.Cordoned, drained.CordonReason, drained.Draining = true, "failing DIMM", true
	s.nodes = []*rdzvv1.Node{node("gpu-01", rdzvv1.NodeState_NODE_STATE_BUSY, "train"), node("gpu-02", rdzvv1.NodeState_NODE_STATE_BUSY, "train"), drained}
	s.events = []*rdzvv1.Event{
		{Time: ts(2 * time.Hour), Job: "train", Kind: "job_submitted", Message: "job submitted: 2-3 nodes, 8 GPUs and 8 processes per node"},
		{Time: ts(40 * time.Minute), Job: "train", Node: "gpu-04", Generation: 1, Kind: "attempt_failed", Message: "generation 1 failed: node gpu-04 lost",
			DetectionLatency: durationpb.New(1500 * time.Millisecond)},
		{Time: ts(30 * time.Minute), Job: "train", Generation: 2, Kind: "rendezvous_committed", Message: "generation 2 on 2 nodes"},
	}
}

func (s *pagedServer) GetJob(_ context.Context, req *rdzvv1.GetJobRequest) (*rdzvv1.GetJobResponse, error) {
	for _, j := range s.jobs {
		if j.GetSpec().GetName() == req.GetName() {
			return &rdzvv1.GetJobResponse{Job: j}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "job %s not found", req.GetName())
}

// Every output format of every command that lists or shows.
func TestOutputGolden(t *testing.T) {
	s, addr := startPagedServer(t)
	fixtures(s)
	formats := map[string]string{
		"table": "table", "wide": "wide", "json": "json", "yaml": "yaml", "name": "name",
		"jsonpath": "jsonpath={.%s[*].%s}",
	}
	commands := []struct {
		name string
		args []string
		// field and leaf make the JSONPath: {.field[*].leaf}.
		field, leaf string
	}{
		{"list", []string{"list"}, "jobs", "spec.name"},
		{"nodes", []string{"nodes"}, "nodes", "state"},
		{"events", []string{"events", "train"}, "events", "kind"},
		{"status", []string{"status", "train"}, "", ""},
	}
	for _, cmd := range commands {
		for fname, format := range formats {
			t.Run(cmd.name+"-"+fname, func(t *testing.T) {
				if fname == "jsonpath" {
					format = fmt.Sprintf(format, cmd.field, cmd.leaf)
					if cmd.field == "" {
						format = "jsonpath={.assignments[*].node}"
					}
				}
				code, out, err := runGolden(append([]string{"--insecure", "--controller", addr, "-o", format}, cmd.args...)...)
				require.NoError(t, err)
				require.Equal(t, 0, code)
				golden(t, filepath.Join("output", cmd.name+"-"+fname+".golden"), out)
			})
		}
	}
	// RFC 9535 spelling, and a filter.
	_, out, err := runGolden("--insecure", "--controller", addr, "nodes", "-o", `jsonpath=$.nodes[?@.draining==true].info.name`)
	require.NoError(t, err)
	require.Equal(t, "gpu-03\n", out)
}

// Each command says which -o formats it prints (the rest it refuses):
// testdata/output/formats.golden lists them.
func TestOutputFormatsGolden(t *testing.T) {
	stableEnv(t)
	c := &command{globals: defaultGlobals()}
	var b strings.Builder
	var walk func(cmd *cobra.Command)
	walk = func(cmd *cobra.Command) {
		if cmd.Runnable() && !cmd.Hidden {
			fmt.Fprintf(&b, "%s: %s\n", cmd.CommandPath(), strings.Join(outputsOf(cmd), ", "))
			for _, kind := range allOutputs {
				value := kind
				if kind == "jsonpath" {
					value = "jsonpath={.x}"
				}
				err := checkOutput(cmd, value, clockwork.NewFakeClockAt(goldenNow))
				require.Equal(t, slices.Contains(outputsOf(cmd), kind), err == nil, "%s -o %s: %v", cmd.CommandPath(), value, err)
			}
		}
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(c.root())
	golden(t, filepath.Join("output", "formats.golden"), b.String())
}

// A large cluster's nodes and a large job's workers show as summaries.
func TestSummaryGolden(t *testing.T) {
	s, addr := startPagedServer(t)
	fixtures(s)
	lost := proto.CloneOf(s.nodes[0])
	lost.Info.Name, lost.State, lost.Job, lost.Generation = "gpu-07", rdzvv1.NodeState_NODE_STATE_LOST, "", 0
	lost.LastHeartbeat = ts(10 * time.Minute)
	s.summary = &rdzvv1.SummarizeNodesResponse{
		Nodes: 10000, Gpus: 80000,
		States: []*rdzvv1.NodeStateCount{
			{State: rdzvv1.NodeState_NODE_STATE_READY, Nodes: 14, Gpus: 112},
			{State: rdzvv1.NodeState_NODE_STATE_BUSY, Nodes: 9984, Gpus: 79872},
			{State: rdzvv1.NodeState_NODE_STATE_LOST, Nodes: 1, Gpus: 8},
			{State: rdzvv1.NodeState_NODE_STATE_DRAINED, Nodes: 1, Gpus: 8},
		},
		Cordoned: 1, Draining: 1,
		Jobs:      []*rdzvv1.JobNodeCount{{Job: "eval", Nodes: 16}, {Job: "train", Nodes: 9968}},
		Attention: []*rdzvv1.Node{s.nodes[2], lost}, AttentionTotal: 2,
	}
	big := proto.CloneOf(s.jobs[0])
	big.Spec.Name, big.Spec.NodesMin, big.Spec.NodesMax = "big", 150, 150
	big.Assignments = nil
	for i := range 150 {
		a := &rdzvv1.NodeAssignment{Node: fmt.Sprintf("gpu-%03d", i), NodeRank: uint32(i), Address: fmt.Sprintf("10.0.1.%d", i), NcclInterface: "ib0",
			GpuIndices: []uint32{0, 1, 2, 3, 4, 5, 6, 7}, State: rdzvv1.WorkerState_WORKER_STATE_RUNNING}
		switch i {
		case 40:
			a.State, a.ExitCode, a.Message = rdzvv1.WorkerState_WORKER_STATE_FAILED, 1, "CUDA error: an illegal memory access was encountered"
		case 41, 42:
			a.State = rdzvv1.WorkerState_WORKER_STATE_ASSIGNED
		}
		big.Assignments = append(big.Assignments, a)
	}
	s.jobs = append(s.jobs, big)
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"nodes-summary-table", []string{"nodes"}},
		{"nodes-summary-wide", []string{"nodes", "-o", "wide"}},
		{"status-summary-table", []string{"status", "big"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, out, err := runGolden(append([]string{"--insecure", "--controller", addr}, tt.args...)...)
			require.NoError(t, err)
			require.Equal(t, 0, code)
			golden(t, filepath.Join("output", tt.name+".golden"), out)
		})
	}
	_, out, err := runGolden("--insecure", "--controller", addr, "status", "big", "--all")
	require.NoError(t, err)
	for i := range 150 {
		require.Contains(t, out, fmt.Sprintf("gpu-%03d", i), "--all lists every node's workers")
	}
}

// The messages of command-line mistakes and of refusals name what was
// wrong and what is wanted.
func TestErrorsGolden(t *testing.T) {
	stableEnv(t)
	_, addr := startPagedServer(t)
	badJob := writeJob(t, "name: x\nnodes: {min: 3, max: 1}\ncommand: [train.py]\n")
	tests := []struct {
		name     string
		args     []string
		wantCode int
	}{
		{"unknown-command", []string{"frobnicate"}, 2},
		{"unknown-flag", []string{"nodes", "--bogus"}, 2},
		{"unknown-subcommand", []string{"nodes", "evict", "gpu-01"}, 2},
		{"mistyped-command", []string{"stauts"}, 2},
		{"mistyped-subcommand", []string{"nodes", "drian", "gpu-01"}, 2},
		{"mistyped-pki-command", []string{"pki", "isue", "agent", "gpu-01"}, 2},
		{"bad-output", []string{"list", "-o", "xml"}, 2},
		{"bad-jsonpath", []string{"list", "-o", "jsonpath={.jobs[}"}, 2},
		{"bad-state", []string{"list", "--state", "runing"}, 2},
		{"bad-node-state", []string{"nodes", "--state", "idle"}, 2},
		{"bad-selector", []string{"nodes", "--selector", "pool"}, 2},
		{"bad-since", []string{"logs", "train", "--since", "yesterday"}, 2},
		{"start-without-file", []string{"start"}, 2},
		{"start-wait-and-dry-run", []string{"start", badJob, "--wait", "--dry-run"}, 2},
		{"logs-two-jobs", []string{"logs", "a", "b"}, 2},
		{"drain-without-node", []string{"nodes", "drain"}, 2},
		{"init-not-a-launcher", []string{"init", "--from", "bash run.sh"}, 2},
		{"init-without-from", []string{"init"}, 2},
		{"text-only-output", []string{"logs", "train", "-o", "json"}, 2},
		{"version-output-name", []string{"version", "--client", "-o", "name"}, 2},
		{"start-wait-output-json", []string{"start", badJob, "--wait", "-o", "json"}, 2},
		{"pki-show-output-yaml", []string{"pki", "show", "ca.crt", "-o", "yaml"}, 2},
		{"status-not-found", []string{"--insecure", "--controller", addr, "status", "nosuchjob"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, err := runGolden(tt.args...)
			require.Equal(t, tt.wantCode, code, "err: %v", err)
			require.Error(t, err)
			golden(t, filepath.Join("errors", tt.name+".golden"), err.Error()+"\n")
		})
	}
}

// runGoldenIO runs rdzvctl at goldenNow with stdin (nil: a terminal) and
// returns the whole exchange as golden text: exit code, stdout, stderr and
// the error main prints.
func runGoldenIO(stdin io.Reader, args ...string) string {
	var out, errOut bytes.Buffer
	c := &command{globals: defaultGlobals(), out: &out, errOut: &errOut, in: stdin, clock: clockwork.NewFakeClockAt(goldenNow)}
	code, err := runWith(context.Background(), c, args)
	msg := ""
	if err != nil {
		msg = "rdzvctl: " + err.Error() + "\n"
	}
	return fmt.Sprintf("$ rdzvctl %s\nexit %d\n--- stdout\n%s--- stderr\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String(), msg)
}

// validate checks several files and stdin, each file's errors led by its
// name, and fails if any is invalid.
func TestValidateGolden(t *testing.T) {
	stableEnv(t)
	t.Chdir(t.TempDir())
	good := "name: train\nnodes: 2\ncommand: [train.py]\n"
	files := map[string]string{
		"good.yaml":    good,
		"typo.yaml":    "name: x\nnodez: 2\ncommand: [train.py]\n",
		"invalid.yaml": "name: x\nnodes: {min: 3, max: 1}\ncommand: [train.py]\n",
	}
	for name, body := range files {
		require.NoError(t, os.WriteFile(name, []byte(body), 0o644))
	}
	for _, tt := range []struct {
		name  string
		stdin io.Reader
		args  []string
	}{
		{"several", nil, []string{"validate", "--local", "good.yaml", "typo.yaml", "invalid.yaml", "missing.yaml"}},
		{"all-valid", nil, []string{"validate", "--local", "good.yaml", "good.yaml"}},
		{"stdin-piped", strings.NewReader(good), []string{"validate", "--local"}},
		{"stdin-dash", strings.NewReader(files["typo.yaml"]), []string{"validate", "--local", "good.yaml", "-"}},
		{"stdin-twice", strings.NewReader(good), []string{"validate", "--local", "-", "-"}},
		{"no-file-no-pipe", nil, []string{"validate", "--local"}},
		{"dash-from-terminal", nil, []string{"validate", "--local", "-"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			golden(t, filepath.Join("validate", tt.name+".golden"), runGoldenIO(tt.stdin, tt.args...))
		})
	}
}

// get job NAME -o yaml prints a job.yaml that validate and start take
// (export → edit → start); secret values stay withheld.
func TestGetJobGolden(t *testing.T) {
	stableEnv(t)
	s, addr := startPagedServer(t)
	fixtures(s)
	s.jobs = append(s.jobs, &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "secret", NodesMin: 1, NodesMax: 1, Command: []string{"train.py"},
		Env: map[string]string{"MODE": "fast"}, SecretEnv: map[string]string{"TOKEN": jobspec.Redacted}}, State: rdzvv1.JobState_JOB_STATE_SUCCEEDED})
	// A job as start submits it: every kind of field set.
	full, err := jobspec.Parse([]byte(`name: full
nodes: {min: 2, max: 4, spares: 1}
gpus_per_node: 8
command: [train.py, --lr, "3e-4"]
workdir: /shared/llama
env: {OMP_NUM_THREADS: "4"}
env_files: {HF_TOKEN: /etc/rdzv/hf-token}
selector: {pool: train}
checkpoint: {dir: /shared/ckpt}
rendezvous: {last_call: 5s, timeout: 2m}
launcher: {kind: torchrun, extra_args: [--redirects, "2"]}
restart: {max_restarts: 5, backoff: {initial: 2s, max: 20s}}
health: {progress_timeout: 2m, preflight: {min_bandwidth_mbps: 1000}}
`))
	require.NoError(t, err)
	require.NoError(t, full.Validate())
	s.jobs = append(s.jobs, &rdzvv1.Job{Spec: full.ToProto(), State: rdzvv1.JobState_JOB_STATE_RUNNING})
	flags := []string{"--insecure", "--controller", addr}
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"table", []string{"get", "job", "train"}},
		{"wide", []string{"get", "job", "train", "-o", "wide"}},
		{"name", []string{"get", "job", "train", "-o", "name"}},
		{"yaml", []string{"get", "job", "train", "-o", "yaml"}},
		{"json", []string{"get", "job", "train", "-o", "json"}},
		{"jsonpath", []string{"get", "job", "train", "-o", "jsonpath={.nodes.max}"}},
		{"secret-yaml", []string{"get", "job", "secret", "-o", "yaml"}},
		{"full-yaml", []string{"get", "job", "full", "-o", "yaml"}},
		{"not-found", []string{"get", "job", "nosuchjob", "-o", "yaml"}},
		{"no-kind", []string{"get"}},
		{"mistyped-kind", []string{"get", "jbo", "train"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			golden(t, filepath.Join("get", tt.name+".golden"), strings.ReplaceAll(runGoldenIO(nil, append(flags, tt.args...)...), addr, "ADDR"))
		})
	}
	// The export validates as it is, and after an edit.
	for _, job := range []string{"full", "secret"} {
		_, y, err := runGolden(append(flags, "get", "job", job, "-o", "yaml")...)
		require.NoError(t, err)
		edited := strings.Replace(y, "name: "+job+"\n", "name: "+job+"-2\n", 1)
		golden(t, filepath.Join("get", job+"-roundtrip.golden"), runGoldenIO(strings.NewReader(edited), "validate", "--local", "-"))
	}
}

// events --kind, --node and --since filter here, over as many events as
// the controller lists; --watch follows new ones, filtered the same.
func TestEventsFilterGolden(t *testing.T) {
	stableEnv(t)
	s, addr := startPagedServer(t)
	fixtures(s)
	s.events = append(s.events,
		&rdzvv1.Event{Time: ts(20 * time.Minute), Node: "gpu-04", Kind: "node_lost", Message: "node gpu-04 lost: no heartbeat for 10s"},
		&rdzvv1.Event{Time: ts(10 * time.Minute), Job: "train", Node: "gpu-01", Kind: "checkpoint_recorded", Message: "checkpoint step 1000"})
	s.live = []*rdzvv1.Event{
		{Time: ts(time.Minute), Job: "train", Node: "gpu-02", Generation: 2, Kind: "attempt_failed", Message: "generation 2 failed: worker on gpu-02 exited 1"},
		{Time: ts(time.Minute), Job: "train", Generation: 3, Kind: "rendezvous_committed", Message: "generation 3 on 2 nodes"},
	}
	flags := []string{"--insecure", "--controller", addr}
	for _, tt := range []struct {
		name string
		args []string
		// want is the request made of the controller.
		want proto.Message
	}{
		{"kind", []string{"events", "--kind", "attempt_failed,node_lost"}, &rdzvv1.ListEventsRequest{Limit: eventsMax}},
		{"node", []string{"events", "--node", "gpu-04", "-o", "wide"}, &rdzvv1.ListEventsRequest{Limit: eventsMax}},
		{"since-duration", []string{"events", "--since", "35m"}, &rdzvv1.ListEventsRequest{Limit: eventsMax}},
		{"since-time", []string{"events", "--since", "2026-03-04T11:45:00Z", "-o", "name"}, &rdzvv1.ListEventsRequest{Limit: eventsMax}},
		{"all-filters-limit", []string{"events", "--kind", "node_lost,checkpoint_recorded,attempt_failed", "--since", "1h", "--limit", "1"}, &rdzvv1.ListEventsRequest{Limit: eventsMax}},
		{"unfiltered-limit", []string{"events", "--limit", "2"}, &rdzvv1.ListEventsRequest{Limit: 2}},
		{"watch", []string{"events", "train", "--watch", "--limit", "2"}, &rdzvv1.WatchEventsRequest{Job: "train", Tail: 2}},
		{"watch-kind", []string{"events", "train", "-w", "--kind", "attempt_failed"}, &rdzvv1.WatchEventsRequest{Job: "train", Tail: eventsMax}},
		{"watch-json-node", []string{"events", "--follow", "--node", "gpu-02", "-o", "json"}, &rdzvv1.WatchEventsRequest{Tail: eventsMax}},
		{"watch-yaml", []string{"events", "--watch", "-o", "yaml"}, nil},
		{"bad-kind", []string{"events", "--kind", "Attempt Failed"}, nil},
		{"bad-since", []string{"events", "--since", "last week"}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			golden(t, filepath.Join("events", tt.name+".golden"), strings.ReplaceAll(runGoldenIO(nil, append(flags, tt.args...)...), addr, "ADDR"))
			reqs := s.requests()
			if tt.want == nil {
				require.Empty(t, reqs)
				return
			}
			require.NotEmpty(t, reqs)
			require.True(t, proto.Equal(tt.want, reqs[0]), "asked %v", reqs[0])
		})
	}
}
