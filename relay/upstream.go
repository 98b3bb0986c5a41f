package relay

import (
	"sync"
	"time"
)

// upstream is whether a controller serves the relay's agents, as the
// relay's last attempts found. While none does, the relay's held agents
// do not each knock: one attempt at a time (a pilot), at most one per
// holdRetry, tries for all of them, and the first stream a controller
// serves releases every held one at once. Ten thousand held agents each
// retrying every second kept a restarting controller busy refusing them,
// and it led again only minutes later (make bench-scale).
type upstream struct {
	mu   sync.Mutex
	down bool
	// back is closed when a controller serves again; a new one is made
	// when the relay finds none serving.
	back    chan struct{}
	lastTry time.Time
}

func newUpstream() *upstream { return &upstream{back: make(chan struct{})} }

// state says whether no controller served the last attempt, and what is
// closed once one serves again.
func (u *upstream) state() (down bool, back <-chan struct{}) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.down, u.back
}

// pilot says whether the caller is to try for everyone now: the
// controllers are down and nobody tried for holdRetry.
func (u *upstream) pilot(now time.Time) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.down || now.Sub(u.lastTry) < holdRetry {
		return false
	}
	u.lastTry = now
	return true
}

// failed records that no controller served an attempt made at now.
func (u *upstream) failed(now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.down {
		u.down, u.back = true, make(chan struct{})
	}
	u.lastTry = now
}

// served records that a controller served a stream, releasing the held.
func (u *upstream) served() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.down {
		u.down = false
		close(u.back)
	}
}
