package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func TestNodeRowShowsFailingHealthChecks(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	since := timestamppb.New(now.Add(-90 * time.Second))
	n := &rdzvv1.Node{
		Info:  &rdzvv1.NodeInfo{Name: "gpu-01"},
		State: rdzvv1.NodeState_NODE_STATE_READY,
		HealthChecks: []*rdzvv1.HealthCheckResult{
			{Name: "gpu", Ok: true, Since: since},
			{Name: "disk-check", Message: "exit status 1: first\nsecond", Since: since},
		},
	}
	var out bytes.Buffer
	nodeRow(&out, n, view{now: now})
	require.Contains(t, out.String(), "READY,UNHEALTHY (disk-check failing for 1m30s")
	require.Contains(t, out.String(), ": exit status 1: first | second)")
	require.NotContains(t, out.String(), "gpu failing")
	require.Equal(t, 1, bytes.Count(out.Bytes(), []byte("\n")), "one line per node")
}

func TestPrintJobShowsSpares(t *testing.T) {
	j := &rdzvv1.Job{Spec: &rdzvv1.JobSpec{Name: "big", NodesMin: 2, NodesMax: 2, NodesSpares: 2}, Spares: []string{"gpu-07"}}
	var out bytes.Buffer
	printJob(&out, j, view{})
	require.Contains(t, out.String(), "Spares:      1 of 2 held gpu-07\n")
	j.Spec.NodesSpares = 0
	out.Reset()
	printJob(&out, j, view{})
	require.NotContains(t, out.String(), "Spares:")
}
