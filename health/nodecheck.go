package health

import (
	"fmt"
	"strings"
	"time"
)

// Node health checks: the agent runs them (built-ins for GPUs, the network
// and storage, and operators' commands) and reports their verdicts; the
// controller keeps a node with a failing check out of new rounds until the
// check passes again, and stops a running job at once only when the failing
// check is critical.

// Check is the verdict of one node health check.
type Check struct {
	Name string
	OK   bool
	// Critical: a failure also ends the node's running job (see
	// StopsRunningJob).
	Critical bool
	// Message says why the check failed; empty when it passes.
	Message string
	// Since is when OK last changed.
	Since time.Time
}

// Next is the verdict after a new run of the check: Since moves only when
// the outcome flips, so operators see how long a node has been failing.
func (c Check) Next(ok bool, msg string, now time.Time) Check {
	next := Check{Name: c.Name, OK: ok, Critical: c.Critical, Message: msg, Since: c.Since}
	if ok {
		next.Message = ""
	}
	if next.Since.IsZero() || ok != c.OK {
		next.Since = now
	}
	return next
}

// Failing returns the failing checks, in their order.
func Failing(checks []Check) []Check {
	var out []Check
	for _, c := range checks {
		if !c.OK {
			out = append(out, c)
		}
	}
	return out
}

// Eligible reports whether a node with these verdicts may join a new round:
// only when every check passes. Unlike a cordon, nobody needs to lift it:
// the next passing run makes the node eligible again.
func Eligible(checks []Check) bool { return len(Failing(checks)) == 0 }

// StopsRunningJob reports whether these verdicts end the node's running
// job at once, like a critical XID: a critical check failing (a missing
// GPU, pending row remaps, uncorrectable ECC errors) means the job would
// crash or train on corrupt memory. Soft checks (a throttling GPU, a full
// checkpoint disk, a degraded link, operators' checks unless marked
// critical) leave it running: the job may be what fills the disk, and it
// fails by itself if it cannot go on; only new rounds avoid the node.
func StopsRunningJob(checks []Check) (bool, string) {
	for _, c := range checks {
		if !c.OK && c.Critical {
			return true, c.Name + ": " + c.Message
		}
	}
	return false, ""
}

// Summary is the failing checks in words, for pending reasons and the CLI.
func Summary(checks []Check) string {
	var parts []string
	for _, c := range Failing(checks) {
		parts = append(parts, c.Name+": "+c.Message)
	}
	return strings.Join(parts, "; ")
}

// Clock-event (throttle) reasons as NVML numbers them
// (nvmlClocksEventReason*), so that the rule needs no cgo.
const (
	ThrottleHWSlowdown   uint64 = 0x8
	ThrottleSWThermal    uint64 = 0x20
	ThrottleHWThermal    uint64 = 0x40
	ThrottleHWPowerBrake uint64 = 0x80
)

// badThrottles are the reasons that mean the GPU is slowed by its own
// condition (heat, a power brake asserted by the board), not by the
// workload or a clock setting: the whole round would run at its pace.
var badThrottles = []struct {
	bit  uint64
	name string
}{
	{ThrottleHWSlowdown, "hardware slowdown"},
	{ThrottleHWThermal, "hardware thermal slowdown"},
	{ThrottleSWThermal, "software thermal slowdown"},
	{ThrottleHWPowerBrake, "hardware power brake"},
}

// GPUState is what the agent reads of one GPU for its health checks. A
// query the GPU does not support leaves its field zero, which is healthy.
type GPUState struct {
	Index uint32
	UUID  string
	// UncorrectableECC counts uncorrectable ECC errors since the driver
	// loaded (the volatile counter).
	UncorrectableECC uint64
	// RetiredPagesPending: pages retired for ECC errors wait for a reset to
	// take effect (pre-Ampere GPUs).
	RetiredPagesPending bool
	// RowRemapPending: rows remapped for ECC errors wait for a reset
	// (Ampere and later); RowRemapFailed: remapping failed, the memory is
	// bad.
	RowRemapPending, RowRemapFailed bool
	TemperatureC                    uint32
	// ThrottleReasons is NVML's clock-event reason mask.
	ThrottleReasons uint64
	// PersistenceDisabled is set only when the driver says persistence
	// mode is off (the driver then tears down and re-initialises the GPU
	// around every job, which is slow and hides faults).
	PersistenceDisabled bool
}

// GPUPolicy says what a healthy node's GPUs look like.
type GPUPolicy struct {
	// ExpectedCount is how many GPUs must be present.
	ExpectedCount int
	// MaxTemperatureC fails a GPU at or above this; 0 leaves temperature to
	// the throttle reasons.
	MaxTemperatureC uint32
	// RequirePersistence fails a GPU with persistence mode off.
	RequirePersistence bool
}

// Judge returns the problems of states: critical ones (the GPU is missing
// or its memory is bad, so a job there crashes or computes garbage) and
// soft ones (it is slow or misconfigured). Empty slices mean healthy.
func (p GPUPolicy) Judge(states []GPUState) (critical, soft []string) {
	if len(states) != p.ExpectedCount {
		critical = append(critical, fmt.Sprintf("%d GPUs present, expected %d", len(states), p.ExpectedCount))
	}
	for _, g := range states {
		gpu := fmt.Sprintf("GPU %d (%s)", g.Index, g.UUID)
		if g.UncorrectableECC > 0 {
			critical = append(critical, fmt.Sprintf("%s: %d uncorrectable ECC errors since the driver loaded", gpu, g.UncorrectableECC))
		}
		if g.RetiredPagesPending {
			critical = append(critical, gpu+": retired pages pending, needs a reset")
		}
		if g.RowRemapFailed {
			critical = append(critical, gpu+": row remapping failed")
		}
		if g.RowRemapPending {
			critical = append(critical, gpu+": row remapping pending, needs a reset")
		}
		if p.MaxTemperatureC > 0 && g.TemperatureC >= p.MaxTemperatureC {
			soft = append(soft, fmt.Sprintf("%s: %d C, limit %d C", gpu, g.TemperatureC, p.MaxTemperatureC))
		}
		for _, t := range badThrottles {
			if g.ThrottleReasons&t.bit != 0 {
				soft = append(soft, fmt.Sprintf("%s: clocks throttled (%s)", gpu, t.name))
			}
		}
		if p.RequirePersistence && g.PersistenceDisabled {
			soft = append(soft, gpu+": persistence mode off")
		}
	}
	return critical, soft
}
