package relay

import "github.com/prometheus/client_golang/prometheus"

// metrics are the relay's own series (README "Monitoring").
type metrics struct {
	streams prometheus.Gauge
	ended   *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rdzv_relay_streams", Help: "Agent streams the relay carries to the controller now."}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdzv_relay_streams_ended_total",
			Help: "Agent streams ended, by gRPC status code (OK: the agent closed it; Unavailable: no controller reached)."}, []string{"code"}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) { reg.MustRegister(m.streams, m.ended) }
