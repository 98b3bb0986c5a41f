// Package nvmlgpu discovers GPUs through NVML. It is the only package that
// imports go-nvml, which needs cgo, so that everything else builds with
// CGO_ENABLED=0.
package nvmlgpu

import (
	"context"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"

	"github.com/rdzv/rdzv/agent/gpu"
)

var _ gpu.Discoverer = (*Discoverer)(nil)

// Discoverer lists GPUs through NVML. It initialises and shuts NVML down on
// every call so that the agent does not hold the GPU device files open between
// scans, which would get in the way of GPU resets and driver upgrades.
type Discoverer struct {
	lib nvml.Interface
	log *zap.Logger

	// A CPU-only node scans periodically; one line is enough to explain why it
	// reports no GPUs.
	unavailableOnce sync.Once
}

// New returns a Discoverer that uses lib, so tests can pass go-nvml's mocks.
func New(lib nvml.Interface, log *zap.Logger) *Discoverer {
	return &Discoverer{lib: lib, log: log}
}

// NewSystem returns a Discoverer backed by the machine's libnvidia-ml. The
// library is loaded lazily by Discover; a missing library is not an error.
func NewSystem(log *zap.Logger) *Discoverer {
	return New(nvml.New(), log)
}

// Discover returns the GPUs NVML reports, or none when libnvidia-ml cannot be
// loaded (a CPU-only node).
func (d *Discoverer) Discover(ctx context.Context) ([]gpu.GPU, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("discovering gpus: %w", err)
	}
	// go-nvml reports a failed dlopen of libnvidia-ml as ERROR_LIBRARY_NOT_FOUND
	// from Init rather than panicking, so no recover is needed. Shutdown must
	// not be called on this path: the library's symbols are unresolved.
	switch ret := d.lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		d.unavailableOnce.Do(func() {
			d.log.Warn("nvml not available, reporting zero gpus")
		})
		return nil, nil
	default:
		return nil, fmt.Errorf("calling nvmlInit: %w", ret)
	}
	defer func() {
		// The GPU list is already complete; a failed shutdown only leaks the
		// library handle, which is not worth failing the scan for.
		if ret := d.lib.Shutdown(); ret != nvml.SUCCESS {
			d.log.Warn("nvml shutdown failed", zap.Error(ret))
		}
	}()

	count, ret := d.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("calling nvmlDeviceGetCount: %w", ret)
	}
	var gpus []gpu.GPU
	for i := range count {
		// NVML calls can take seconds on a GPU in a bad state.
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("discovering gpu %d: %w", i, err)
		}
		g, err := d.device(i)
		if err != nil {
			return nil, err
		}
		gpus = append(gpus, g)
	}
	return gpus, nil
}

func (d *Discoverer) device(i int) (gpu.GPU, error) {
	dev, ret := d.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return gpu.GPU{}, fmt.Errorf("calling nvmlDeviceGetHandleByIndex for gpu %d: %w", i, ret)
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return gpu.GPU{}, fmt.Errorf("calling nvmlDeviceGetUUID for gpu %d: %w", i, ret)
	}
	name, ret := dev.GetName()
	if ret != nvml.SUCCESS {
		return gpu.GPU{}, fmt.Errorf("calling nvmlDeviceGetName for gpu %d: %w", i, ret)
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return gpu.GPU{}, fmt.Errorf("calling nvmlDeviceGetMemoryInfo for gpu %d: %w", i, ret)
	}
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return gpu.GPU{}, fmt.Errorf("calling nvmlDeviceGetPciInfo for gpu %d: %w", i, ret)
	}
	return gpu.GPU{
		Index:       uint32(i),
		UUID:        uuid,
		Name:        name,
		MemoryBytes: mem.Total,
		PCIBusID:    cString(pci.BusId[:]),
	}, nil
}

// cString converts a NUL-padded C char array. C char is signed on amd64 and
// unsigned on arm64, and go-nvml's generated types have used either.
func cString[T int8 | uint8](chars []T) string {
	b := make([]byte, 0, len(chars))
	for _, c := range chars {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}
