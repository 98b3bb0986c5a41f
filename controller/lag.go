package controller

import (
	"math"
	rtmetrics "runtime/metrics"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// The controller's own lag, credited to every node's silence (see
// health.Heartbeat.Liveness): with thousands of agents connecting at once,
// TLS handshakes and registrations take the CPU, and the heartbeats of
// nodes already registered wait in the controller's run queue for longer
// than the heartbeat timeout. The nodes are healthy; the controller is
// behind. How far behind is measured two ways, both since the previous
// liveness pass: the longest any goroutine (a stream's reader among them)
// waited to run, the Go runtime's own account, which includes the process
// being starved of CPU by the host and costs one read of a histogram per
// pass; and the longest a stream's receiver spent on one message (heldUp),
// which its heartbeats behind it waited out: a generation's thousands of
// worker reports queue for the controller's lock at once.

// schedLatencies is the runtime's histogram of the time goroutines spent
// runnable before running.
const schedLatencies = "/sched/latencies:seconds"

// schedWait reads the longest run-queue wait since its previous read.
type schedWait struct {
	sample []rtmetrics.Sample
	prev   []uint64
}

func newSchedWait() *schedWait {
	w := &schedWait{sample: []rtmetrics.Sample{{Name: schedLatencies}}}
	w.longest()
	return w
}

func (w *schedWait) longest() time.Duration {
	rtmetrics.Read(w.sample)
	if w.sample[0].Value.Kind() != rtmetrics.KindFloat64Histogram {
		return 0 // a runtime without the metric: the pass's own lateness only
	}
	h := w.sample[0].Value.Float64Histogram()
	var worst float64
	for i, n := range h.Counts {
		if i < len(w.prev) && n > w.prev[i] {
			// Buckets[i] is bucket i's lower bound: what the waits in it
			// certainly took.
			worst = h.Buckets[i]
		}
	}
	w.prev = append(w.prev[:0], h.Counts...)
	if math.IsInf(worst, 0) || worst <= 0 {
		return 0
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

// noteLag records the controller's lag before a liveness pass. Operators
// are told when it starts and stops sparing nodes (beyond a heartbeat
// interval), not at every pass.
func (c *Controller) noteLag() {
	lag := c.waited()
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	c.lag.Observe(now, lag)
	behind := c.lag.Max(now) > c.cfg.Heartbeat.Interval.Duration
	if behind != c.behind {
		c.behind = behind
		if behind {
			c.log.Named("liveness").Warn("controller behind its agents: their silence is judged net of its lag", zap.Duration("lag", lag))
		} else {
			c.log.Named("liveness").Info("controller caught up with its agents")
		}
	}
}
