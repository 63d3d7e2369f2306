package caclient

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/internal/metric"
)

type metrics struct {
	duration prometheus.Histogram
	failures *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		duration: metric.Histogram("meshid_agent_ca_request_duration_seconds",
			"Latency of CreateCertificate calls, successful or not.",
			prometheus.ExponentialBuckets(0.001, 2, 15)), // 1ms .. 16s
		failures: metric.CounterVec("meshid_agent_ca_request_failures_total",
			"Failed CreateCertificate calls by gRPC code (invalid_response: answer refused; token_file: token unreadable).",
			"code"),
	}
	if err := metric.Register(reg, m.duration, m.failures); err != nil {
		return nil, fmt.Errorf("caclient: register metrics: %w", err)
	}
	return m, nil
}

func (m *metrics) failure(err error) {
	m.failures.WithLabelValues(FailureCode(err)).Inc()
}
