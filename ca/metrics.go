package ca

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Authority's Prometheus metrics. Every field is usable
// when not registered.
type metrics struct {
	issued   prometheus.Counter
	failures map[string]prometheus.Counter // by reason, created up front so the hot path takes no lock
	duration prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, current func() *issuer) (*metrics, error) {
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshid_ca_sign_failures_total",
		Help: "Certificate requests the CA refused or failed to sign, by reason.",
	}, []string{"reason"})
	m := &metrics{
		issued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshid_ca_certificates_issued_total",
			Help: "Certificates issued by the CA.",
		}),
		failures: map[string]prometheus.Counter{},
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "meshid_ca_sign_duration_seconds",
			Help:    "Time to check a request's policy and sign its certificate.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 14), // 25µs .. ~200ms
		}),
	}
	for _, r := range failureReasons {
		m.failures[r] = failures.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	rootExpiry := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "meshid_ca_root_expiry_timestamp_seconds",
		Help: "When the earliest-expiring root of the CA bundle expires, as a Unix time.",
	}, func() float64 { return float64(current().rootExp.Unix()) })
	certExpiry := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "meshid_ca_cert_expiry_timestamp_seconds",
		Help: "When the CA's signing certificate expires, as a Unix time.",
	}, func() float64 { return float64(current().cert.NotAfter.Unix()) })
	cs := []prometheus.Collector{m.issued, failures, m.duration, rootExpiry, certExpiry}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, err
		}
	}
	return m, nil
}
