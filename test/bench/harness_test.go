//go:build bench

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rdzv/rdzv/test/netns"
)

// tick is one TICK line written by bench_worker.py.
type tick struct {
	host    string
	pid     int
	started float64 // unix seconds the worker process began
	gen     string
	rank    string
	step    int
	t       float64 // unix seconds of the step
	hang    bool
	// torchft only: the quorum the step was committed in and its size
	// (-1, 0 for the other systems).
	quorum, participants int
	world                int // the job's WORLD_SIZE (0: unknown)
}

// width is how many nodes took part in the step.
func (k tick) width() int {
	switch {
	case k.participants > 0:
		return k.participants
	case k.world > 0:
		return k.world
	}
	return nodeHosts
}

func (k tick) time() time.Time { return unixTime(k.t) }

func unixTime(s float64) time.Time {
	sec, frac := math.Modf(s)
	return time.Unix(int64(sec), int64(frac*1e9))
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// readTicks parses every tick file in dir. The files are small (a few
// hundred lines per run), so they are re-read whole on each poll.
func readTicks(dir string) []tick {
	files, _ := filepath.Glob(filepath.Join(dir, "*.ticks"))
	var ticks []tick
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(string(data), "\n")
		// The last piece is empty, or a line still being written: skip it.
		for _, line := range lines[:len(lines)-1] {
			if k, ok := parseTick(line); ok {
				ticks = append(ticks, k)
			}
		}
	}
	return ticks
}

func parseTick(line string) (tick, bool) {
	k := tick{quorum: -1}
	rest, ok := strings.CutPrefix(line, "TICK ")
	if !ok {
		return k, false
	}
	seen := 0
	for _, field := range strings.Fields(rest) {
		key, val, _ := strings.Cut(field, "=")
		var err error
		switch key {
		case "host":
			k.host = val
			seen++
		case "pid":
			k.pid, err = strconv.Atoi(val)
			seen++
		case "started":
			k.started, err = strconv.ParseFloat(val, 64)
			seen++
		case "gen":
			k.gen = val
		case "rank":
			k.rank = val
		case "step":
			k.step, err = strconv.Atoi(val)
			seen++
		case "t":
			k.t, err = strconv.ParseFloat(val, 64)
			seen++
		case "hang":
			k.hang = true
		case "quorum":
			k.quorum, err = strconv.Atoi(val)
		case "participants":
			k.participants, err = strconv.Atoi(val)
		case "world":
			k.world, err = strconv.Atoi(val)
		}
		if err != nil {
			return k, false
		}
	}
	return k, seen == 5
}

// phaseMark is one PHASE line written by bench_worker.py: a worker process
// got as far as importing torch ("imported") or joining its process group
// ("pg").
type phaseMark struct {
	host, gen, name string
	started, t      float64 // unix seconds the process began; of the mark
}

// readPhases parses the PHASE lines of every tick file in dir.
func readPhases(dir string) []phaseMark {
	files, _ := filepath.Glob(filepath.Join(dir, "*.ticks"))
	var out []phaseMark
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(string(data), "\n")
		for _, line := range lines[:len(lines)-1] {
			rest, ok := strings.CutPrefix(line, "PHASE ")
			if !ok {
				continue
			}
			var m phaseMark
			seen := 0
			for _, field := range strings.Fields(rest) {
				key, val, _ := strings.Cut(field, "=")
				var err error
				switch key {
				case "host":
					m.host = val
				case "gen":
					m.gen = val
				case "phase":
					m.name = val
					seen++
				case "started":
					m.started, err = strconv.ParseFloat(val, 64)
					seen++
				case "t":
					m.t, err = strconv.ParseFloat(val, 64)
					seen++
				}
				if err != nil {
					seen = -1
					break
				}
			}
			if seen == 3 {
				out = append(out, m)
			}
		}
	}
	return out
}

// phase is one named step of a recovery and when it was reached after the
// fault.
type phase struct {
	name string
	at   time.Duration
}

