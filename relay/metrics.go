package relay

import "github.com/prometheus/client_golang/prometheus"

// metrics are the relay's own series (docs/monitoring.md).
type metrics struct {
	connected prometheus.Gauge
	streams   prometheus.Gauge
	ended     *prometheus.CounterVec
	refused   *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rdzv_relay_connected",
			Help: "1 while the relay's call to the leading controller is up (its agents' streams ride on it), 0 while it looks for one."}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rdzv_relay_streams", Help: "Agent streams the relay carries to the controller now."}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdzv_relay_streams_ended_total",
			Help: "Agent streams ended, by gRPC status code (OK: the agent closed it; Unavailable: no controller reached)."}, []string{"code"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdzv_relay_refused_total",
			Help: "Peers refused: at the TLS handshake (no certificate, one that does not verify, or is revoked), at a stream's open (its certificate, checked again), or for a frame over the bound (a register's before the agent is admitted)."}, []string{"at"}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.connected, m.streams, m.ended, m.refused)
}
