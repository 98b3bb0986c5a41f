package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// readiness says why the controller is not ready; nil when it is.
func (c *Controller) readiness() error {
	if c.stopping.Load() {
		return errors.New("shutting down")
	}
	if c.leading.Load() {
		return nil
	}
	v := c.view.Load()
	switch {
	case v == nil:
		return errors.New("starting: etcd not reached yet")
	case v.etcdErr != "":
		return fmt.Errorf("etcd unreachable: %s", v.etcdErr)
	}
	if err := c.etcdDown.Load(); err != nil {
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
func (c *Controller) probeEtcd(ctx context.Context) {
	for {
		rctx, cancel := context.WithTimeout(ctx, c.cfg.Etcd.RequestTimeout.Duration)
		_, err := c.store.Client().Get(rctx, store.CandidatesPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.etcdDown.Store(&err)
		} else {
			c.etcdDown.Store(nil)
		}
		c.refreshHealth()
		c.sleep(ctx, etcdProbeEvery)
	}
}

// refreshHealth brings the gRPC health status in line with readiness;
// called wherever leading or the leader view changes. It does no I/O.
func (c *Controller) refreshHealth() {
	st := healthpb.HealthCheckResponse_SERVING
	if c.readiness() != nil {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	c.grpcHealth.SetServingStatus("", st)
}

func newGRPCHealth() *grpchealth.Server {
	s := grpchealth.NewServer()
	s.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	return s
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
