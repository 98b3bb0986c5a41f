package controller_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rdzv/rdzv/controller/keyring"
	"github.com/rdzv/rdzv/internal/testaddr"
	"github.com/rdzv/rdzv/internal/testetcd"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// exposition is one scrape of /metrics, parsed.
type exposition map[string]*dto.MetricFamily

// scrape fetches and parses http://addr/metrics.
func scrape(t *testing.T, addr string) exposition {
	t.Helper()
	resp, err := (&http.Client{Timeout: waitTimeout}).Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return families
}

// series is the metric of family name whose labels include labels (pairs
// of name and value); it fails the test when there is none.
func (e exposition) series(t *testing.T, name string, labels ...string) *dto.Metric {
	t.Helper()
	f := e[name]
	require.NotNil(t, f, "no metric %s", name)
	for _, m := range f.GetMetric() {
		if hasLabels(m, labels) {
			return m
		}
	}
	require.FailNow(t, "no such series", "%s%v", name, labels)
	return nil
}

// has reports whether there is a series of name with labels.
func (e exposition) has(name string, labels ...string) bool {
	for _, m := range e[name].GetMetric() {
		if hasLabels(m, labels) {
			return true
		}
	}
	return false
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func (e exposition) gauge(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return e.series(t, name, labels...).GetGauge().GetValue()
}

func (e exposition) counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return e.series(t, name, labels...).GetCounter().GetValue()
}

func (e exposition) observations(t *testing.T, name string, labels ...string) uint64 {
	t.Helper()
	return e.series(t, name, labels...).GetHistogram().GetSampleCount()
}

// httpAddr is the cluster's controller's metrics address.
func (c *cluster) httpAddr() string {
	s := c.ctl.HTTP()
	require.NotNil(c.t, s, "the controller's http listener is off")
	return s.Addr().String()
}

func getStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := (&http.Client{Timeout: waitTimeout}).Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// A job through a worker failure and its recovery moves the counters and
// the recovery histograms, and the gauges follow the nodes and the job.
func TestMetricsThroughFailureAndRecovery(t *testing.T) {
	c := newCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	m := scrape(t, c.httpAddr())
	require.Equal(t, 1.0, m.gauge(t, "rdzv_leader"))
	require.Equal(t, 2.0, m.gauge(t, "rdzv_nodes", "state", "ready"))
	require.Zero(t, m.counter(t, "rdzv_rendezvous_rounds_total"))
	require.Zero(t, m.counter(t, "rdzv_attempts_failed_total", "reason", "worker_exit"), "every cause is exported from the start")
	require.Positive(t, m.gauge(t, "rdzv_certificate_expiry_seconds", "cert", "controller"))

	c.startJob(c.recoverable("train", 2, 3))
	a1, b1 := a.run(), b.run()
	c.waitJob("train", func(j *rdzvv1.Job) bool {
		return j.GetAssignments()[1].GetState() == rdzvv1.WorkerState_WORKER_STATE_RUNNING
	})
	a.step(a1, 5)
	a.checkpoint(a1, 10, "/ckpt/train/step-10")
	c.waitJob("train", func(j *rdzvv1.Job) bool { return j.GetLatestCheckpoint().GetStep() == 10 })
	m = scrape(t, c.httpAddr())
	require.Equal(t, 2.0, m.gauge(t, "rdzv_nodes", "state", "busy"))
	require.Zero(t, m.gauge(t, "rdzv_nodes", "state", "ready"))
	require.Equal(t, 1.0, m.gauge(t, "rdzv_jobs", "state", "running"))
	require.Equal(t, 1.0, m.counter(t, "rdzv_rendezvous_rounds_total"))
	require.Equal(t, 1.0, m.counter(t, "rdzv_checkpoints_recorded_total"))
	require.Equal(t, 5.0, m.gauge(t, "rdzv_job_step", "job_name", "train"))
	require.Equal(t, 1.0, m.gauge(t, "rdzv_job_effective_training_ratio", "job_name", "train"), "no recovery yet")

	a.report(a1, rdzvv1.WorkerState_WORKER_STATE_FAILED, 1)
	c.waitJobState("train", recovering)
	b.expectStop(b1)
	a2, b2 := a.run(), b.run()
	require.Equal(t, uint64(2), a2.GetGeneration())
	c.waitJob("train", func(j *rdzvv1.Job) bool { return j.GetState() == running })
	a.step(a2, 11)
	c.waitJob("train", func(j *rdzvv1.Job) bool { return j.GetRecoveryStartedAt() == nil && j.GetStep() == 11 })
	// Two heartbeats of one stream make an interval, whatever keepAlive's
	// ticker did meanwhile.
	a.heartbeat(1001)
	a.heartbeat(1002)

	m = scrape(t, c.httpAddr())
	require.Equal(t, 2.0, m.counter(t, "rdzv_rendezvous_rounds_total"))
	require.Equal(t, 1.0, m.counter(t, "rdzv_attempts_failed_total", "reason", "worker_exit"))
	require.Zero(t, m.counter(t, "rdzv_attempts_failed_total", "reason", "node_lost"))
	require.Equal(t, 1.0, m.counter(t, "rdzv_job_restarts_total", "reason", "worker_exit"))
	require.Equal(t, uint64(1), m.observations(t, "rdzv_failure_detection_seconds", "reason", "worker_exit"))
	require.Equal(t, uint64(1), m.observations(t, "rdzv_recovery_rendezvous_seconds"))
	require.Equal(t, uint64(1), m.observations(t, "rdzv_recovery_first_step_seconds"))
	require.Equal(t, uint64(1), m.observations(t, "rdzv_recovery_seconds"))
	require.Equal(t, 2.0, m.gauge(t, "rdzv_job_generation", "job_name", "train"))
	require.Equal(t, 11.0, m.gauge(t, "rdzv_job_step", "job_name", "train"))
	ratio := m.gauge(t, "rdzv_job_effective_training_ratio", "job_name", "train")
	require.Less(t, ratio, 1.0, "the recovery counts against the job")
	require.Positive(t, ratio)
	require.Equal(t, 2.0, m.gauge(t, "rdzv_connected_agents"))
	require.Positive(t, m.observations(t, "rdzv_heartbeat_interval_seconds"))
	require.Positive(t, m.observations(t, "rdzv_etcd_request_duration_seconds", "method", "/etcdserverpb.KV/Txn"))
	require.GreaterOrEqual(t, m.counter(t, "grpc_server_started_total", "grpc_method", "Connect"), 2.0)

	a.report(a2, rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED, 0)
	b.report(b2, rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED, 0)
	c.waitJobState("train", succeeded)
	c.waitIdle("node-a", "node-b")
	m = scrape(t, c.httpAddr())
	require.Equal(t, 1.0, m.counter(t, "rdzv_jobs_finished_total", "state", "succeeded"))
	require.Equal(t, 1.0, m.gauge(t, "rdzv_jobs", "state", "succeeded"))
	require.Equal(t, 2.0, m.gauge(t, "rdzv_nodes", "state", "ready"))
	require.False(t, m.has("rdzv_job_step", "job_name", "train"), "a finished job's series are gone")
	for _, source := range []string{"memory", "durable"} {
		require.Zero(t, m.counter(t, "rdzv_resumes_total", "source", source), "a job without checkpoint.memory resumes from neither")
	}
}

