package ca

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/internal/metric"
)

// metrics are the Authority's Prometheus metrics. Every field is usable
// when not registered.
type metrics struct {
	issued   prometheus.Counter
	failures map[string]prometheus.Counter // by reason, created up front so the hot path takes no lock
	duration prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, current func() *issuer) (*metrics, error) {
	failures := metric.CounterVec("meshid_ca_sign_failures_total",
		"Certificate requests the CA refused or failed to sign, by reason.", "reason")
	m := &metrics{
		issued: metric.Counter("meshid_ca_certificates_issued_total",
			"Certificates issued by the CA."),
		failures: map[string]prometheus.Counter{},
		duration: metric.Histogram("meshid_ca_sign_duration_seconds",
			"Time to check a request's policy and sign its certificate.",
			prometheus.ExponentialBuckets(25e-6, 2, 14)), // 25µs .. ~200ms
	}
	for _, r := range failureReasons {
		m.failures[r] = failures.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	rootExpiry := metric.GaugeFunc("meshid_ca_root_expiry_timestamp_seconds",
		"When the earliest-expiring root of the CA bundle expires, as a Unix time.",
		func() float64 { return float64(current().rootExp.Unix()) })
	certExpiry := metric.GaugeFunc("meshid_ca_cert_expiry_timestamp_seconds",
		"When the CA's signing certificate expires, as a Unix time.",
		func() float64 { return float64(current().cert.NotAfter.Unix()) })
	if err := metric.Register(reg, m.issued, failures, m.duration, rootExpiry, certExpiry); err != nil {
		return nil, err
	}
	return m, nil
}
