package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
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

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// -update rewrites testdata/**/*.golden and docs/cli from what rdzvctl
// prints now (make docs).
var update = flag.Bool("update", false, "rewrite golden files and docs/cli")

// goldenNow is the fixed time of golden output: ages are counted to it.
var goldenNow = time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)

func TestMain(m *testing.M) {
	// Times print in local time; goldens must not depend on the machine's.
	time.Local = time.UTC
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
	path := filepath.Join("testdata", name)
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
