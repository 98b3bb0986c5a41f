package controller

import (
	"math"
	rtmetrics "runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/health"
)

// The controller's own lag, credited to every node's silence (see
// health.Heartbeat.Liveness): with thousands of agents connecting at once,
// TLS handshakes and registrations take the CPU, and the heartbeats of
// nodes already registered wait in the controller's run queue for longer
// than the heartbeat timeout. The nodes are healthy; the controller is
// behind. How far behind is measured two ways, both since the previous
// liveness pass: the longest any goroutine (a stream's reader among them)
// waited to run or the world was stopped, the Go runtime's own account,
// which includes the process being starved of CPU by the host and costs
// one read of three histograms per pass; and the longest a stream's receiver spent on one message (heldUp),
// which its heartbeats behind it waited out: a generation's thousands of
// worker reports queue for the controller's lock at once.

// schedWaits are the runtime's histograms of what kept goroutines from
// running: time spent runnable before running, and the world stopped (for
// the collector, or for a goroutine profile, which with thousands of
// agents' goroutines stops it for seconds).
var schedWaits = []string{"/sched/latencies:seconds", "/sched/pauses/total/gc:seconds", "/sched/pauses/total/other:seconds"}

// schedWait reads the longest wait since its previous read.
type schedWait struct {
	sample []rtmetrics.Sample
	prev   [][]uint64
}

func newSchedWait() *schedWait {
	w := &schedWait{prev: make([][]uint64, len(schedWaits))}
	for _, name := range schedWaits {
		w.sample = append(w.sample, rtmetrics.Sample{Name: name})
	}
	w.longest()
	return w
}

func (w *schedWait) longest() time.Duration {
	rtmetrics.Read(w.sample)
	var worst float64
	for i, s := range w.sample {
		if s.Value.Kind() != rtmetrics.KindFloat64Histogram {
			continue // a runtime without the metric
		}
		h := s.Value.Float64Histogram()
		for j, n := range h.Counts {
			if j < len(w.prev[i]) && n > w.prev[i][j] && !math.IsInf(h.Buckets[j], 0) {
				// Buckets[j] is bucket j's lower bound: what the waits in
				// it certainly took.
				worst = max(worst, h.Buckets[j])
			}
		}
		w.prev[i] = append(w.prev[i][:0], h.Counts...)
	}
	return time.Duration(worst * float64(time.Second))
}

// longest keeps the longest duration noted since it was last taken.
type longest struct{ d atomic.Int64 }

func (l *longest) note(d time.Duration) {
	for {
		cur := l.d.Load()
		if int64(d) <= cur || l.d.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

func (l *longest) take() time.Duration { return time.Duration(l.d.Swap(0)) }

// lagMeter is the controller's own recent lag, credited to every node's
// silence. waited measures it (the runtime's waits, and heldUp, the
// longest any stream's receiver spent on one message); window keeps the
// recent worst; behind is set while that exceeds a heartbeat interval.
// waited is set before Run and called by the liveness loop alone; heldUp
// is atomic; window and behind are guarded by mu.
type lagMeter struct {
	log      *zap.Logger
	interval time.Duration
	waited   func() time.Duration
	heldUp   longest

	mu     sync.Mutex
	window *health.LagWindow
	behind bool
}

func newLagMeter(timeout, interval time.Duration, log *zap.Logger) *lagMeter {
	m := &lagMeter{log: log, interval: interval, window: health.NewLagWindow(timeout)}
	sched := newSchedWait()
	m.waited = func() time.Duration { return max(sched.longest(), m.heldUp.take()) }
	return m
}

// note records the lag measured since the previous note, at now, before
// a liveness pass. Operators are told when it starts and stops sparing
// nodes (beyond a heartbeat interval), not at every pass.
func (m *lagMeter) note(now time.Time) {
	lag := m.waited()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.window.Observe(now, lag)
	behind := m.window.Max(now) > m.interval
	if behind == m.behind {
		return
	}
	m.behind = behind
	if behind {
		m.log.Warn("controller behind its agents: their silence is judged net of its lag", zap.Duration("lag", lag))
	} else {
		m.log.Info("controller caught up with its agents")
	}
}

// max is the worst lag within the window before now.
func (m *lagMeter) max(now time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.window.Max(now)
}
