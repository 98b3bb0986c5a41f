package wire

import (
	"fmt"
	"regexp"
)

// Bounds on the metrics a step report carries (Progress.metrics): what an
// operator reads at a glance (loss, learning rate, throughput), not a
// metrics pipeline. The agent refuses a report beyond them, the controller
// a Progress message.
const (
	MaxMetrics          = 16
	MaxMetricNameLength = 64
)

// metricName is what a metric may be called: a Python identifier, or
// dotted/slashed names as loggers write them (train/loss).
var metricName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_./-]*$`)

// CheckMetrics checks the count and the names of metrics, named field in
// its error.
func CheckMetrics[V any](field string, metrics map[string]V) error {
	if len(metrics) > MaxMetrics {
		return fmt.Errorf("%s: at most %d are allowed, got %d", field, MaxMetrics, len(metrics))
	}
	for name := range metrics {
		if len(name) > MaxMetricNameLength || !metricName.MatchString(name) {
			return fmt.Errorf("%s: name %s must be at most %d characters, a letter or _ then letters, digits, _ . / or -",
				field, Quote(name), MaxMetricNameLength)
		}
	}
	return nil
}
