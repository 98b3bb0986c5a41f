package controller

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/types/known/timestamppb"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func TestCheckpointPathOK(t *testing.T) {
	tests := []struct {
		name, dir, path string
		ok              bool
	}{
		{"step dir", "/ckpt", "/ckpt/step-10", true},
		{"nested", "/ckpt", "/ckpt/run/step-10", true},
		{"name starting with dots", "/ckpt", "/ckpt/..step-10", true},
		{"no dir configured", "", "/anywhere/step-10", true},
		{"the dir itself", "/ckpt", "/ckpt", false},
		{"parent", "/ckpt", "/", false},
		{"sibling", "/ckpt", "/ckpt2/step-10", false},
		{"traversal", "/ckpt", "/ckpt/../etc", false},
		{"relative", "/ckpt", "ckpt/step-10", false},
		{"unclean", "/ckpt", "/ckpt//step-10", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkpointPathOK(tt.dir, tt.path)
			if tt.ok {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
		})
	}
}

// A recovering job waits for its backoff and for its lost nodes to have
// fenced themselves; the scheduler must wake at the later of the two, not
// at its next periodic pass, or every recovery takes up to a pass longer.
func TestScheduleWakesWhenRecoveryMayStart(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name        string
		backoffEnds time.Time
		fencedBy    time.Time
		// peerRunning: a connected node's workers have not reported their
		// exit yet; that report, not a timer, wakes the scheduler.
		peerRunning bool
		want        time.Time
	}{
		{name: "fenced after the backoff", backoffEnds: now.Add(time.Second), fencedBy: now.Add(1500 * time.Millisecond), want: now.Add(1500 * time.Millisecond)},
		{name: "backoff after the fencing", backoffEnds: now.Add(2 * time.Second), fencedBy: now.Add(time.Second), want: now.Add(2 * time.Second)},
		{name: "a peer's workers still run", backoffEnds: now.Add(time.Second), fencedBy: now.Add(1500 * time.Millisecond), peerRunning: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Insecure = true
			c, err := New(cfg, zaptest.NewLogger(t), WithClock(clockwork.NewFakeClockAt(now)))
			require.NoError(t, err)
			lost := &rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: "node-b"}, State: rdzvv1.NodeState_NODE_STATE_LOST}
			ready := &rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: "node-a"}, State: rdzvv1.NodeState_NODE_STATE_READY}
			c.nodes["node-a"] = testNode(t, ready)
			c.nodes["node-b"] = testNode(t, lost)
			c.nodes["node-b"].fencedBy = tt.fencedBy
			peer := rdzvv1.WorkerState_WORKER_STATE_STOPPED
			if tt.peerRunning {
				peer = rdzvv1.WorkerState_WORKER_STATE_RUNNING
			}
			c.jobs["train"] = withMembers(&jobState{
				rec: &rdzvv1.Job{
					Spec:  &rdzvv1.JobSpec{Name: "train", NodesMin: 1, NodesMax: 2},
					State: rdzvv1.JobState_JOB_STATE_RECOVERING, Generation: 1, RestartNotBefore: timestamppb.New(tt.backoffEnds),
				}},
				&rdzvv1.Round{Generation: 1, Nodes: []*rdzvv1.NodeAssignment{{Node: "node-a"}, {Node: "node-b", NodeRank: 1}}},
				map[string]*rdzvv1.WorkerStatus{
					"node-a": {Job: "train", Generation: 1, State: peer},
					"node-b": {Job: "train", Generation: 1, State: rdzvv1.WorkerState_WORKER_STATE_FAILED},
				})
			require.Equal(t, tt.want, c.schedule(context.Background()))
		})
	}
}
