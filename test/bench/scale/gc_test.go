//go:build bench

package scale

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"time"
)

// A collection stalls a Go process that holds thousands of connections for
// a good part of a second on this machine: every goroutine that allocates
// while the collector marks must first help it mark, at least 64 KB of
// scan work each (the runtime's gcOverAssistWork; golang/go#56966), and
// with tens of thousands of such goroutines the whole mark is done inline
// by them, before they do anything else. A relay's collections are part of
// what the benchmark measures, and it counts them per phase.
//
// The benchmark's own are not. Its process carries all N simulated agents
// (about 1 GB live at 10,000), and one of its collections stalled every
// simulated agent at once for 0.5-0.7 s, mostly in mark assists, which no
// real cluster does: each agent is a process of its own with a small heap.
// So by default (BENCH_SIM_GC=phases), from the simulated agents' start
// until the size's phases are over, it collects only once, just before the
// steady window (and at its memory limit, half the machine's memory);
// BENCH_SIM_GC=go keeps Go's default.

// simGC is the benchmark process's collection policy (BENCH_SIM_GC).
type simGC string

const (
	simGCPhases simGC = "phases"
	simGCGo     simGC = "go"
)

func parseSimGC(s string) (simGC, error) {
	switch p := simGC(s); p {
	case "":
		return simGCPhases, nil
	case simGCPhases, simGCGo:
		return p, nil
	}
	return "", fmt.Errorf("BENCH_SIM_GC=%q: want %q (collect between phases only) or %q (Go's default)", s, simGCPhases, simGCGo)
}

// holdCollections stops the benchmark process's collections, but for its
// memory limit, until the returned function restores them.
func holdCollections() (restore func()) {
	limit := int64(memTotal() / 2)
	oldLimit := debug.SetMemoryLimit(limit)
	oldPercent := debug.SetGCPercent(-1)
	return func() {
		debug.SetGCPercent(oldPercent)
		debug.SetMemoryLimit(oldLimit)
		runtime.GC()
	}
}

// memTotal is the machine's memory, 8 GiB when /proc/meminfo says nothing.
func memTotal() uint64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			var kb uint64
			if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kb); err == nil && kb > 0 {
				return kb << 10
			}
		}
	}
	return 8 << 30
}

// gcCount is how many collections the benchmark process and each relay
// have made, and the benchmark's seconds of mark assists.
type gcCount struct {
	sims   uint64
	assist float64
	// relays has -1 for a relay whose count could not be read.
	relays []int64
}

func (ru *run) countGC() gcCount {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/cpu/classes/gc/mark/assist:cpu-seconds"}}
	metrics.Read(s)
	c := gcCount{sims: s[0].Value.Uint64(), assist: s[1].Value.Float64()}
	ctx, cancel := context.WithTimeout(ru.ctx, 5*time.Second)
	defer cancel()
	for _, rl := range ru.relays {
		n := int64(-1)
		if ms, err := memStats(ctx, rl.PprofSocket); err == nil {
			n = int64(ms["NumGC"])
		}
		c.relays = append(c.relays, n)
	}
	return c
}

// describeGC says what collections happened between a and b.
func describeGC(a, b gcCount) string {
	s := fmt.Sprintf("%d (%.2f s of mark assists)", b.sims-a.sims, b.assist-a.assist)
	if len(b.relays) == 0 {
		return s + " / no relays"
	}
	var relays []string
	for i, n := range b.relays {
		if n < 0 || a.relays[i] < 0 {
			relays = append(relays, "?")
			continue
		}
		relays = append(relays, fmt.Sprint(n-a.relays[i]))
	}
	return s + " / " + strings.Join(relays, ", ")
}
