package nvmlgpu

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/rdzv/rdzv/health"
)

// States reads what the node health checks judge of every GPU (health's
// GPUPolicy). A query a GPU does not support (retired pages on Ampere, row
// remapping before it, ECC on consumer boards) leaves its field zero:
// unknown counts as healthy, the check is about faults the driver sees.
// Without libnvidia-ml there are no GPUs, so no states.
func (d *Discoverer) States(ctx context.Context) ([]health.GPUState, error) {
	switch ret := d.lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, nil
	default:
		return nil, fmt.Errorf("calling nvmlInit for gpu health checks: %w", ret)
	}
	defer d.lib.Shutdown()
	count, ret := d.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("calling nvmlDeviceGetCount: %w", ret)
	}
	states := make([]health.GPUState, 0, count)
	for i := range count {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("reading gpu %d: %w", i, err)
		}
		s, err := state(d.lib, i)
		if err != nil {
			return nil, err
		}
		states = append(states, s)
	}
	return states, nil
}

func state(lib nvml.Interface, i int) (health.GPUState, error) {
	dev, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return health.GPUState{}, fmt.Errorf("calling nvmlDeviceGetHandleByIndex for gpu %d: %w", i, ret)
	}
	s := health.GPUState{Index: uint32(i)}
	if s.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return health.GPUState{}, fmt.Errorf("calling nvmlDeviceGetUUID for gpu %d: %w", i, ret)
	}
	if n, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
		s.UncorrectableECC = n
	}
	if pending, ret := dev.GetRetiredPagesPendingStatus(); ret == nvml.SUCCESS {
		s.RetiredPagesPending = pending == nvml.FEATURE_ENABLED
	}
	if _, _, pending, failed, ret := dev.GetRemappedRows(); ret == nvml.SUCCESS {
		s.RowRemapPending, s.RowRemapFailed = pending, failed
	}
	if t, ret := dev.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		s.TemperatureC = t
	}
	if r, ret := dev.GetCurrentClocksEventReasons(); ret == nvml.SUCCESS {
		s.ThrottleReasons = r
	}
	if mode, ret := dev.GetPersistenceMode(); ret == nvml.SUCCESS {
		s.PersistenceDisabled = mode == nvml.FEATURE_DISABLED
	}
	return s, nil
}
