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

// Critical GPU faults reach the controller; application errors stay local.
func TestAgentForwardsCriticalGPUFaults(t *testing.T) {
	fc := &fakeController{
		registered: &rdzvv1.Registered{HeartbeatIntervalMs: 25, HeartbeatTimeoutMs: 5000},
		got:        make(chan *rdzvv1.ConnectRequest, 4096),
	}
	cfg := DefaultConfig()
	cfg.Controller, cfg.NodeName, cfg.StateDir, cfg.GossipPort = fc.serve(t), "node-a", t.TempDir(), -1
	cfg.Insecure = true // the fake controller serves plaintext
	at := time.Now()
	faults := replayFaults{
		{GPUIndex: 1, UUID: "GPU-1", Kind: health.XID, Code: 13, At: at}, // the program's fault
		{GPUIndex: 3, UUID: "GPU-3", Kind: health.XID, Code: 79, At: at},
	}
	a, err := New(cfg, zaptest.NewLogger(t), gpu.Fake{}, fakeNet{ifaces: []netif.Interface{lo}}, ExecSpawner{}, WithGPUHealth(faults))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	var got []*rdzvv1.GPUFault
	deadline := time.After(10 * time.Second)
	for len(got) == 0 {
		select {
		case m := <-fc.got:
			if f := m.GetGpuFault(); f != nil {
				got = append(got, f)
			}
		case <-deadline:
			require.FailNow(t, "no gpu fault reached the controller")
		}
	}
	require.Equal(t, uint32(3), got[0].GetGpuIndex(), "the application error (XID 13) is not forwarded")
	require.Equal(t, "xid", got[0].GetKind())
	require.Equal(t, uint64(79), got[0].GetCode())
	require.Equal(t, "GPU 3 (GPU-3): XID 79", got[0].GetMessage())
	require.True(t, got[0].GetAt().AsTime().Equal(at))
}
