package agent

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/rdzv/rdzv/agent/gpu"
	"github.com/rdzv/rdzv/agent/netif"
	"github.com/rdzv/rdzv/health"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// replayFaults is a GPU health watcher that reports fixed faults once.
type replayFaults []health.Fault

func (r replayFaults) Watch(ctx context.Context, report func(health.Fault)) error {
	for _, f := range r {
		report(f)
	}
	<-ctx.Done()
	return nil
}

// firstForwarded runs an agent whose GPUs report faults, in order, and
// returns the first fault that reached the controller.
func firstForwarded(t *testing.T, gpuHealth health.GPUConfig, faults replayFaults) *rdzvv1.GPUFault {
	t.Helper()
	fc := &fakeController{
		registered: &rdzvv1.Registered{HeartbeatIntervalMs: 25, HeartbeatTimeoutMs: 5000},
		got:        make(chan *rdzvv1.ConnectRequest, 4096),
	}
	cfg := DefaultConfig()
	cfg.Controller, cfg.NodeName, cfg.StateDir, cfg.GossipPort = fc.serve(t), "node-a", t.TempDir(), -1
	cfg.MemoryCheckpointDir = t.TempDir() // not the node's /dev/shm, which an agent's start sweeps
	cfg.HTTP.Listen = ""
	cfg.Insecure = true // the fake controller serves plaintext
	cfg.GPUHealth = gpuHealth
	a, err := New(cfg, zaptest.NewLogger(t), gpu.Fake{}, fakeNet{ifaces: []netif.Interface{lo}}, ExecSpawner{}, WithGPUHealth(faults))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	deadline := time.After(10 * time.Second)
	for {
		select {
		case m := <-fc.got:
			if f := m.GetGpuFault(); f != nil {
				return f
			}
		case <-deadline:
			require.FailNow(t, "no gpu fault reached the controller")
		}
	}
}

// Critical GPU faults reach the controller; application errors stay local.
func TestAgentForwardsCriticalGPUFaults(t *testing.T) {
	at := time.Now()
	got := firstForwarded(t, health.GPUConfig{}, replayFaults{
		{GPUIndex: 1, UUID: "GPU-1", Kind: health.XID, Code: 13, At: at}, // the program's fault
		{GPUIndex: 3, UUID: "GPU-3", Kind: health.XID, Code: 79, At: at},
	})
	require.Equal(t, uint32(3), got.GetGpuIndex(), "the application error (XID 13) is not forwarded")
	require.Equal(t, "xid", got.GetKind())
	require.Equal(t, uint64(79), got.GetCode())
	require.Equal(t, "GPU 3 (GPU-3): XID 79", got.GetMessage())
	require.True(t, got.GetAt().AsTime().Equal(at))
}

// The operator's gpu_health decides: an ignored XID stays local, a
// critical one is forwarded even if the program's fault by default.
func TestAgentForwardsGPUFaultsByPolicy(t *testing.T) {
	got := firstForwarded(t, health.GPUConfig{IgnoredXIDs: []health.XIDEntry{"79"}, CriticalXIDs: []health.XIDEntry{"43"}}, replayFaults{
		{GPUIndex: 3, Kind: health.XID, Code: 79, At: time.Now()},
		{GPUIndex: 1, Kind: health.XID, Code: 13, At: time.Now()},
		{GPUIndex: 2, Kind: health.XID, Code: 43, At: time.Now()},
	})
	require.Equal(t, uint64(43), got.GetCode(), "79 ignored by the operator, 13 by default, 43 made critical")
}
