package controller

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"
)

// handshakeQueueWait bounds how long a connection waits for its turn to
// handshake before it is closed, short of the agents' 20 s dial timeout
// (client.DefaultConfig): a turn seldom goes to a client that gave up. At
// 10 s, a cold start of 10,000 agents on a 2-core controller (make
// bench-scale) turned 38,000 connections away, each retrying after its
// backoff; at 15 s, none.
const handshakeQueueWait = 15 * time.Second

// handshakeTimeout bounds one admitted handshake, from its turn to the
// client's first HTTP/2 frames: a client that stalls mid-handshake gives
// its turn up within it.
const handshakeTimeout = 10 * time.Second

// errHandshakeQueueFull turns a connection away that waited
// handshakeQueueWait without a turn.
var errHandshakeQueueFull = errors.New("too many tls handshakes waiting; closing the connection (the client retries)")

// handshakeGate bounds the TLS handshakes the controller runs at once
// (tls.max_handshakes). When every agent of a large cluster connects at
// once (a cold start: no session to resume), thousands of handshakes in
// flight shared the CPU with the heartbeats of the agents already
// registered: everyone's wait grew together, registered nodes went silent
// past the heartbeat timeout and were declared lost, and registered again,
// which fed the storm (3,850 such losses in one 10,000-node run of make
// bench-scale). Beyond the limit a connection waits its turn, in arrival
// order and without using CPU, and the registered agents keep theirs. The
// agents' side waits with it: each handshake needs the server's answer.
type handshakeGate struct {
	slots   chan struct{}
	clock   clockwork.Clock
	waiting prometheus.Gauge
	refused prometheus.Counter
}

func newHandshakeGate(limit int, clock clockwork.Clock, waiting prometheus.Gauge, refused prometheus.Counter) *handshakeGate {
	return &handshakeGate{slots: make(chan struct{}, limit), clock: clock, waiting: waiting, refused: refused}
}

// enter takes a turn, waiting up to handshakeQueueWait for one.
func (g *handshakeGate) enter() error {
	select {
	case g.slots <- struct{}{}:
		return nil
	default:
	}
	g.waiting.Inc()
	defer g.waiting.Dec()
	t := g.clock.NewTimer(handshakeQueueWait)
	defer t.Stop()
	// Blocked senders on a channel are served in the order they came.
	select {
	case g.slots <- struct{}{}:
		return nil
	case <-t.Chan():
		g.refused.Inc()
		return errHandshakeQueueFull
	}
}

func (g *handshakeGate) leave() { <-g.slots }

// gatedCreds runs each server handshake of creds in a turn of gate.
type gatedCreds struct {
	credentials.TransportCredentials
	gate *handshakeGate
}

func (c gatedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if err := c.gate.enter(); err != nil {
		return nil, nil, fmt.Errorf("tls handshake with %s: %w", raw.RemoteAddr(), err)
	}
	defer c.gate.leave()
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