// /healthz, /readyz and grpc.health.v1: the latter answers a caller
// without a certificate (load balancers have none), and says NOT_SERVING
// when the controller shuts down.
func TestHealth(t *testing.T) {
	c := newCluster(t)
	code, _ := getStatus(t, "http://"+c.httpAddr()+"/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body := getStatus(t, "http://"+c.httpAddr()+"/readyz")
	require.Equal(t, http.StatusOK, code, body)

	hc := healthpb.NewHealthClient(c.dialRaw(nil))
	resp, err := hc.Check(rpcCtx(t), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.GetStatus())
	// Other methods still need a certificate.
	_, err = rdzvv1.NewJobServiceClient(c.dialRaw(nil)).ListJobs(rpcCtx(t), &rdzvv1.ListJobsRequest{})
	require.Error(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	watch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	first, err := watch.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, first.GetStatus())
	stopped := make(chan struct{})
	go func() { c.stopController(); close(stopped) }()
	next, err := watch.Recv()
	require.NoError(t, err, "told before the stream ends")
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, next.GetStatus())
	select {
	case <-stopped:
	case <-time.After(waitTimeout):
		require.FailNow(t, "controller did not stop")
	}
}

// healthOf asks addr's grpc.health.v1 without a client certificate.
func healthOf(t *testing.T, c *cluster, addr string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(c.ca.Cert)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "127.0.0.1"})))
	require.NoError(t, err)
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(rpcCtx(t), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	return resp.GetStatus()
}

// A follower with etcd is ready (it answers, redirecting clients); without
// etcd no replica is, and each says why.
func TestReadinessOfFollowers(t *testing.T) {
	endpoint, stopEtcd := testetcd.Start(t, "ha-test")
	c := &cluster{t: t}
	c.log = testLogger(t)
	c.newCA()
	h := &haCluster{cluster: c, etcd: endpoint, keys: filepath.Join(t.TempDir(), "secrets.key")}
	require.NoError(t, keyring.Create(h.keys, time.Now()))
	for range 2 {
		h.replicas = append(h.replicas, h.startReplica(testaddr.Free(t)))
	}
	lead := h.leader()
	follower := h.replicas[0]
	if follower == lead {
		follower = h.replicas[1]
	}
	for _, r := range []*replica{lead, follower} {
		// A follower is ready once it has read who leads.
		poll(t, func() bool {
			code, _ := getStatus(t, "http://"+r.ctl.HTTP().Addr().String()+"/readyz")
			return code == http.StatusOK
		}, func() string { return r.addr + " never ready" })
		require.Equal(t, healthpb.HealthCheckResponse_SERVING, healthOf(t, c, r.addr))
	}
	require.Equal(t, 1.0, scrape(t, lead.ctl.HTTP().Addr().String()).gauge(t, "rdzv_leader"))
	require.Zero(t, scrape(t, follower.ctl.HTTP().Addr().String()).gauge(t, "rdzv_leader"))

	stopEtcd()
	for _, r := range []*replica{lead, follower} {
		poll(t, func() bool {
			code, body := getStatus(t, "http://"+r.ctl.HTTP().Addr().String()+"/readyz")
			return code == http.StatusServiceUnavailable && strings.Contains(body, "etcd unreachable")
		}, func() string { return r.addr + " still ready without etcd" })
		require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, healthOf(t, c, r.addr))
	}
}

