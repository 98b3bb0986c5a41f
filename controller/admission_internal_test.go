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
		prometheus.NewCounter(prometheus.CounterOpts{Name: "refused"})), clock
}

// Beyond the limit a handshake waits for a turn, gets the first one freed,
// and is turned away once it waited handshakeQueueWait.
func TestHandshakeGate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, clock := newTestGate(2)
	require.NoError(t, g.enter())
	require.NoError(t, g.enter())

	entered := make(chan error, 1)
	go func() { entered <- g.enter() }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1), "the third waits on its timer")
	require.Equal(t, 1.0, testutil.ToFloat64(g.waiting))
	select {
	case err := <-entered:
		t.Fatalf("entered beyond the limit: %v", err)
	default:
	}
	g.leave()
	require.NoError(t, <-entered, "a freed turn goes to the waiting handshake")
	require.Equal(t, 0.0, testutil.ToFloat64(g.waiting))

	go func() { entered <- g.enter() }()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(handshakeQueueWait - time.Millisecond)
	select {
	case err := <-entered:
		t.Fatalf("gave up before handshakeQueueWait: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	clock.Advance(time.Millisecond)
	require.ErrorIs(t, <-entered, errHandshakeQueueFull)
	require.Equal(t, 1.0, testutil.ToFloat64(g.refused))
	require.Equal(t, 0.0, testutil.ToFloat64(g.waiting))

	g.leave()
	g.leave()
	require.NoError(t, g.enter(), "every turn was given back")
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

// gatedCreds runs at most the limit of handshakes at once, and a turned
// away connection gets an error naming its peer.
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

	// The only turn is held: the next one is turned away.
	require.NoError(t, g.enter())
	go func() {
		_, _, err := creds.ServerHandshake(conns[0])
		done <- err
	}()
	require.NoError(t, clock.BlockUntilContext(ctx, 1))
	clock.Advance(handshakeQueueWait)
	err := <-done
	require.ErrorIs(t, err, errHandshakeQueueFull)
	require.ErrorContains(t, err, "pipe")
}
