package controller

import (
	"context"
	"fmt"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/rdzv/rdzv/wire"
)

// leaderView is what a controller knows about who leads, for telling
// clients where to go.
type leaderView struct {
	// addr is the advertised address of the current leader ("" if none).
	addr string
	// etcdErr is set while etcd cannot be read: no one can lead.
	etcdErr string
	// previous is the last other controller seen leading, for the record
	// of a takeover.
	previous string
}

// leaderGate is whether this controller leads and who does as last seen
// in etcd: the API serves only while it leads, and a follower tells
// clients where the leader is. Its state is atomics: the lead sets on,
// watchLeader and the election set the view, and every call reads both.
type leaderGate struct {
	// me is this controller's advertised address.
	me string
	// changed is told of every change, after it (the readiness probes);
	// set before any goroutine uses the gate, and does no I/O.
	changed func()

	// on is set while this controller leads and has its view loaded.
	on atomic.Bool
	// view is nil until etcd was first read or failed.
	view atomic.Pointer[leaderView]
}

func newLeaderGate(me string) *leaderGate { return &leaderGate{me: me, changed: func() {}} }

// leading reports whether this controller leads and serves the API.
func (g *leaderGate) leading() bool { return g.on.Load() }

// setLeading records that the lead began (view loaded) or ended.
func (g *leaderGate) setLeading(on bool) {
	g.on.Store(on)
	g.changed()
}

// seen is who leads as last seen; ok is false until etcd was first read
// or failed.
func (g *leaderGate) seen() (v leaderView, ok bool) {
	if p := g.view.Load(); p != nil {
		return *p, true
	}
	return leaderView{}, false
}

// setView records who leads as read from etcd (which answered).
func (g *leaderGate) setView(v leaderView) {
	g.view.Store(&v)
	g.changed()
}

// setEtcdErr records that etcd failed (nil: that it answered).
func (g *leaderGate) setEtcdErr(err error) {
	v, _ := g.seen()
	v.etcdErr = ""
	if err != nil {
		v.etcdErr = err.Error()
	}
	g.setView(v)
}

// check refuses every call while this controller does not lead, telling
// the client where the leader is when it knows.
func (g *leaderGate) check() error {
	if g.leading() {
		return nil
	}
	v, _ := g.seen()
	switch {
	case v.etcdErr != "":
		return wire.Error(wire.ReasonEtcdUnavailable, "", fmt.Sprintf(
			"etcd unavailable (no quorum?): no controller can lead, changes are refused; running jobs continue: %s", v.etcdErr))
	case v.addr != "" && v.addr != g.me:
		return wire.Error(wire.ReasonNotLeader, v.addr, fmt.Sprintf("controller %s is a follower; the leader is %s", g.me, v.addr))
	}
	return wire.Error(wire.ReasonNoLeader, "", fmt.Sprintf("controller %s does not lead yet (election or start-up under way); retry", g.me))
}

// unary is check as a unary interceptor; public methods pass.
func (g *leaderGate) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if publicMethod(info.FullMethod) {
		return handler(ctx, req)
	}
	if err := g.check(); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// stream is check as a stream interceptor; public methods pass.
func (g *leaderGate) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if publicMethod(info.FullMethod) {
		return handler(srv, ss)
	}
	if err := g.check(); err != nil {
		return err
	}
	return handler(srv, ss)
}
