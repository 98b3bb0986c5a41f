package controller

import (
	"context"
	"strings"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/rdzv/rdzv/controller/lifecycle"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Metrics (docs/monitoring.md). Counters and histograms move where the
// controller decides, under c.mu, at the cost of an atomic add; gauges are
// computed when Prometheus scrapes, from a snapshot taken under c.mu, so
// that nothing on the hot paths keeps them up to date. No series is per
// node: on a large cluster that would be the bulk of a scrape. Per-job series
// are bounded by limits.max_active_jobs and vanish with the job; their
// label is job_name, since Prometheus sets job to the scrape job's name.

// Failure causes, the reason label of the attempt and restart counters and
// of the detection histogram.
const (
	causeWorkerExit = "worker_exit"
	causeNodeLost   = "node_lost"
	causeHang       = "hang"
	causeGPUFault   = "gpu_fault"
	// A critical node health check failed under the job (nodehealth.go).
	causeHealthCheck = "health_check"
	// An operator drained the node with --now (drain.go).
	causeDrain = "drain"
)

var failureCauses = []string{causeWorkerExit, causeNodeLost, causeHang, causeGPUFault, causeHealthCheck, causeDrain}

// recoveryBuckets cover a fast restart (a second) to a slow one (minutes:
// a large job's rendezvous and `import torch` on every node).
var recoveryBuckets = []float64{0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600}

type metrics struct {
	rounds         prometheus.Counter
	attemptsFailed *prometheus.CounterVec
	restarts       *prometheus.CounterVec
	jobsFinished   *prometheus.CounterVec
	nodesLost      prometheus.Counter
	checkpoints    prometheus.Counter
	grows          prometheus.Counter
	resumes        *prometheus.CounterVec
	detection      *prometheus.HistogramVec
	failedToCommit prometheus.Histogram
	commitToStep   prometheus.Histogram
	recovery       prometheus.Histogram
	heartbeatGap   prometheus.Histogram
	etcdDuration   *prometheus.HistogramVec
	etcdErrors     *prometheus.CounterVec
	handshakesWait prometheus.Gauge
	handshakesOver prometheus.Counter
	grpc           *grpcprom.ServerMetrics
}

func newMetrics() *metrics {
	m := &metrics{
		rounds: prometheus.NewCounter(prometheus.CounterOpts{Name: "rdzv_rendezvous_rounds_total",
			Help: "Rendezvous rounds committed (a job's first start and each restart)."}),
		attemptsFailed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdzv_attempts_failed_total",
			Help: "Generations of a running job that failed, by cause; each is restarted or fails the job."}, []string{"reason"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdzv_job_restarts_total",
			Help: "Failed generations that were restarted (not failing the job), by cause."}, []string{"reason"}),
		jobsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdzv_jobs_finished_total",
			Help: "Jobs that reached a terminal state, by state (succeeded, failed, stopped)."}, []string{"state"}),
		nodesLost: prometheus.NewCounter(prometheus.CounterOpts{Name: "rdzv_nodes_lost_total",
			Help: "Times a node was declared lost."}),
		checkpoints: prometheus.NewCounter(prometheus.CounterOpts{Name: "rdzv_checkpoints_recorded_total",
			Help: "Complete checkpoints recorded in jobs' catalogs."}),
		grows: prometheus.NewCounter(prometheus.CounterOpts{Name: "rdzv_job_grows_total",
			Help: "Generations stopped right after a checkpoint (or a replicated in-memory step) to restart the job on more nodes (nodes.grow)."}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdzv_resumes_total",
			Help: "Restarted generations of jobs with checkpoint.memory, by source: memory (an in-memory step the nodes held) or durable (the fallback)."},
			[]string{"source"}),
		detection: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rdzv_failure_detection_seconds",
			Help:    "From a fault (worker exit, last heartbeat, last step plus progress_timeout, GPU event) to the attempt_failed decision, by cause.",
			Buckets: recoveryBuckets}, []string{"reason"}),
		failedToCommit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rdzv_recovery_rendezvous_seconds",
			Help:    "From attempt_failed to the commit of the next generation's rendezvous (fencing, backoff, last call).",
			Buckets: recoveryBuckets}),
		commitToStep: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rdzv_recovery_first_step_seconds",
			Help:    "From a restarted generation's rendezvous commit to its first training step report.",
			Buckets: recoveryBuckets}),
		recovery: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rdzv_recovery_seconds",
			Help:    "From a fault to training again (the restarted generation's first step, or all its workers running for jobs that report no steps).",
			Buckets: recoveryBuckets}),
		heartbeatGap: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rdzv_heartbeat_interval_seconds",
			Help: "Time between consecutive heartbeats of an agent as the controller receives them; " +
				"beyond heartbeat.interval it is network or agent delay (the controller cannot time a round trip itself).",
			Buckets: []float64{0.25, 0.5, 0.9, 1, 1.1, 1.25, 1.5, 2, 3, 5, 10}}),
		etcdDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rdzv_etcd_request_duration_seconds",
			Help:    "etcd requests of the controller (reads, transactions, leases, election), by gRPC method.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"method"}),
		etcdErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdzv_etcd_request_errors_total",
			Help: "etcd requests of the controller that failed, by gRPC method (the log says why)."}, []string{"method"}),
		handshakesWait: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rdzv_tls_handshakes_waiting",
			Help: "Connections waiting for their turn to handshake (tls.max_handshakes are in flight)."}),
		handshakesOver: prometheus.NewCounter(prometheus.CounterOpts{Name: "rdzv_tls_handshakes_overflow_total",
			Help: "Connections that waited 15 s for a turn to handshake and went ahead without one: clients connected faster than the controller handshakes."}),
		grpc: grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram()),
	}
	// Every bounded label value exists from the start, at zero, so that
	// increase() sees the first failure and dashboards show a zero.
	for _, cause := range failureCauses {
		m.attemptsFailed.WithLabelValues(cause)
		m.restarts.WithLabelValues(cause)
		m.detection.WithLabelValues(cause)
	}
	for _, s := range []string{"succeeded", "failed", "stopped"} {
		m.jobsFinished.WithLabelValues(s)
	}
	for _, s := range []string{resumeSourceMemory, resumeSourceDurable} {
		m.resumes.WithLabelValues(s)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.rounds, m.attemptsFailed, m.restarts, m.jobsFinished, m.nodesLost, m.checkpoints, m.grows, m.resumes,
		m.detection, m.failedToCommit, m.commitToStep, m.recovery, m.heartbeatGap, m.etcdDuration, m.etcdErrors,
		m.handshakesWait, m.handshakesOver, m.grpc}
}

