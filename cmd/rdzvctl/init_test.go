package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// init writes what each launcher's line meant, as a job.yaml that
// validates (goldens under testdata/init).
func TestInitGolden(t *testing.T) {
	for _, tt := range []struct{ name, line string }{
		{"torchrun", "torchrun --nnodes=2 --nproc_per_node=4 --master_addr=10.0.0.1 --master_port=29500 --node_rank=0 train.py --epochs 3"},
		{"torchrun-elastic", "NCCL_DEBUG=INFO torchrun --nnodes 1:4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint head:29400 -m pkg.train"},
		{"deepspeed", "deepspeed --num_gpus 8 --num_nodes 2 --hostfile hosts train.py --deepspeed ds.json"},
		{"accelerate", "accelerate launch --num_machines 2 --num_processes 16 --mixed_precision bf16 train.py"},
		{"python", "python -u finetune.py --lr 1e-4"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, out, err := runGolden("init", "--from", tt.line)
			require.NoError(t, err)
			require.Equal(t, 0, code)
			golden(t, filepath.Join("init", tt.name+".golden"), out)
			spec, err := jobspec.Parse([]byte(out))
			require.NoError(t, err)
			require.NoError(t, spec.Validate())
		})
	}
}

func TestInitFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "job.yaml")
	code, _, err := runGolden("init", "--from", "torchrun --nproc_per_node 2 train.py", "--file", file, "--name", "mine")
	require.NoError(t, err)
	require.Equal(t, 0, code)
	spec, err := jobspec.LoadFile(file)
	require.NoError(t, err)
	require.Equal(t, "mine", spec.Name)
	require.Equal(t, 2, spec.ProcsPerNode)

	before, err := os.ReadFile(file)
	require.NoError(t, err)
	code, _, err = runGolden("init", "--from", "python other.py", "--file", file)
	require.Error(t, err)
	require.Equal(t, 1, code)
	after, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, before, after, "an existing file is kept")

	code, _, err = runGolden("init", "--from", "python x.py", "--name", "Bad_Name")
	require.Error(t, err)
	require.Equal(t, 2, code)
}

// warningServer answers StartJob with a warning.
type warningServer struct {
	rdzvv1.UnimplementedJobServiceServer
}

func (warningServer) StartJob(_ context.Context, req *rdzvv1.StartJobRequest) (*rdzvv1.StartJobResponse, error) {
	return &rdzvv1.StartJobResponse{Job: &rdzvv1.Job{Spec: req.GetSpec()}, Placement: &rdzvv1.PlacementPreview{Reason: "would wait"},
		Warnings: []string{"gpus_per_node is not set"}}, nil
}

// The controller's warnings go to stderr, after start and validate alike.
func TestStartPrintsWarnings(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	rdzvv1.RegisterJobServiceServer(srv, warningServer{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	job := writeJob(t, "name: cpu\nnodes: 1\ncommand: [train.py]\n")
	for _, args := range [][]string{{"start", job}, {"start", job, "--dry-run"}, {"validate", job}} {
		var out, errOut bytes.Buffer
		c := &command{globals: defaultGlobals(), out: &out, errOut: &errOut, clock: clockwork.NewFakeClockAt(goldenNow)}
		code, err := runWith(context.Background(), c, append([]string{"--insecure", "--controller", lis.Addr().String()}, args...))
		require.NoError(t, err, args)
		require.Equal(t, 0, code)
		require.Equal(t, "warning: "+job+": gpus_per_node is not set\n", errOut.String(), args)
		require.NotContains(t, out.String(), "warning", args)
	}
}
