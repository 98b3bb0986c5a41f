package controller

import (
	"fmt"
	"net"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"
)

// handshakeQueueWait bounds how long a connection waits for its turn to
// handshake; then it goes ahead without one, short of the agents' 20 s
// dial timeout (client.DefaultConfig). Closing it instead would only make
// its agent connect again after its backoff, behind the same queue, and a
// cold start would take longer.
const handshakeQueueWait = 15 * time.Second

// handshakeTimeout bounds one handshake, from its turn (or the end of its
// wait) to the client's first HTTP/2 frames: a client that stalls
// mid-handshake gives its turn up within it.
const handshakeTimeout = 10 * time.Second

// handshakeGate bounds the TLS handshakes the controller runs at once
// (tls.max_handshakes). When every agent of a large cluster connects at
// once (a cold start: no session to resume), thousands of handshakes in
// flight would share the CPU with the heartbeats of the agents already
// registered: everyone's wait grows together, registered nodes go silent
// past the heartbeat timeout and are declared lost, and register again,
// which feeds the storm. Beyond the limit a connection waits its turn, in arrival
// order and without using CPU, and the registered agents keep theirs. The
// agents' side waits with it: each handshake needs the server's answer.
// The gate never refuses a connection: one that waited handshakeQueueWait
// goes ahead without a turn.
type handshakeGate struct {
	slots    chan struct{}
	clock    clockwork.Clock
	waiting  prometheus.Gauge
	overflow prometheus.Counter
}

func newHandshakeGate(limit int, clock clockwork.Clock, waiting prometheus.Gauge, overflow prometheus.Counter) *handshakeGate {
	return &handshakeGate{slots: make(chan struct{}, limit), clock: clock, waiting: waiting, overflow: overflow}
}

// enter waits up to handshakeQueueWait for a turn; turn says it got one,
// which leave gives back. Without one the handshake goes ahead anyway.
func (g *handshakeGate) enter() (turn bool) {
	select {
	case g.slots <- struct{}{}:
		return true
	default:
	}
	g.waiting.Inc()
	defer g.waiting.Dec()
	t := g.clock.NewTimer(handshakeQueueWait)
	defer t.Stop()
	// Blocked senders on a channel are served in the order they came.
	select {
	case g.slots <- struct{}{}:
		return true
	case <-t.Chan():
		g.overflow.Inc()
		return false
	}
}

func (g *handshakeGate) leave() { <-g.slots }

// gatedCreds runs each server handshake of creds in a turn of gate.
type gatedCreds struct {
	credentials.TransportCredentials
	gate *handshakeGate
}

func (c gatedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if c.gate.enter() {
		defer c.gate.leave()
	}
	// gRPC sets its own deadline (2 minutes) around the handshake and
	// clears it after; the turn is held for this one instead. Socket
	// deadlines are the system's clock, not an injected one.
	if err := raw.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return nil, nil, fmt.Errorf("tls handshake with %s: %w", raw.RemoteAddr(), err)
	}
	return c.TransportCredentials.ServerHandshake(raw)
}

func (c gatedCreds) Clone() credentials.TransportCredentials {
	return gatedCreds{TransportCredentials: c.TransportCredentials.Clone(), gate: c.gate}
}
