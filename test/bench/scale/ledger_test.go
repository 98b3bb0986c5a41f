//go:build bench

package scale

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdzv/rdzv/test/sim"
)

// What the ledger counts.
type kind int

const (
	kindRegistered   kind = iota // first registration of an agent
	kindAssignment               // an assignment was taken (by generation)
	kindStop                     // a stop order ended running workers (by generation)
	kindReconnect                // a session ended while the agent was not silenced
	kindReregistered             // a later registration (by epoch, see ledger.epoch)
	kindHandshake                // a full TLS handshake (by epoch)
	kindResumed                  // a resumed TLS handshake (by epoch)
)

type ledgerKey struct {
	kind kind
	gen  uint64
}

// ledger is what all simulated agents saw, for the phases to wait on and
// report: it observes them (sim.Observer).
type ledger struct {
	mu      sync.Mutex
	n       map[ledgerKey]int
	first   map[ledgerKey]time.Time
	last    map[ledgerKey]time.Time
	reasons map[string]int // why sessions ended, for the report
	// names holds, for kindReregistered, which agents registered again:
	// one that registers twice must not stand in for one that has not.
	names map[ledgerKey]map[string]bool
	rtts  []time.Duration
	// recording turns RTT collection on (the steady phase).
	recording atomic.Bool
	// epoch buckets later registrations and handshakes: a phase that
	// restarts the controller counts those after the restart.
	epoch atomic.Uint64
	// maxGap is the longest time between two heartbeats of one session
	// (nanoseconds) since takeGap: how late the agents themselves were, on
	// a machine they share with the controller.
	maxGap atomic.Int64
}

func newLedger() *ledger {
	return &ledger{n: map[ledgerKey]int{}, first: map[ledgerKey]time.Time{}, last: map[ledgerKey]time.Time{}, reasons: map[string]int{},
		names: map[ledgerKey]map[string]bool{}}
}

// observe is the ledger's sim.Observer.
func (l *ledger) observe(e sim.Event) {
	switch e.Kind {
	case sim.Registered:
		if e.First {
			l.add(kindRegistered, 0, e.At)
		} else {
			key := ledgerKey{kindReregistered, l.epoch.Load()}
			l.add(key.kind, key.gen, e.At)
			l.mu.Lock()
			if l.names[key] == nil {
				l.names[key] = map[string]bool{}
			}
			l.names[key][e.Agent.Name()] = true
			l.mu.Unlock()
		}
	case sim.Handshake:
		if e.Resumed {
			l.add(kindResumed, l.epoch.Load(), e.At)
		} else {
			l.add(kindHandshake, l.epoch.Load(), e.At)
		}
	case sim.Heartbeat:
		l.gap(e.Gap)
	case sim.HeartbeatAcked:
		if l.recording.Load() {
			l.mu.Lock()
			l.rtts = append(l.rtts, e.RTT)
			l.mu.Unlock()
		}
	case sim.Assignment:
		if e.Taken {
			l.add(kindAssignment, e.Gen, e.At)
		}
	case sim.StopOrder:
		if e.Taken {
			l.add(kindStop, e.Gen, e.At)
		}
	case sim.SessionEnded:
		l.add(kindReconnect, 0, e.At)
		l.mu.Lock()
		l.reasons[e.Err.Error()]++
		l.mu.Unlock()
	}
}

func (l *ledger) gap(d time.Duration) {
	for {
		cur := l.maxGap.Load()
		if int64(d) <= cur || l.maxGap.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

func (l *ledger) takeGap() time.Duration { return time.Duration(l.maxGap.Swap(0)) }

// takeRTTs returns and clears the recorded round trips.
func (l *ledger) takeRTTs() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rtts
	l.rtts = nil
	return r
}

func (l *ledger) add(k kind, gen uint64, at time.Time) {
	key := ledgerKey{k, gen}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n[key] == 0 || at.Before(l.first[key]) {
		l.first[key] = at
	}
	if at.After(l.last[key]) {
		l.last[key] = at
	}
	l.n[key]++
}

// agents is how many distinct agents a kind recorded by name has seen.
func (l *ledger) agents(k kind, gen uint64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.names[ledgerKey{k, gen}])
}

// get returns how many, and the first and last time.
func (l *ledger) get(k kind, gen uint64) (int, time.Time, time.Time) {
	key := ledgerKey{k, gen}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[key], l.first[key], l.last[key]
}
