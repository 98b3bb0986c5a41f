// Package health classifies GPU faults. It has no cgo: the NVML event
// watcher (agent/gpu/nvmlgpu) produces Faults, the agent forwards critical
// ones, and the controller cordons the node.
package health

import (
	"fmt"
	"time"
)

// Kind is the source of a fault.
type Kind string

const (
	// XID is an NVML XID critical-error event; Code is the XID number.
	XID Kind = "xid"
	// ECCUncorrectable is a double-bit (uncorrectable) ECC error.
	ECCUncorrectable Kind = "ecc_uncorrectable"
)

// Fault is one GPU error reported by the driver.
type Fault struct {
	GPUIndex uint32
	UUID     string
	Kind     Kind
	Code     uint64
	At       time.Time
}

// applicationXIDs are XIDs the driver raises for faults of the running
// program (a bad kernel, a page fault, a preempted context) rather than of
// the GPU; the GPU is fine for the next job. The same list NVIDIA's
// Kubernetes device plugin skips.
var applicationXIDs = map[uint64]bool{
	13:  true, // graphics engine exception
	31:  true, // GPU memory page fault
	43:  true, // GPU stopped processing
	45:  true, // preemptive cleanup, due to previous errors
	68:  true, // video processor exception
	109: true, // context switch timeout
}

// Critical reports whether the GPU can no longer be trusted with work: every
// uncorrectable ECC error, and every XID that is not an application error
// (for example 48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen
// off the bus).
func (f Fault) Critical() bool {
	if f.Kind == ECCUncorrectable {
		return true
	}
	return !applicationXIDs[f.Code]
}

func (f Fault) String() string {
	switch f.Kind {
	case XID:
		return fmt.Sprintf("GPU %d (%s): XID %d", f.GPUIndex, f.UUID, f.Code)
	case ECCUncorrectable:
		return fmt.Sprintf("GPU %d (%s): uncorrectable ECC error", f.GPUIndex, f.UUID)
	}
	return fmt.Sprintf("GPU %d (%s): %s %d", f.GPUIndex, f.UUID, f.Kind, f.Code)
}
