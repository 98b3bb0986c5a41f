package controller

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	clientv3 "go.etcd.io/etcd/client/v3"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/internal/httpserve"
)

// A controller is ready (HTTP /readyz, gRPC grpc.health.v1 SERVING) while
// it leads, or stands by with etcd reachable: either way it answers
// clients usefully (a follower redirects them to the leader). It is not
// while it starts, while etcd cannot be read (no controller can lead
// then), and once it shuts down.

// probe is the controller's readiness, served by the HTTP /readyz and
// grpc.health.v1. Its own state is atomics and the health server (safe
// for concurrent use): probeEtcd sets etcdDown, Run's end sets stopping,
// and whoever changes the gate's state refreshes it.
type probe struct {
	gate  *leaderGate
	clock clockwork.Clock
	// timeout bounds each probe of etcd.
	timeout time.Duration

	health   *grpchealth.Server
	stopping atomic.Bool
	// etcdDown is why etcd did not answer the last probe; nil when it did.
	etcdDown atomic.Pointer[error]
}

func newProbe(gate *leaderGate, clock clockwork.Clock, timeout time.Duration) *probe {
	p := &probe{gate: gate, clock: clock, timeout: timeout, health: grpchealth.NewServer()}
	p.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	return p
}

// readiness says why the controller is not ready; nil when it is.
func (p *probe) readiness() error {
	if p.stopping.Load() {
		return errors.New("shutting down")
	}
	if p.gate.leading() {
		return nil
	}
	v, ok := p.gate.seen()
	switch {
	case !ok:
		return errors.New("starting: etcd not reached yet")
	case v.etcdErr != "":
		return fmt.Errorf("etcd unreachable: %s", v.etcdErr)
	}
	if err := p.etcdDown.Load(); err != nil {
		return fmt.Errorf("etcd unreachable: %w", *err)
	}
	return nil
}

// etcdProbeEvery is how often a controller asks etcd whether it answers.
// A follower otherwise only waits on a watch and its lease's keepalive,
// neither of which fails when etcd is gone altogether.
const etcdProbeEvery = 2 * time.Second

// probeEtcd keeps etcdDown current until ctx ends: a cheap count of the
// election's candidates.
func (p *probe) probeEtcd(ctx context.Context, cli *clientv3.Client) {
	for {
		rctx, cancel := context.WithTimeout(ctx, p.timeout)
		_, err := cli.Get(rctx, store.CandidatesPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			p.etcdDown.Store(&err)
		} else {
			p.etcdDown.Store(nil)
		}
		p.refresh()
		sleep(ctx, p.clock, etcdProbeEvery)
	}
}

// refresh brings the gRPC health status in line with readiness; called
// wherever an input of readiness changes. It does no I/O.
func (p *probe) refresh() {
	st := healthpb.HealthCheckResponse_SERVING
	if p.readiness() != nil {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	p.health.SetServingStatus("", st)
}

// stop makes the controller unready for good, as it shuts down.
func (p *probe) stop() {
	p.stopping.Store(true)
	p.health.Shutdown()
}

// sleep waits d on clock, or until ctx ends.
func sleep(ctx context.Context, clock clockwork.Clock, d time.Duration) {
	timer := clock.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.Chan():
	}
}

// publicMethod reports whether method is answered to anyone, without a
// client certificate and on a follower too: grpc.health.v1, which load
// balancers and orchestrators probe without the cluster's certificates.
// It only says SERVING or NOT_SERVING, which the HTTP /readyz tells
// anyone who reaches that listener as well; the connection is still TLS.
func publicMethod(method string) bool {
	return method == healthpb.Health_Check_FullMethodName || method == healthpb.Health_Watch_FullMethodName
}

// HTTP is the metrics and health listener, nil when http.listen is empty.
// Handlers mounted with its Handle before Run are served beside
// /metrics, /healthz and /readyz (the dashboard, for instance); its Addr is
// valid once Ready is closed.
func (c *Controller) HTTP() *httpserve.Server { return c.http }