// workerPhases are the start-up steps of the worker processes started after
// t0: the first process up ("python"), the last to have imported torch
// ("torch", which every rank needs before it can join), and the last to
// have its process group up ("pg", collective: it is up when the last rank
// joins).
func workerPhases(marks []phaseMark, t0 time.Time) []phase {
	t0s := unixSeconds(t0)
	var python, torch, pg float64
	for _, m := range marks {
		if m.started <= t0s {
			continue
		}
		if python == 0 || m.started < python {
			python = m.started
		}
		switch m.name {
		case "imported":
			torch = max(torch, m.t)
		case "pg":
			pg = max(pg, m.t)
		}
	}
	var out []phase
	for _, p := range []struct {
		name string
		t    float64
	}{{"python", python}, {"torch", torch}, {"pg", pg}} {
		if p.t > 0 {
			out = append(out, phase{p.name, unixTime(p.t).Sub(t0)})
		}
	}
	return out
}

// latestStepByHost is the highest step each host's workers have reached.
func latestStepByHost(ticks []tick) map[string]tick {
	m := map[string]tick{}
	for _, k := range ticks {
		if cur, ok := m[k.host]; !ok || k.t > cur.t {
			m[k.host] = k
		}
	}
	return m
}

// firstTickAfter is the earliest step taken by a worker process that
// started after t0: the first training step after recovery. Steps finished
// after t0 by workers that were already running (a step in flight when the
// fault hit) do not count.
func firstTickAfter(ticks []tick, t0 time.Time) (tick, bool) {
	t0s := unixSeconds(t0)
	var best tick
	found := false
	for _, k := range ticks {
		if k.hang || k.started <= t0s || k.t <= t0s {
			continue
		}
		if !found || k.t < best.t {
			best, found = k, true
		}
	}
	return best, found
}

// killNamespace SIGKILLs every process in a network namespace until none
// is left (processes forked meanwhile are caught by the next pass).
func killNamespace(ns string) (int, error) {
	killed := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		out, err := exec.Command("ip", "netns", "pids", ns).Output()
		if err != nil {
			return killed, fmt.Errorf("ip netns pids %s: %w", ns, err)
		}
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			return killed, nil
		}
		for _, s := range pids {
			if pid, err := strconv.Atoi(s); err == nil {
				if syscall.Kill(pid, syscall.SIGKILL) == nil {
					killed++
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return killed, fmt.Errorf("processes still in %s after 10s", ns)
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// ctl runs rdzvctl on h0, the only host that reaches the controller (the
// test process lives in the root namespace, off the hosts' subnet).
func ctl(h *netns.Host, bin, addr, tlsDir string, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stdout, _, err := h.Run(ctx, nil, append([]string{bin, "--controller", addr, "--tls-dir", tlsDir}, args...)...)
	return stdout, err
}

// The shapes of `rdzvctl -o json` that the benchmark reads.
type nodesJSON struct {
	Nodes []struct {
		Info struct {
			Name string `json:"name"`
		} `json:"info"`
		State string `json:"state"`
	} `json:"nodes"`
}

type jobJSON struct {
	State      string `json:"state"`
	Reason     string `json:"reason"`
	Generation uint64 `json:"generation,string"`
}

type eventJSON struct {
	Time             time.Time `json:"time"`
	Node             string    `json:"node"`
	Generation       uint64    `json:"generation,string"`
	Kind             string    `json:"kind"`
	Message          string    `json:"message"`
	DetectionLatency *string   `json:"detection_latency"`
}

func decode(out string, v any) error {
	if err := json.Unmarshal([]byte(out), v); err != nil {
		return fmt.Errorf("decoding %q: %w", out, err)
	}
	return nil
}

// parseProtoDuration reads a google.protobuf.Duration in protojson form
// ("1.234s").
func parseProtoDuration(s string) (time.Duration, error) {
	if !strings.HasSuffix(s, "s") {
		return 0, fmt.Errorf("not a protojson duration: %q", s)
	}
	f, err := strconv.ParseFloat(strings.TrimSuffix(s, "s"), 64)
	if err != nil {
		return 0, err
	}
	return time.Duration(f * float64(time.Second)), nil
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f", d.Seconds()) }