// etcdInterceptor times every unary etcd request of the client (watches
// are streams and last for ever; they are not timed).
func (m *metrics) etcdInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	start := time.Now()
	err := invoker(ctx, method, req, reply, cc, opts...)
	m.etcdDuration.WithLabelValues(method).Observe(time.Since(start).Seconds())
	// Looked up on success too: a method's error count exists, at zero,
	// from its first request, for rate() and alerts.
	errs := m.etcdErrors.WithLabelValues(method)
	if err != nil {
		errs.Inc()
	}
	return err
}

// finished counts a job reaching state.
func (m *metrics) finished(state rdzvv1.JobState) {
	switch state {
	case rdzvv1.JobState_JOB_STATE_SUCCEEDED:
		m.jobsFinished.WithLabelValues("succeeded").Inc()
	case rdzvv1.JobState_JOB_STATE_FAILED:
		m.jobsFinished.WithLabelValues("failed").Inc()
	case rdzvv1.JobState_JOB_STATE_STOPPED:
		m.jobsFinished.WithLabelValues("stopped").Inc()
	}
}

// stateCollector computes the gauges at scrape time.
type stateCollector struct{ c *Controller }

var (
	descNodes = prometheus.NewDesc("rdzv_nodes", "Nodes by state: ready (idle), busy (running or reserved for a job), cordoned (takes no new work), lost.",
		[]string{"state"}, nil)
	descJobs = prometheus.NewDesc("rdzv_jobs", "Jobs by state (pending, running, recovering, stopping, succeeded, failed, stopped).",
		[]string{"state"}, nil)
	descPendingAge = prometheus.NewDesc("rdzv_pending_job_oldest_age_seconds", "Age of the oldest pending job (0 when none is pending).", nil, nil)
	descLeader     = prometheus.NewDesc("rdzv_leader", "1 while this controller leads and serves the API, else 0.", nil, nil)
	descAgents     = prometheus.NewDesc("rdzv_connected_agents", "Agents with an open stream to this controller.", nil, nil)
	descRelayed    = prometheus.NewDesc("rdzv_relayed_agents", "Of the connected agents, those whose stream a relay carries.", nil, nil)
	descRelays     = prometheus.NewDesc("rdzv_connected_relays", "Relays with a call open to this controller, carrying their agents.", nil, nil)
	descCertExpiry = prometheus.NewDesc("rdzv_certificate_expiry_seconds",
		"Seconds until a certificate of the controller expires (cert: controller, its own; ca, the last of the cluster CA's).", []string{"cert"}, nil)
	descJobETTR = prometheus.NewDesc("rdzv_job_effective_training_ratio",
		"Per unfinished job: time training over time training plus recovering (1 before any failure).", []string{"job_name"}, nil)
	descJobStep = prometheus.NewDesc("rdzv_job_step", "Per unfinished job: the last training step reported.", []string{"job_name"}, nil)
	descJobGen  = prometheus.NewDesc("rdzv_job_generation", "Per unfinished job: its current generation (goes up by one per rendezvous).", []string{"job_name"}, nil)
)

