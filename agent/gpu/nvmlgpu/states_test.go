package nvmlgpu_test

import (
	"context"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/rdzv/rdzv/agent/gpu/nvmlgpu"
	"github.com/rdzv/rdzv/health"
)

// healthyDGX is the DGX A100 mock with the health queries answered as a
// healthy, persistent, cool GPU would; the mock panics on queries nobody
// mocked.
func healthyDGX() *dgxa100.Server {
	srv := newDGX()
	for _, d := range srv.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) { return 0, nvml.SUCCESS }
		dev.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		dev.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.SUCCESS }
		dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 41, nvml.SUCCESS }
		dev.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return nvml.ClocksEventReasonGpuIdle, nvml.SUCCESS }
		dev.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_ENABLED, nvml.SUCCESS }
	}
	return srv
}

func TestStatesDGXA100(t *testing.T) {
	srv := healthyDGX()
	shutdowns := 0
	srv.ShutdownFunc = func() nvml.Return { shutdowns++; return nvml.SUCCESS }
	bad := srv.Devices[3].(*dgxa100.Device)
	bad.GetTotalEccErrorsFunc = func(typ nvml.MemoryErrorType, counter nvml.EccCounterType) (uint64, nvml.Return) {
		if typ == nvml.MEMORY_ERROR_TYPE_UNCORRECTED && counter == nvml.VOLATILE_ECC {
			return 2, nvml.SUCCESS
		}
		return 0, nvml.SUCCESS
	}
	bad.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 1, true, true, nvml.SUCCESS }
	bad.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
		return nvml.ClocksThrottleReasonHwThermalSlowdown, nvml.SUCCESS
	}
	bad.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.SUCCESS }
	// A board without any of these queries: unknown is not a fault.
	old := srv.Devices[5].(*dgxa100.Device)
	old.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
		return 9, nvml.ERROR_NOT_SUPPORTED
	}
	old.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, true, true, nvml.ERROR_NOT_SUPPORTED }
	old.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	old.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return 0xff, nvml.ERROR_NOT_SUPPORTED }
	old.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED }

	states, err := nvmlgpu.New(srv, zaptest.NewLogger(t)).States(context.Background())
	require.NoError(t, err)
	require.Len(t, states, 8)
	require.Equal(t, 1, shutdowns)
	require.Equal(t, health.GPUState{
		Index: 3, UUID: bad.UUID, UncorrectableECC: 2, RowRemapPending: true, RowRemapFailed: true,
		TemperatureC: 41, ThrottleReasons: health.ThrottleHWThermal, PersistenceDisabled: true,
	}, states[3])
	require.Equal(t, health.GPUState{Index: 5, UUID: old.UUID}, states[5])

	critical, soft := health.GPUPolicy{ExpectedCount: 8, MaxTemperatureC: 85, RequirePersistence: true}.Judge(states)
	require.Len(t, critical, 3, "%v", critical)
	require.Len(t, soft, 2, "%v", soft)
	for _, p := range append(critical, soft...) {
		require.Contains(t, p, "GPU 3 ")
	}
}

func TestStatesErrors(t *testing.T) {
	t.Run("library missing", func(t *testing.T) {
		lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
		states, err := nvmlgpu.New(lib, zaptest.NewLogger(t)).States(context.Background())
		require.NoError(t, err)
		require.Empty(t, states)
	})
	t.Run("lost gpu", func(t *testing.T) {
		srv := healthyDGX()
		srv.ShutdownFunc = func() nvml.Return { return nvml.SUCCESS }
		srv.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
		_, err := nvmlgpu.New(srv, zaptest.NewLogger(t)).States(context.Background())
		require.ErrorIs(t, err, nvml.ERROR_GPU_IS_LOST)
	})
}
