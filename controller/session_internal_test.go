package controller

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// fakeStream records what is sent; a Send blocks while gate is held, and
// fails with err once set.
type fakeStream struct {
	mu      sync.Mutex
	sent    []uint64
	entered int // Sends called
	active  int // Sends past the gate: at most one at a time
	most    int
	gate    sync.RWMutex
	err     error
}

func (f *fakeStream) Send(m *rdzvv1.ConnectResponse) error {
	f.mu.Lock()
	f.entered++
	f.mu.Unlock()
	f.gate.RLock()
	defer f.gate.RUnlock()
	f.mu.Lock()
	f.active++
	f.most = max(f.most, f.active)
	err := f.err
	f.mu.Unlock()
	time.Sleep(time.Microsecond) // a window for a second sender to overlap
	f.mu.Lock()
	defer f.mu.Unlock()
	f.active--
	if err != nil {
		return err
	}
	f.sent = append(f.sent, m.GetHeartbeatAck().GetSeq())
	return nil
}

func (f *fakeStream) got() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]uint64(nil), f.sent...)
}

func ack(seq uint64) *rdzvv1.ConnectResponse {
	return &rdzvv1.ConnectResponse{Msg: &rdzvv1.ConnectResponse_HeartbeatAck{HeartbeatAck: &rdzvv1.HeartbeatAck{Seq: seq}}}
}

func testSession(t *testing.T, f *fakeStream) *session {
	s := newSession(context.Background(), "node-a", f, time.Now)
	t.Cleanup(func() { s.cancel(); s.close() })
	return s
}

// Messages leave in the order they were queued, one Send at a time,
// whether the receiver sends them itself or a sender started for them
// does.
func TestSessionSendsInOrder(t *testing.T) {
	for _, tt := range []struct {
		name string
		// now sends message i with sendNow, as the receiver does.
		now func(i int) bool
	}{
		{"queued only", func(int) bool { return false }},
		{"sent by the receiver only", func(int) bool { return true }},
		{"both", func(i int) bool { return i%3 == 0 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeStream{}
			s := testSession(t, f)
			const n = sendQueue - 1 // more would overflow the queue
			var want []uint64
			for i := range n {
				want = append(want, uint64(i))
				var ok bool
				if tt.now(i) {
					ok = s.sendNow(ack(uint64(i)))
				} else {
					ok = s.send(ack(uint64(i)))
				}
				require.True(t, ok)
			}
			require.Eventually(t, func() bool { return len(f.got()) == n }, 5*time.Second, time.Millisecond)
			require.Equal(t, want, f.got())
			require.Equal(t, 1, f.most, "one Send at a time")
			s.close() // waits for a sender still running: none is left once the queue is empty
			require.False(t, s.send(ack(n)), "a closed session refuses messages")
		})
	}
}

// Queued from many goroutines at once, nothing is lost or sent twice, and
// never two Sends at once.
func TestSessionConcurrentSenders(t *testing.T) {
	f := &fakeStream{}
	s := testSession(t, f)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				seq := uint64(g*1000 + i)
				if i%2 == 0 {
					s.sendNow(ack(seq))
				} else {
					s.send(ack(seq))
				}
			}
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool { return len(f.got()) == 8*30 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 1, f.most)
	last := map[uint64]int{}
	for _, seq := range f.got() {
		g, i := seq/1000, int(seq%1000)
		prev, seen := last[g]
		require.True(t, !seen || i > prev, "a goroutine's messages leave in its order")
		last[g] = i
	}
}

// A full queue ends the session; a failed Send ends it with the error; a
// closed session refuses messages, and close waits for a Send under way.
func TestSessionEnds(t *testing.T) {
	t.Run("full queue", func(t *testing.T) {
		f := &fakeStream{}
		f.gate.Lock() // the first Send blocks: everything else queues
		s := testSession(t, f)
		require.True(t, s.send(ack(0)))
		require.Eventually(t, func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.entered == 1 }, 5*time.Second, time.Millisecond)
		for i := range sendQueue {
			require.True(t, s.send(ack(uint64(i+1))))
		}
		require.False(t, s.send(ack(999)), "the queue is full")
		require.Error(t, s.ctx.Err(), "a full queue ends the session")
		closed := make(chan struct{})
		go func() { s.close(); close(closed) }()
		select {
		case <-closed:
			t.Fatal("close returned while a Send was under way")
		case <-time.After(20 * time.Millisecond):
		}
		f.gate.Unlock()
		<-closed
		require.Equal(t, []uint64{0}, f.got(), "nothing is sent once the session ended")
		require.False(t, s.sendNow(ack(1000)), "a closed session refuses messages")
	})
	t.Run("send fails", func(t *testing.T) {
		f := &fakeStream{err: errors.New("connection reset")}
		s := testSession(t, f)
		require.True(t, s.sendNow(ack(1)))
		require.Error(t, s.ctx.Err())
		require.ErrorIs(t, s.failed(), f.err)
		require.False(t, s.send(ack(2)))
	})
}