func (s stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descNodes, descJobs, descPendingAge, descLeader, descAgents, descRelayed, descRelays, descCertExpiry, descJobETTR, descJobStep, descJobGen} {
		ch <- d
	}
}

// jobGauges is one unfinished job's gauges.
type jobGauges struct {
	name      string
	ettr      float64
	step, gen uint64
}

func (s stateCollector) Collect(ch chan<- prometheus.Metric) {
	c := s.c
	nodes := map[string]int{"ready": 0, "busy": 0, "cordoned": 0, "lost": 0}
	jobs := map[string]int{}
	for v := range rdzvv1.JobState_name {
		if v != 0 {
			jobs[jobStateLabel(rdzvv1.JobState(v))] = 0
		}
	}
	var agents, relayed int
	var oldest time.Time
	var perJob []jobGauges
	c.mu.Lock()
	now := c.clock.Now()
	for _, ns := range c.nodes {
		nodes[nodeStateLabel(ns)]++
		if ns.session != nil {
			agents++
			if ns.session.relayed {
				relayed++
			}
		}
	}
	relays := len(c.carriers)
	for name, js := range c.jobs {
		st := js.rec.GetState()
		jobs[jobStateLabel(st)]++
		if st == rdzvv1.JobState_JOB_STATE_PENDING {
			if at := js.rec.GetCreatedAt().AsTime(); oldest.IsZero() || at.Before(oldest) {
				oldest = at
			}
		}
		if lifecycle.Terminal(st) {
			continue
		}
		rec := &rdzvv1.Job{State: st, TrainingTime: js.rec.GetTrainingTime(), RecoveryTime: js.rec.GetRecoveryTime(),
			TrainingSince: js.rec.GetTrainingSince(), RecoveryStartedAt: js.rec.GetRecoveryStartedAt()}
		lifecycle.CloseInterval(rec, c.clock.Now())
		perJob = append(perJob, jobGauges{name: name, ettr: ettr(rec), step: js.rec.GetStep(), gen: js.rec.GetGeneration()})
	}
	c.mu.Unlock()

	for state, n := range nodes {
		ch <- prometheus.MustNewConstMetric(descNodes, prometheus.GaugeValue, float64(n), state)
	}
	for state, n := range jobs {
		ch <- prometheus.MustNewConstMetric(descJobs, prometheus.GaugeValue, float64(n), state)
	}
	var age float64
	if !oldest.IsZero() {
		age = max(now.Sub(oldest).Seconds(), 0)
	}
	ch <- prometheus.MustNewConstMetric(descPendingAge, prometheus.GaugeValue, age)
	leader := 0.0
	if c.gate.leading() {
		leader = 1
	}
	ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, leader)
	ch <- prometheus.MustNewConstMetric(descAgents, prometheus.GaugeValue, float64(agents))
	ch <- prometheus.MustNewConstMetric(descRelayed, prometheus.GaugeValue, float64(relayed))
	ch <- prometheus.MustNewConstMetric(descRelays, prometheus.GaugeValue, float64(relays))
	if tls := c.guard.tls; tls != nil {
		ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, tls.NotAfter().Sub(now).Seconds(), "controller")
		ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, tls.CANotAfter().Sub(now).Seconds(), "ca")
	}
	for _, j := range perJob {
		ch <- prometheus.MustNewConstMetric(descJobETTR, prometheus.GaugeValue, j.ettr, j.name)
		ch <- prometheus.MustNewConstMetric(descJobStep, prometheus.GaugeValue, float64(j.step), j.name)
		ch <- prometheus.MustNewConstMetric(descJobGen, prometheus.GaugeValue, float64(j.gen), j.name)
	}
}

