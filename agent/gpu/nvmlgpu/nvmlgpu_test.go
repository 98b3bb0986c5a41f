package nvmlgpu_test

import (
	"context"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rdzv/rdzv/agent/gpu/nvmlgpu"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const unavailableMsg = "nvml not available, reporting zero gpus"

// newDGX returns the go-nvml DGX A100 mock with BusId filled in: the mock
// keeps each device's bus id in a field but leaves PciInfo.BusId empty.
func newDGX() *dgxa100.Server {
	srv := dgxa100.New()
	for _, d := range srv.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var info nvml.PciInfo
			for i, c := range []byte(dev.PciBusID) {
				info.BusId[i] = int8(c)
			}
			return info, nvml.SUCCESS
		}
	}
	return srv
}

func TestDiscoverDGXA100(t *testing.T) {
	srv := newDGX()
	shutdowns := 0
	srv.ShutdownFunc = func() nvml.Return {
		shutdowns++
		return nvml.SUCCESS
	}

	gpus, err := nvmlgpu.New(srv, zaptest.NewLogger(t)).Discover(context.Background())
	require.NoError(t, err)
	require.Len(t, gpus, 8)
	require.Equal(t, 1, shutdowns)

	uuids := map[string]bool{}
	busIDs := map[string]bool{}
	for i, g := range gpus {
		require.Equal(t, uint32(i), g.Index)
		require.NotEmpty(t, g.UUID)
		uuids[g.UUID] = true
		require.Equal(t, "Mock NVIDIA A100-SXM4-40GB", g.Name)
		require.Equal(t, uint64(40<<30), g.MemoryBytes)
		require.Equal(t, srv.Devices[i].(*dgxa100.Device).PciBusID, g.PCIBusID)
		busIDs[g.PCIBusID] = true
	}
	require.Len(t, uuids, 8, "uuids must be unique")
	require.Len(t, busIDs, 8, "pci bus ids must be unique")
}

func TestDiscoverLibraryMissing(t *testing.T) {
	// No ShutdownFunc: the mock panics if Discover shuts down a library that
	// never loaded.
	lib := &mock.Interface{
		InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND },
	}
	core, logs := observer.New(zapcore.DebugLevel)
	d := nvmlgpu.New(lib, zap.New(core))

	for range 2 {
		gpus, err := d.Discover(context.Background())
		require.NoError(t, err)
		require.Empty(t, gpus)
	}
	require.Equal(t, 1, logs.FilterMessage(unavailableMsg).Len())
}

func TestDiscoverErrors(t *testing.T) {
	tests := []struct {
		name         string
		breakIt      func(srv *dgxa100.Server)
		wantRet      nvml.Return
		wantInMsg    string
		wantShutdown int
	}{
		{
			name: "init",
			breakIt: func(srv *dgxa100.Server) {
				srv.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
			},
			wantRet:   nvml.ERROR_DRIVER_NOT_LOADED,
			wantInMsg: "nvmlInit",
		},
		{
			name: "count",
			breakIt: func(srv *dgxa100.Server) {
				srv.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			},
			wantRet:      nvml.ERROR_UNKNOWN,
			wantInMsg:    "nvmlDeviceGetCount",
			wantShutdown: 1,
		},
		{
			name: "handle",
			breakIt: func(srv *dgxa100.Server) {
				srv.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
			},
			wantRet:      nvml.ERROR_GPU_IS_LOST,
			wantInMsg:    "nvmlDeviceGetHandleByIndex for gpu 0",
			wantShutdown: 1,
		},
		{
			name: "uuid",
			breakIt: func(srv *dgxa100.Server) {
				srv.Devices[2].(*dgxa100.Device).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
			},
			wantRet:      nvml.ERROR_GPU_IS_LOST,
			wantInMsg:    "nvmlDeviceGetUUID for gpu 2",
			wantShutdown: 1,
		},
		{
			name: "name",
			breakIt: func(srv *dgxa100.Server) {
				srv.Devices[5].(*dgxa100.Device).GetNameFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
			},
			wantRet:      nvml.ERROR_UNKNOWN,
			wantInMsg:    "nvmlDeviceGetName for gpu 5",
			wantShutdown: 1,
		},
		{
			name: "memory",
			breakIt: func(srv *dgxa100.Server) {
				srv.Devices[3].(*dgxa100.Device).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
					return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
				}
			},
			wantRet:      nvml.ERROR_GPU_IS_LOST,
			wantInMsg:    "nvmlDeviceGetMemoryInfo for gpu 3",
			wantShutdown: 1,
		},
		{
			name: "pci",
			breakIt: func(srv *dgxa100.Server) {
				srv.Devices[7].(*dgxa100.Device).GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
					return nvml.PciInfo{}, nvml.ERROR_NO_PERMISSION
				}
			},
			wantRet:      nvml.ERROR_NO_PERMISSION,
			wantInMsg:    "nvmlDeviceGetPciInfo for gpu 7",
			wantShutdown: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newDGX()
			shutdowns := 0
			srv.ShutdownFunc = func() nvml.Return {
				shutdowns++
				return nvml.SUCCESS
			}
			tt.breakIt(srv)

			gpus, err := nvmlgpu.New(srv, zaptest.NewLogger(t)).Discover(context.Background())
			require.ErrorIs(t, err, tt.wantRet)
			require.ErrorContains(t, err, tt.wantInMsg)
			require.Nil(t, gpus)
			require.Equal(t, tt.wantShutdown, shutdowns)
		})
	}
}

func TestDiscoverShutdownFailureKeepsGPUs(t *testing.T) {
	srv := newDGX()
	srv.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN }
	core, logs := observer.New(zapcore.DebugLevel)

	gpus, err := nvmlgpu.New(srv, zap.New(core)).Discover(context.Background())
	require.NoError(t, err)
	require.Len(t, gpus, 8)
	require.Equal(t, 1, logs.FilterMessage("nvml shutdown failed").Len())
}

func TestDiscoverCanceled(t *testing.T) {
	// No InitFunc: the mock panics if Discover touches NVML after cancellation.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	gpus, err := nvmlgpu.New(&mock.Interface{}, zaptest.NewLogger(t)).Discover(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.Nil(t, gpus)
}

// TestDiscoverSystem loads the real libnvidia-ml. On hosts without it (CI,
// laptops) it proves that a missing library yields no GPUs rather than a
// panic; on GPU hosts it checks that what NVML reports is well formed.
func TestDiscoverSystem(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)

	gpus, err := nvmlgpu.NewSystem(zap.New(core)).Discover(context.Background())
	require.NoError(t, err)

	if logs.FilterMessage(unavailableMsg).Len() == 1 {
		t.Log("libnvidia-ml not found on this host")
		require.Empty(t, gpus)
		return
	}
	for _, g := range gpus {
		require.NotEmpty(t, g.UUID)
		require.NotEmpty(t, g.Name)
		require.NotEmpty(t, g.PCIBusID)
	}
}
