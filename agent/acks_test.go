package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/rdzv/rdzv/agent/gpu"
	"github.com/rdzv/rdzv/agent/netif"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func TestAcks(t *testing.T) {
	var a Acks
	base := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for seq := uint64(1); seq <= 100; seq++ {
		a.Sending(seq, base.Add(time.Duration(seq)*time.Second))
	}
	at, ok := a.Acked(100)
	require.True(t, ok)
	require.Equal(t, base.Add(100*time.Second), at, "the latest heartbeat")
	at, ok = a.Acked(100 - ackWindow + 1)
	require.True(t, ok)
	require.Equal(t, base.Add((100-ackWindow+1)*time.Second), at, "the oldest one remembered")
	for _, seq := range []uint64{0, 100 - ackWindow, 101, 1 << 40} {
		_, ok := a.Acked(seq)
		require.False(t, ok, "seq %d: never sent, or forgotten", seq)
	}
}

// A controller that keeps sending (stop orders, log requests) but
// acknowledges none of our heartbeats has not heard us: with no peers to
// vouch, the agent fences its workers after the heartbeat timeout, as the
// controller counts on.
func TestSelfFenceCountsOnlyAcknowledgements(t *testing.T) {
	torchrun := filepath.Join(t.TempDir(), "torchrun")
	require.NoError(t, os.WriteFile(torchrun, []byte(fakeTorchrun), 0o755))
	fc := &fakeController{
		registered: &rdzvv1.Registered{HeartbeatIntervalMs: 25, HeartbeatTimeoutMs: 300, VouchedTimeoutMs: 300},
		assignment: &rdzvv1.Assignment{
			Spec: &rdzvv1.JobSpec{
				Name: "train", NodesMin: 1, NodesMax: 1, ProcsPerNode: 1,
				Command: []string{"train.py", "hang"}, Workdir: t.TempDir(), LauncherTorchrun: torchrun,
			},
			Generation: 1, Nnodes: 1, ProcsPerNode: 1, MasterAddr: "127.0.0.1", MasterPort: 29500,
		},
		got:     make(chan *rdzvv1.ConnectRequest, 4096),
		chatter: &rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_LogCancel{LogCancel: &rdzvv1.LogCancel{RequestId: "none"}}},
	}
	cfg := DefaultConfig()
	cfg.Controller, cfg.NodeName, cfg.StateDir, cfg.GossipPort = fc.serve(t), "node-a", t.TempDir(), -1
	cfg.MemoryCheckpointDir = t.TempDir() // not the node's /dev/shm, which an agent's start sweeps
	cfg.HTTP.Listen = ""
	runAsSelf(&cfg)
	cfg.Insecure = true // the fake controller serves plaintext
	a, err := New(cfg, zaptest.NewLogger(t), gpu.Fake{}, fakeNet{ifaces: []netif.Interface{lo}}, ExecSpawner{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	timeout := time.After(waitTimeout)
	running := false
	for {
		select {
		case m := <-fc.got:
			w := m.GetWorkerStatus()
			if w.GetState() == rdzvv1.WorkerState_WORKER_STATE_RUNNING {
				running = true
			}
			if w != nil && w.GetState() != rdzvv1.WorkerState_WORKER_STATE_RUNNING {
				require.True(t, running, "the workers ran first")
				require.Contains(t, w.GetMessage(), "self-fenced")
				return
			}
		case <-timeout:
			require.FailNow(t, "the agent never fenced its workers")
		}
	}
}

// TestReconnect: the backoff doubles from minBackoff up to maxBackoff,
// each wait jittered within its upper half, and starts over after a
// stable session. test/sim's agents come back on the same schedule.
func TestReconnect(t *testing.T) {
	tests := []struct {
		name   string
		lasted []time.Duration // sessions, one per call
		bases  []time.Duration // the backoff each wait is drawn from
		fresh  []bool
	}{
		{
			name:   "doubling to the cap",
			lasted: []time.Duration{0, time.Second, 0, 0, 0, 0, 0},
			bases:  []time.Duration{minBackoff, 2 * minBackoff, 4 * minBackoff, 8 * minBackoff, maxBackoff, maxBackoff, maxBackoff},
			fresh:  []bool{true, false, false, false, false, false, false},
		},
		{
			name:   "a stable session starts over",
			lasted: []time.Duration{0, 0, 0, stableSession + time.Second, 0},
			bases:  []time.Duration{minBackoff, 2 * minBackoff, 4 * minBackoff, minBackoff, 2 * minBackoff},
			fresh:  []bool{true, false, false, true, false},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r Reconnect
			for i, lasted := range tt.lasted {
				wait, fresh := r.After(lasted)
				require.Equal(t, tt.fresh[i], fresh, "call %d", i)
				require.GreaterOrEqual(t, wait, tt.bases[i]/2, "call %d", i)
				require.LessOrEqual(t, wait, tt.bases[i], "call %d", i)
			}
		})
	}
}
