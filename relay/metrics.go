package relay

import "github.com/prometheus/client_golang/prometheus"

// metrics are the relay's own series (README "Monitoring").
type metrics struct {
	connected prometheus.Gauge
	streams   prometheus.Gauge
	ended     *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rdzv_relay_connected",
			Help: "1 while the relay's call to the leading controller is up (its agents' streams ride on it), 0 while it looks for one."}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rdzv_relay_streams", Help: "Agent streams the relay carries to the controller now."}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rdzv_relay_streams_ended_total",
			Help: "Agent streams ended, by gRPC status code (OK: the agent closed it; Unavailable: no controller reached)."}, []string{"code"}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.connected, m.streams, m.ended)
}
