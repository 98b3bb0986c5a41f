package health

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// GPU faults have no cgo here: the NVML event watcher (agent/gpu/nvmlgpu)
// produces Faults, the agent forwards the critical ones by its XIDPolicy,
// and the controller cordons the node.

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

func (f Fault) String() string {
	switch f.Kind {
	case XID:
		return fmt.Sprintf("GPU %d (%s): XID %d", f.GPUIndex, f.UUID, f.Code)
	case ECCUncorrectable:
		return fmt.Sprintf("GPU %d (%s): uncorrectable ECC error", f.GPUIndex, f.UUID)
	}
	return fmt.Sprintf("GPU %d (%s): %s %d", f.GPUIndex, f.UUID, f.Kind, f.Code)
}

// ApplicationXIDs are XIDs the driver raises for faults of the running
// program (a bad kernel, a page fault, a preempted context) rather than of
// the GPU; the GPU is fine for the next job. The same list NVIDIA's
// Kubernetes device plugin skips by default.
var ApplicationXIDs = []uint64{
	13,  // graphics engine exception
	31,  // GPU memory page fault
	43,  // GPU stopped processing
	45,  // preemptive cleanup, due to previous errors
	68,  // video processor exception
	109, // context switch timeout
}

// allXIDs is the entry of an ignored list that ignores every XID.
const allXIDs = "all"

// XIDEntry is one item of an operator's list of XIDs: a number, or "all"
// where that is allowed. YAML may give it as a number or a string.
type XIDEntry string

// UnmarshalJSON takes a JSON number or string.
func (e *XIDEntry) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*e = XIDEntry(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("want an XID number or %q, got %s", allXIDs, b)
	}
	*e = XIDEntry(n)
	return nil
}

// GPUConfig is the operator's say in which GPU faults cordon a node (the
// agent's gpu_health), as NVIDIA's device plugin allows with
// DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS.
type GPUConfig struct {
	// IgnoredXIDs are only logged, on top of ApplicationXIDs; "all"
	// ignores every XID. Uncorrectable ECC errors count regardless.
	IgnoredXIDs []XIDEntry `json:"ignored_xids"`
	// CriticalXIDs cordon the node even when ignored, by default or by
	// "all": for example 43 where it means a hung GPU rather than a bad
	// program.
	CriticalXIDs []XIDEntry `json:"critical_xids"`
}

// XIDPolicy says which faults make a GPU untrustworthy. Build it with
// GPUConfig.Policy.
type XIDPolicy struct {
	ignoreAll bool
	ignored   map[uint64]bool
	critical  map[uint64]bool
}

// Policy validates the config, naming problems under field, and builds
// its policy.
func (c GPUConfig) Policy(field string) (XIDPolicy, error) {
	p := XIDPolicy{ignored: map[uint64]bool{}, critical: map[uint64]bool{}}
	for _, x := range ApplicationXIDs {
		p.ignored[x] = true
	}
	var errs []error
	explicit := map[uint64]bool{}
	for i, e := range c.IgnoredXIDs {
		if e == allXIDs {
			p.ignoreAll = true
			continue
		}
		x, err := parseXID(fmt.Sprintf("%s.ignored_xids[%d]", field, i), e, true)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p.ignored[x], explicit[x] = true, true
	}
	for i, e := range c.CriticalXIDs {
		name := fmt.Sprintf("%s.critical_xids[%d]", field, i)
		x, err := parseXID(name, e, false)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if explicit[x] {
			errs = append(errs, fmt.Errorf("%s: XID %d is also in %s.ignored_xids; list it in one of them", name, x, field))
			continue
		}
		p.critical[x] = true
	}
	if len(errs) > 0 {
		return XIDPolicy{}, errors.Join(errs...)
	}
	return p, nil
}

func parseXID(field string, e XIDEntry, allowAll bool) (uint64, error) {
	want := "an XID number (1 or more)"
	if allowAll {
		want += fmt.Sprintf(" or %q", allXIDs)
	}
	x, err := strconv.ParseUint(string(e), 10, 64)
	if err != nil || x == 0 {
		return 0, fmt.Errorf("%s: must be %s, got %q", field, want, string(e))
	}
	return x, nil
}

// Critical reports whether the GPU can no longer be trusted with work:
// every uncorrectable ECC error, and every XID that is neither an
// application error nor ignored by the operator (for example 48 double-bit
// ECC, 63/64 row remapping, 74 NVLink, 79 fallen off the bus), and every
// XID the operator listed as critical.
func (p XIDPolicy) Critical(f Fault) bool {
	if f.Kind == ECCUncorrectable || p.critical[f.Code] {
		return true
	}
	return !p.ignoreAll && !p.ignored[f.Code]
}

// String describes the policy for the agent's log.
func (p XIDPolicy) String() string {
	list := func(m map[uint64]bool) string {
		if len(m) == 0 {
			return "none"
		}
		xs := make([]string, 0, len(m))
		for _, x := range slices.Sorted(maps.Keys(m)) {
			xs = append(xs, strconv.FormatUint(x, 10))
		}
		return strings.Join(xs, ",")
	}
	ignored := list(p.ignored)
	if p.ignoreAll {
		ignored = allXIDs
	}
	return fmt.Sprintf("ignored xids: %s; critical xids: %s; uncorrectable ecc: critical", ignored, list(p.critical))
}
