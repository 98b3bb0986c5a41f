package agent

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdzv/rdzv/internal/httpserve"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// Metrics (docs/monitoring.md): counters move where things happen, gauges
// are read when Prometheus scrapes.

// ShimsDir is where the worker shims keep their state under the agent's
// state directory, one directory per worker (see ShimSpawner).
func ShimsDir(stateDir string) string { return filepath.Join(stateDir, "workers") }

// Worker exit causes, the cause label of rdzv_agent_worker_exits_total.
const (
	exitSucceeded = "succeeded"
	exitFailed    = "failed"  // non-zero exit code, or refused to start
	exitKilled    = "killed"  // killed by a signal it was not sent by rdzv
	exitStopped   = "stopped" // stopped by the agent (job stopped, fenced, restarted)
)

type agentMetrics struct {
	exits     *prometheus.CounterVec
	gpuFaults *prometheus.CounterVec
	reports   *prometheus.CounterVec
}

func newAgentMetrics() *agentMetrics {
	m := &agentMetrics{
		exits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdzv_agent_worker_exits_total",
			Help: "Workers (torchrun) that ended on this node, by cause: succeeded, failed, killed (by a signal), stopped (by the agent)."}, []string{"cause"}),
		gpuFaults: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdzv_agent_gpu_faults_total",
			Help: "GPU faults seen through NVML, by GPU index and whether gpu_health counts them critical (critical ones cordon the node)."}, []string{"gpu", "critical"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdzv_agent_report_requests_total",
			Help: "Requests to the workers' report endpoint (steps, checkpoints), by HTTP status code."}, []string{"code"}),
	}
	// Bounded label values exist from the start, at zero, so that
	// increase() sees the first one and dashboards show a zero.
	for _, c := range []string{exitSucceeded, exitFailed, exitKilled, exitStopped} {
		m.exits.WithLabelValues(c)
	}
	for _, code := range []int{http.StatusNoContent, http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden,
		http.StatusConflict, http.StatusRequestEntityTooLarge} {
		m.reports.WithLabelValues(strconv.Itoa(code))
	}
	return m
}

// gpusFound exports each discovered GPU's fault counters at zero.
func (m *agentMetrics) gpusFound(gpus []*rdzvv1.GPU) {
	for _, g := range gpus {
		for _, critical := range []bool{true, false} {
			m.gpuFaults.WithLabelValues(strconv.FormatUint(uint64(g.GetIndex()), 10), strconv.FormatBool(critical))
		}
	}
}

func exitCause(st *rdzvv1.WorkerStatus) string {
	switch {
	case st.GetState() == rdzvv1.WorkerState_WORKER_STATE_SUCCEEDED:
		return exitSucceeded
	case st.GetState() == rdzvv1.WorkerState_WORKER_STATE_STOPPED:
		return exitStopped
	case st.GetSignal() != "":
		return exitKilled
	}
	return exitFailed
}

// countStatus counts h's answers by status code.
func countStatus(h http.Handler, c *prometheus.CounterVec) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(sw, r)
		c.WithLabelValues(strconv.Itoa(sw.code)).Inc()
	})
}

type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

// runState is what the gauges read from a running agent; set once Run
// has built the parts.
type runState struct {
	sup    *Supervisor
	sess   *agentSession
	gossip *Gossip
	gpus   int
}

// agentCollector computes the gauges at scrape time.
type agentCollector struct {
	stateDir string
	run      *atomic.Pointer[runState]
}

