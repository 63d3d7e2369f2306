package caclient

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	duration prometheus.Histogram
	failures *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "meshid_agent_ca_request_duration_seconds",
			Help:    "Latency of CreateCertificate calls, successful or not.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15), // 1ms .. 16s
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_agent_ca_request_failures_total",
			Help: "Failed CreateCertificate calls by gRPC code (invalid_response: answer refused; token_file: token unreadable).",
		}, []string{"code"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.duration, m.failures} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("caclient: register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) failure(err error) {
	m.failures.WithLabelValues(FailureCode(err)).Inc()
}
