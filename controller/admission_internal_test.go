package controller

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/credentials"
)

func newTestGate(limit int) (*handshakeGate, *clockwork.FakeClock) {
	clock := clockwork.NewFakeClock()
	return newHandshakeGate(limit, clock,
		prometheus.NewGauge(prometheus.GaugeOpts{Name: "waiting"}),
		prometheus.NewCounter(prometheus.CounterOpts{Name: "overflow"})), clock
}

// Beyond the limit a handshake waits for a turn and gets the first one
// freed; one that waited handshakeQueueWait goes ahead without a turn.
func TestHandshakeGate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, clock := newTestGate(2)
	require.True(t, g.enter())
	require.True(t, g.enter())

	entered := make(chan bool, 1)
	go func() { entered <- g.enter() }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1), "the third waits on its timer")
	require.Equal(t, 1.0, testutil.ToFloat64(g.waiting))
	select {
	case turn := <-entered:
		t.Fatalf("went ahead beyond the limit (turn %t)", turn)
	default:
	}
	g.leave()
	require.True(t, <-entered, "a freed turn goes to the waiting handshake")
	require.Equal(t, 0.0, testutil.ToFloat64(g.waiting))

	go func() { entered <- g.enter() }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(handshakeQueueWait - time.Millisecond)
	select {
	case turn := <-entered:
		t.Fatalf("stopped waiting before handshakeQueueWait (turn %t)", turn)
	case <-time.After(50 * time.Millisecond):
	}
	clock.Advance(time.Millisecond)
	require.False(t, <-entered, "it goes ahead without a turn")
	require.Equal(t, 1.0, testutil.ToFloat64(g.overflow))
	require.Equal(t, 0.0, testutil.ToFloat64(g.waiting))
	require.Len(t, g.slots, 2, "going ahead took no turn")

	g.leave()
	g.leave()
	require.True(t, g.enter(), "every turn was given back")
}

// countingCreds counts the server handshakes in flight; each blocks until
// released.
type countingCreds struct {
	credentials.TransportCredentials
	in      chan struct{}
	release chan struct{}
}

func (c countingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c.in <- struct{}{}
	<-c.release
	return raw, nil, nil
}

// gatedCreds runs at most the limit of handshakes at once, and gives the
// turn back when a handshake ends.
func TestGatedCredsBoundsHandshakes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, clock := newTestGate(1)
	inner := countingCreds{in: make(chan struct{}, 2), release: make(chan struct{})}
	creds := gatedCreds{TransportCredentials: inner, gate: g}

	conns := make([]net.Conn, 2)
	for i := range conns {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		conns[i] = a
	}
	done := make(chan error, 2)
	for _, c := range conns {
		go func() {
			_, _, err := creds.ServerHandshake(c)
			done <- err
		}()
	}
	<-inner.in
	require.NoError(t, clock.BlockUntilContext(ctx, 1), "the second waits for the first")
	require.Empty(t, inner.in, "two handshakes ran at once with a limit of one")
	inner.release <- struct{}{}
	require.NoError(t, <-done)
	<-inner.in
	inner.release <- struct{}{}
	require.NoError(t, <-done)
	require.Empty(t, g.slots, "both turns were given back")
}
