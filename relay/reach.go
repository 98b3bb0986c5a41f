package relay

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"time"
)

// How the relay tells a controller that is down from one it is cut off
// from (reach).
const (
	// probeTimeout bounds one probe: a host that neither accepts nor
	// refuses a connection by then is taken as cut off.
	probeTimeout = 2 * time.Second
	// probeEvery is how long a probe's answer stands; the relay's held
	// agents share it.
	probeEvery = time.Second
)

// dialer opens a TCP connection; net.Dialer's DialContext, or a test's.
type dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// reach says whether the controllers' hosts answer at all. While no
// controller serves, the relay holds its agents if one does, and sends
// them around itself if none does:
//   - a controller that is restarting, failing over or waiting for etcd
//     refuses the connection or accepts it: the relay's agents would find
//     it no better directly, and going around would bring each of them to
//     it with a handshake of its own, all at once, the moment it serves;
//   - a host that answers nothing is down, or cut off from the relay: its
//     agents may still reach a controller directly, and must, before
//     their nodes are declared lost.
type reach struct {
	addrs []string
	dial  dialer

	mu sync.Mutex
	at time.Time
	ok bool
}

// reachable probes the controllers, at most once per probeEvery, and says
// whether any of them answered.
func (r *reach) reachable(ctx context.Context) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && time.Since(r.at) < probeEvery {
		return r.ok
	}
	r.ok, r.at = r.probe(ctx), time.Now()
	return r.ok
}

// probe dials every controller at once; any that accepts or refuses the
// connection answers.
func (r *reach) probe(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	answered := make(chan bool, len(r.addrs))
	for _, addr := range r.addrs {
		go func() {
			conn, err := r.dial(ctx, "tcp", addr)
			if err == nil {
				_ = conn.Close()
			}
			answered <- err == nil || errors.Is(err, syscall.ECONNREFUSED)
		}()
	}
	ok := false
	for range r.addrs {
		ok = <-answered || ok
	}
	return ok
}