// ettr is the effective training time ratio of a job whose open interval
// was closed (lifecycle.CloseInterval).
func ettr(rec *rdzvv1.Job) float64 {
	train, recover := rec.GetTrainingTime().AsDuration(), rec.GetRecoveryTime().AsDuration()
	if train+recover <= 0 {
		return 1
	}
	return train.Seconds() / (train + recover).Seconds()
}

func nodeStateLabel(ns *nodeState) string {
	switch {
	case ns.rec.GetState() == rdzvv1.NodeState_NODE_STATE_LOST:
		return "lost"
	case ns.rec.GetCordoned():
		return "cordoned"
	case ns.job != "":
		return "busy"
	}
	return "ready"
}

// jobStateLabel is "running" for JOB_STATE_RUNNING.
func jobStateLabel(s rdzvv1.JobState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "JOB_STATE_"))
}

// failureCause is the reason label of a failed worker status: node_lost
// when its node was declared lost, else worker_exit.
func (nt nodeTable) failureCause(node string) string {
	if ns := nt[node]; ns != nil && ns.rec.GetState() == rdzvv1.NodeState_NODE_STATE_LOST {
		return causeNodeLost
	}
	return causeWorkerExit
}

// attemptFailed counts a failed generation and starts timing its recovery.
// Callers hold c.mu.
func (m *metrics) attemptFailed(js *jobState, cause string, latency time.Duration, now time.Time, restarted bool) {
	m.attemptsFailed.WithLabelValues(cause).Inc()
	m.detection.WithLabelValues(cause).Observe(latency.Seconds())
	if restarted {
		m.restarts.WithLabelValues(cause).Inc()
		js.failedAt, js.recommittedAt = now, time.Time{}
	}
}

// committed counts a round; for a restart it ends the attempt_failed to
// commit interval and starts the commit to first step one. Callers hold
// c.mu.
func (m *metrics) committed(js *jobState, now time.Time) {
	m.rounds.Inc()
	if !js.failedAt.IsZero() {
		m.failedToCommit.Observe(now.Sub(js.failedAt).Seconds())
		js.failedAt, js.recommittedAt = time.Time{}, now
	}
}

// Sources of a restarted generation's state, the label of rdzv_resumes_total.
const (
	resumeSourceMemory  = "memory"
	resumeSourceDurable = "durable"
)

// resumed counts a restarted generation of a job with checkpoint.memory by
// the kind of the event planMemory chose it with.
func (m *metrics) resumed(kind string) {
	switch kind {
	case EventResumeMemory:
		m.resumes.WithLabelValues(resumeSourceMemory).Inc()
	case EventResumeDurable:
		m.resumes.WithLabelValues(resumeSourceDurable).Inc()
	}
}

// firstStep ends a restarted generation's commit to first step interval.
// Callers hold c.mu.
func (m *metrics) firstStep(js *jobState, now time.Time) {
	if !js.recommittedAt.IsZero() {
		m.commitToStep.Observe(now.Sub(js.recommittedAt).Seconds())
		js.recommittedAt = time.Time{}
	}
}

// heartbeat records the gap between an agent's consecutive heartbeats
// (session.heartbeat); zero, the first, is none.
func (m *metrics) heartbeat(gap time.Duration) {
	if gap > 0 {
		m.heartbeatGap.Observe(gap.Seconds())
	}
}
