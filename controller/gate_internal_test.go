package controller

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rdzv/rdzv/wire"
)

// The gate serves only while leading; otherwise it says why, naming the
// leader when it knows another one.
func TestLeaderGateCheck(t *testing.T) {
	const me = "10.0.0.1:7070"
	tests := []struct {
		name       string
		leading    bool
		view       *leaderView
		etcdErr    error
		wantReason string // "": served
		wantLeader string
	}{
		{name: "leading", leading: true, view: &leaderView{addr: me}},
		{name: "leading while etcd fails", leading: true, etcdErr: errors.New("no quorum")},
		{name: "etcd never read", wantReason: wire.ReasonNoLeader},
		{name: "etcd unavailable", view: &leaderView{addr: "10.0.0.2:7070"}, etcdErr: errors.New("no quorum"), wantReason: wire.ReasonEtcdUnavailable},
		{name: "follower", view: &leaderView{addr: "10.0.0.2:7070"}, wantReason: wire.ReasonNotLeader, wantLeader: "10.0.0.2:7070"},
		{name: "no one leads", view: &leaderView{}, wantReason: wire.ReasonNoLeader},
		{name: "won but not loaded yet", view: &leaderView{addr: me}, wantReason: wire.ReasonNoLeader},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newLeaderGate(me)
			if tt.view != nil {
				g.setView(*tt.view)
			}
			if tt.etcdErr != nil {
				g.setEtcdErr(tt.etcdErr)
			}
			g.setLeading(tt.leading)
			err := g.check()
			if tt.wantReason == "" {
				require.NoError(t, err)
				return
			}
			reason, leader, ok := wire.Parse(err)
			require.True(t, ok, "a refusal clients follow: %v", err)
			require.Equal(t, tt.wantReason, reason)
			require.Equal(t, tt.wantLeader, leader)
		})
	}
}

// A failed read of etcd keeps the last leader seen, and the next success
// clears the error.
func TestLeaderGateEtcdErr(t *testing.T) {
	g := newLeaderGate("a:1")
	changes := 0
	g.changed = func() { changes++ }
	_, ok := g.seen()
	require.False(t, ok)
	g.setView(leaderView{addr: "b:1", previous: "b:1"})
	g.setEtcdErr(errors.New("timeout"))
	v, ok := g.seen()
	require.True(t, ok)
	require.Equal(t, leaderView{addr: "b:1", previous: "b:1", etcdErr: "timeout"}, v)
	g.setEtcdErr(nil)
	v, _ = g.seen()
	require.Equal(t, leaderView{addr: "b:1", previous: "b:1"}, v)
	g.setLeading(true)
	require.Equal(t, 4, changes, "every change is told")
}

// Health checks pass the gate of a follower; everything else is refused.
func TestLeaderGateInterceptors(t *testing.T) {
	g := newLeaderGate("a:1")
	g.setView(leaderView{addr: "b:1"})
	handled := func(context.Context, any) (any, error) { return "ok", nil }
	for method, wantServed := range map[string]bool{
		healthpb.Health_Check_FullMethodName:     true,
		"/rdzv.v1.JobService/SubmitJob":          false,
		"/rdzv.v1.AgentService/Connect":          false,
		healthpb.Health_Watch_FullMethodName:     true,
		"/rdzv.v1.CertificateService/RevokeCert": false,
	} {
		_, err := g.unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: method}, handled)
		serr := g.stream(nil, nil, &grpc.StreamServerInfo{FullMethod: method}, func(any, grpc.ServerStream) error { return nil })
		if wantServed {
			require.NoError(t, err, method)
			require.NoError(t, serr, method)
			continue
		}
		reason, _, _ := wire.Parse(err)
		require.Equal(t, wire.ReasonNotLeader, reason, method)
		reason, _, _ = wire.Parse(serr)
		require.Equal(t, wire.ReasonNotLeader, reason, method)
	}
}

// A tenure steps down once, keeps the first reason, and is deaf once over.
func TestTenureStepDown(t *testing.T) {
	g := newLeaderGate("a:1")
	ended := 0
	tn := &tenure{term: 1, gate: g, log: zaptest.NewLogger(t), end: func() { ended++ }}
	g.setLeading(true)
	tn.writeFailed("put job x", errors.New("etcd refused"))
	require.False(t, g.leading(), "stops serving at once")
	tn.stepDown("later")
	require.Equal(t, 2, ended)
	require.Equal(t, "put job x: etcd refused", tn.close(), "the first reason")

	tn = &tenure{term: 2, gate: g, log: zaptest.NewLogger(t), end: func() { ended++ }}
	g.setLeading(true)
	require.Empty(t, tn.close(), "lost, not stepped down")
	require.False(t, g.leading())
	ended = 0
	g.setLeading(true) // a later lead's
	tn.writeFailed("late write", context.Canceled)
	require.Zero(t, ended, "an ended tenure never ends another lead")
	require.True(t, g.leading())
}

// Readiness: ready while leading, or following with etcd answering.
func TestProbeReadiness(t *testing.T) {
	down := errors.New("connection refused")
	tests := []struct {
		name     string
		leading  bool
		view     *leaderView
		etcdDown error
		stopping bool
		wantErr  string // "": ready
	}{
		{name: "starting", wantErr: "starting: etcd not reached yet"},
		{name: "leading", leading: true},
		{name: "following", view: &leaderView{addr: "b:1"}},
		{name: "no leader, etcd up", view: &leaderView{}},
		{name: "etcd read failed", view: &leaderView{etcdErr: "no quorum"}, wantErr: "etcd unreachable: no quorum"},
		{name: "etcd probe failed", view: &leaderView{addr: "b:1"}, etcdDown: down, wantErr: "etcd unreachable: connection refused"},
		{name: "leading, probe failed", leading: true, etcdDown: down},
		{name: "stopping", leading: true, stopping: true, wantErr: "shutting down"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newLeaderGate("a:1")
			p := newProbe(g, clockwork.NewFakeClock(), time.Second)
			g.changed = p.refresh
			if tt.view != nil {
				g.setView(*tt.view)
			}
			if tt.etcdDown != nil {
				p.etcdDown.Store(&tt.etcdDown)
			}
			g.setLeading(tt.leading)
			if tt.stopping {
				p.stop()
			}
			err := p.readiness()
			if tt.wantErr == "" {
				require.NoError(t, err)
			} else {
				require.EqualError(t, err, tt.wantErr)
			}
			if tt.stopping {
				return // the health server answers NOT_SERVING for good
			}
			resp, err := p.health.Check(context.Background(), &healthpb.HealthCheckRequest{})
			require.NoError(t, err)
			want := healthpb.HealthCheckResponse_SERVING
			if tt.wantErr != "" {
				want = healthpb.HealthCheckResponse_NOT_SERVING
			}
			require.Equal(t, want, resp.GetStatus())
		})
	}
}
