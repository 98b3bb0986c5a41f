package nvmlgpu_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/rdzv/rdzv/agent/gpu/nvmlgpu"
	"github.com/rdzv/rdzv/health"
)

// eventDGX is a DGX A100 whose event set replays the events that events
// builds from its devices, then times out.
func eventDGX(events func(devs [8]nvml.Device) []nvml.EventData) (*dgxa100.Server, *[]uint64) {
	srv := newDGX()
	registered := &[]uint64{}
	var mu sync.Mutex
	for _, d := range srv.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, nvml.SUCCESS
		}
		dev.RegisterEventsFunc = func(mask uint64, _ nvml.EventSet) nvml.Return {
			mu.Lock()
			*registered = append(*registered, mask)
			mu.Unlock()
			return nvml.SUCCESS
		}
	}
	queue := events(srv.Devices)
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
				mu.Lock()
				defer mu.Unlock()
				if len(queue) == 0 {
					time.Sleep(10 * time.Millisecond)
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
				e := queue[0]
				queue = queue[1:]
				return e, nvml.SUCCESS
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	return srv, registered
}

func TestWatchReportsFaults(t *testing.T) {
	srv, registered := eventDGX(func(devs [8]nvml.Device) []nvml.EventData {
		return []nvml.EventData{
			{Device: devs[3], EventType: nvml.EventTypeXidCriticalError, EventData: 79},
			{Device: devs[5], EventType: nvml.EventTypeDoubleBitEccError, EventData: 1},
			{Device: devs[5], EventType: nvml.EventTypeSingleBitEccError, EventData: 7}, // corrected: not a fault
		}
	})
	uuid3, _ := srv.Devices[3].GetUUID()

	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var faults []health.Fault
	done := make(chan error, 1)
	go func() {
		done <- nvmlgpu.New(srv, zaptest.NewLogger(t)).Watch(ctx, func(f health.Fault) {
			mu.Lock()
			faults = append(faults, f)
			mu.Unlock()
		})
	}()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(faults) == 2 }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(50 * time.Millisecond) // the corrected ECC event must not follow
	cancel()
	require.NoError(t, <-done)
	require.Len(t, faults, 2)
	require.Len(t, *registered, 8, "every GPU is watched")
	require.Equal(t, uint64(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError), (*registered)[0], "only fault events, not corrected ECC")
	require.Equal(t, health.Fault{GPUIndex: 3, UUID: uuid3, Kind: health.XID, Code: 79, At: faults[0].At}, faults[0])
	require.Equal(t, health.ECCUncorrectable, faults[1].Kind)
	require.Equal(t, uint32(5), faults[1].GPUIndex)
	policy, err := health.GPUConfig{}.Policy("gpu_health")
	require.NoError(t, err)
	require.True(t, policy.Critical(faults[0]))
}

func TestWatchWithoutLibrary(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	require.NoError(t, nvmlgpu.New(lib, zaptest.NewLogger(t)).Watch(context.Background(), func(health.Fault) {
		t.Error("no faults without a library")
	}))
}