var (
	descWorkersRunning = prometheus.NewDesc("rdzv_agent_workers_running", "1 while this node runs a job's workers, else 0.", nil, nil)
	descGPUs           = prometheus.NewDesc("rdzv_agent_gpus", "GPUs discovered on this node.", nil, nil)
	descContact        = prometheus.NewDesc("rdzv_agent_controller_contact_age_seconds",
		"Seconds since the controller last acknowledged a heartbeat of this agent (the agent's fencing clock).", nil, nil)
	descConnected = prometheus.NewDesc("rdzv_agent_connected", "1 while this agent is registered with a controller, else 0.", nil, nil)
	descViaRelay  = prometheus.NewDesc("rdzv_agent_via_relay", "1 while this agent is registered through one of its relays, else 0 (direct, or not registered).", nil, nil)
	descGossip    = prometheus.NewDesc("rdzv_agent_gossip_members_alive", "Gossip members this node sees alive, itself included (absent with gossip off).", nil, nil)
	descShims     = prometheus.NewDesc("rdzv_agent_shims", "Worker shims on this node (directories under state_dir/workers).", nil, nil)
	descMemBytes  = prometheus.NewDesc("rdzv_agent_memory_checkpoint_bytes",
		"Bytes of a job's in-memory checkpoints held on this node: held=own (its workers' shards, files in shared memory) or held=replica (peers' shards, in the agent's memory).", []string{"job", "held"}, nil)
	descMemLimit = prometheus.NewDesc("rdzv_agent_memory_checkpoint_limit_bytes",
		"A job's checkpoint.memory.max_bytes: the most bytes of its in-memory checkpoints this node keeps, own and replicas together.", []string{"job"}, nil)
	descMemSteps = prometheus.NewDesc("rdzv_agent_memory_checkpoint_steps",
		"Steps of a job's in-memory checkpoints of which this node holds at least one shard.", []string{"job"}, nil)
)

func (c agentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descWorkersRunning, descGPUs, descContact, descConnected, descViaRelay, descGossip, descShims,
		descMemBytes, descMemLimit, descMemSteps} {
		ch <- d
	}
}

func (c agentCollector) Collect(ch chan<- prometheus.Metric) {
	entries, err := os.ReadDir(ShimsDir(c.stateDir))
	if err == nil || errors.Is(err, os.ErrNotExist) {
		n := 0
		for _, e := range entries {
			if e.IsDir() {
				n++
			}
		}
		ch <- prometheus.MustNewConstMetric(descShims, prometheus.GaugeValue, float64(n))
	}
	rs := c.run.Load()
	if rs == nil {
		return
	}
	running := 0.0
	if rs.sup.Busy() {
		running = 1
	}
	ch <- prometheus.MustNewConstMetric(descWorkersRunning, prometheus.GaugeValue, running)
	ch <- prometheus.MustNewConstMetric(descGPUs, prometheus.GaugeValue, float64(rs.gpus))
	ch <- prometheus.MustNewConstMetric(descContact, prometheus.GaugeValue, rs.sess.silent().Seconds())
	connected := 0.0
	if rs.sess.connected.Load() {
		connected = 1
	}
	ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, connected)
	viaRelay := 0.0
	if rs.sess.viaRelay.Load() {
		viaRelay = 1
	}
	ch <- prometheus.MustNewConstMetric(descViaRelay, prometheus.GaugeValue, viaRelay)
	if rs.gossip != nil {
		_, alive := rs.gossip.View()
		ch <- prometheus.MustNewConstMetric(descGossip, prometheus.GaugeValue, float64(alive))
	}
	for _, u := range rs.sup.mem.usage() {
		ch <- prometheus.MustNewConstMetric(descMemBytes, prometheus.GaugeValue, float64(u.own), u.job, "own")
		ch <- prometheus.MustNewConstMetric(descMemBytes, prometheus.GaugeValue, float64(u.replica), u.job, "replica")
		ch <- prometheus.MustNewConstMetric(descMemLimit, prometheus.GaugeValue, float64(u.limit), u.job)
		ch <- prometheus.MustNewConstMetric(descMemSteps, prometheus.GaugeValue, float64(u.steps), u.job)
	}
}

// readiness: an agent is ready once registered with a controller, and
// while its stream to it is open.
func (a *Agent) readiness() error {
	rs := a.run.Load()
	switch {
	case rs == nil:
		return errors.New("starting")
	case !rs.sess.connected.Load():
		return fmt.Errorf("not connected to a controller (last heard from one %s ago)",
			rs.sess.silent().Round(time.Second))
	}
	return nil
}

// HTTP is the metrics and health listener, nil when http.listen is empty;
// its Addr is valid once Run started serving.
func (a *Agent) HTTP() *httpserve.Server { return a.http }
