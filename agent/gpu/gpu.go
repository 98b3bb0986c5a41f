// Package gpu describes the GPUs an agent offers to the scheduler. It has no
// cgo dependency so that the scheduler and tests can use it on any host; the
// NVML-backed discoverer lives in the nvmlgpu subpackage.
package gpu

import (
	"context"
	"errors"
	"fmt"

	"github.com/rdzv/rdzv/health"
)

// GPU is one device as reported to the controller.
type GPU struct {
	Index       uint32
	UUID        string
	Name        string
	MemoryBytes uint64
	PCIBusID    string
}

// Discoverer lists the GPUs of this machine.
type Discoverer interface {
	Discover(ctx context.Context) ([]GPU, error)
}

// ErrInvalidFakeCount reports a negative --fake-gpus value.
var ErrInvalidFakeCount = errors.New("fake gpu count must not be negative")

// Fake invents Count GPUs for CPU-only test hosts (--fake-gpus N). The GPUs
// exist for scheduling only: nothing can run CUDA on them.
type Fake struct {
	Count int
	// Node keeps fake UUIDs unique across the cluster, as real UUIDs are.
	Node string
}

// Discover returns Count GPUs named "Fake GPU".
func (f Fake) Discover(context.Context) ([]GPU, error) {
	if f.Count < 0 {
		return nil, fmt.Errorf("inventing %d gpus for node %q: %w", f.Count, f.Node, ErrInvalidFakeCount)
	}
	gpus := make([]GPU, f.Count)
	for i := range gpus {
		gpus[i] = GPU{
			Index: uint32(i),
			UUID:  fmt.Sprintf("GPU-fake-%s-%d", f.Node, i),
			Name:  "Fake GPU",
		}
	}
	return gpus, nil
}

// States reports every fake GPU healthy, for the node health checks.
func (f Fake) States(ctx context.Context) ([]health.GPUState, error) {
	gpus, err := f.Discover(ctx)
	states := make([]health.GPUState, len(gpus))
	for i, g := range gpus {
		states[i] = health.GPUState{Index: g.Index, UUID: g.UUID}
	}
	return states, err
}
