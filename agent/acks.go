package agent

import (
	"sync"
	"time"
)

// ackWindow is how many heartbeats an acknowledgement may lag behind and
// still count; one later than that is as good as none.
const ackWindow = 64

// Acks remembers when this connection sent its recent heartbeats, so that
// an acknowledgement can move the self-fencing clock to the sending of the
// heartbeat it acknowledges. The controller received that heartbeat no
// earlier than it was sent, so the agent's clock never starts after the
// controller's (health.FencedBy counts on it). Any other message from the
// controller (an assignment, a stop order) says nothing of when it last
// heard us, and may reach an agent whose own messages no longer get
// through. Exported for test/sim, whose simulated agents must keep the
// same window.
type Acks struct {
	mu   sync.Mutex
	sent [ackWindow]struct {
		seq uint64
		at  time.Time
	}
}

// Sending records that heartbeat seq (from 1) is sent at about at; call it
// before the send.
func (a *Acks) Sending(seq uint64, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := &a.sent[seq%ackWindow]
	e.seq, e.at = seq, at
}

// Acked is when the heartbeat an acknowledgement names was sent; false for
// one this connection did not send or has forgotten.
func (a *Acks) Acked(seq uint64) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.sent[seq%ackWindow]
	if e.seq != seq || e.at.IsZero() {
		return time.Time{}, false
	}
	return e.at, true
}
