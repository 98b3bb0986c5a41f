package nvmlgpu

import (
	"context"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"

	"github.com/rdzv/rdzv/health"
)

// faultEvents are the NVML events that mean a GPU fault.
const faultEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError

// waitTimeoutMs bounds one NVML wait, and so how long Watch takes to notice
// that ctx ended.
const waitTimeoutMs = 1000

// Watch reports the GPU faults NVML raises until ctx ends. Without
// libnvidia-ml it returns at once: no GPUs, no faults. A GPU that does not
// support fault events is logged and skipped, not an error.
func (d *Discoverer) Watch(ctx context.Context, report func(health.Fault)) error {
	switch ret := d.lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil
	default:
		return fmt.Errorf("calling nvmlInit for gpu health: %w", ret)
	}
	defer d.lib.Shutdown()
	set, ret := d.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("calling nvmlEventSetCreate: %w", ret)
	}
	defer set.Free()
	count, ret := d.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("calling nvmlDeviceGetCount: %w", ret)
	}
	index := map[string]uint32{}
	for i := range count {
		dev, ret := d.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("calling nvmlDeviceGetHandleByIndex for gpu %d: %w", i, ret)
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("calling nvmlDeviceGetUUID for gpu %d: %w", i, ret)
		}
		index[uuid] = uint32(i)
		supported, ret := dev.GetSupportedEventTypes()
		if ret != nvml.SUCCESS || supported&faultEvents == 0 {
			d.log.Warn("gpu does not report fault events; its health is not watched", zap.Int("gpu", i), zap.String("uuid", uuid), zap.Error(ret))
			continue
		}
		if ret := dev.RegisterEvents(supported&faultEvents, set); ret != nvml.SUCCESS {
			d.log.Warn("registering gpu fault events failed", zap.Int("gpu", i), zap.String("uuid", uuid), zap.Error(ret))
		}
	}
	for ctx.Err() == nil {
		data, ret := set.Wait(waitTimeoutMs)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		default:
			d.log.Warn("waiting for gpu events failed", zap.Error(ret))
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		f := health.Fault{Code: data.EventData, At: time.Now()}
		switch data.EventType {
		case nvml.EventTypeXidCriticalError:
			f.Kind = health.XID
		case nvml.EventTypeDoubleBitEccError:
			f.Kind = health.ECCUncorrectable
		default:
			continue
		}
		if data.Device != nil {
			if uuid, ret := data.Device.GetUUID(); ret == nvml.SUCCESS {
				f.UUID, f.GPUIndex = uuid, index[uuid]
			}
		}
		report(f)
	}
	return nil
}