// An agent's metrics follow its workers, its connection and the requests
// to its report endpoint.
func TestAgentMetrics(t *testing.T) {
	c := newCluster(t)
	ra := c.addAgent("node-a", 2, nil)
	addr := ra.agent.HTTP().Addr().String()
	// The controller lists the node ready before the agent has read its
	// answer.
	poll(t, func() bool { return scrape(t, addr).gauge(t, "rdzv_agent_connected") == 1 }, func() string { return "the agent never said it was connected" })
	m := scrape(t, addr)
	require.Zero(t, m.gauge(t, "rdzv_agent_via_relay"), "connected directly")
	require.Equal(t, 2.0, m.gauge(t, "rdzv_agent_gpus"))
	require.Zero(t, m.gauge(t, "rdzv_agent_workers_running"))
	require.Zero(t, m.counter(t, "rdzv_agent_gpu_faults_total", "gpu", "1", "critical", "true"), "every GPU's faults are exported from the start")

	c.startJob(c.spec("gated", 1, 1, "gate"))
	c.waitRunning("gated")
	require.Equal(t, 1.0, scrape(t, addr).gauge(t, "rdzv_agent_workers_running"))

	// A report without the generation's token is refused.
	report, err := os.ReadFile(filepath.Join(ra.stateDir, "report.addr"))
	require.NoError(t, err)
	resp, err := (&http.Client{Timeout: waitTimeout}).Post("http://"+string(report)+"/v1/step", "application/json",
		strings.NewReader(`{"job": "gated", "generation": 1, "step": 1}`))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	c.release("gated")
	c.waitJobState("gated", succeeded)
	c.waitIdle("node-a")
	m = scrape(t, addr)
	require.Equal(t, 1.0, m.counter(t, "rdzv_agent_report_requests_total", "code", "401"))
	require.Equal(t, 1.0, m.counter(t, "rdzv_agent_worker_exits_total", "cause", "succeeded"))
	require.Zero(t, m.counter(t, "rdzv_agent_worker_exits_total", "cause", "failed"))
	require.Zero(t, m.gauge(t, "rdzv_agent_workers_running"))
	require.GreaterOrEqual(t, m.gauge(t, "rdzv_agent_gossip_members_alive"), 1.0)

	code, _ := getStatus(t, "http://"+addr+"/readyz")
	require.Equal(t, http.StatusOK, code)
	c.stopController()
	poll(t, func() bool {
		code, _ := getStatus(t, "http://"+addr+"/readyz")
		return code == http.StatusServiceUnavailable
	}, func() string { return "the agent is still ready without a controller" })
	require.Zero(t, scrape(t, addr).gauge(t, "rdzv_agent_connected"))
}

// A node that goes silent mid-job is counted lost, and its job's failure
// is a node_lost one.
func TestMetricsNodeLost(t *testing.T) {
	c := newCluster(t)
	a, b := c.connectFake("node-a"), c.connectFake("node-b")
	a.keepAlive()
	b.keepAlive()
	c.startJob(c.recoverable("train", 2, 3))
	a.run()
	b.run()
	c.waitRunning("train")
	b.crash()
	c.waitNode("node-b", func(n *rdzvv1.Node) bool { return n.GetState() == rdzvv1.NodeState_NODE_STATE_LOST })
	c.waitJobState("train", recovering)

	m := scrape(t, c.httpAddr())
	require.Equal(t, 1.0, m.counter(t, "rdzv_nodes_lost_total"))
	require.Equal(t, 1.0, m.gauge(t, "rdzv_nodes", "state", "lost"))
	require.Equal(t, 1.0, m.counter(t, "rdzv_attempts_failed_total", "reason", "node_lost"))
	require.Zero(t, m.counter(t, "rdzv_attempts_failed_total", "reason", "worker_exit"))
	require.Equal(t, uint64(1), m.observations(t, "rdzv_failure_detection_seconds", "reason", "node_lost"))
	require.Equal(t, 1.0, m.gauge(t, "rdzv_jobs", "state", "recovering"))
	require.Equal(t, 1.0, m.gauge(t, "rdzv_connected_agents"))
}
