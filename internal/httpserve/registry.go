package httpserve

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/rdzv/rdzv/buildinfo"
)

// NewRegistry is a daemon's metric registry with what every process
// exports: the Go runtime's and the process's own metrics, and
// rdzv_build_info.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	b := buildinfo.Get()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "rdzv_build_info",
			Help:        "Always 1; the labels say which build runs.",
			ConstLabels: prometheus.Labels{"version": b.Version, "commit": b.Commit, "go_version": b.GoVersion},
		}, func() float64 { return 1 }),
	)
	return reg
}
