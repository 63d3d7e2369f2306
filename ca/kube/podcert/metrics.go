package podcert

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/internal/metric"
)

// Outcomes, the result label of meshid_ca_pod_certificates_total.
const (
	resultIssued = "issued"
	resultDenied = "denied"
	resultFailed = "failed"
)

// metrics are the signer's and the bundle's.
type metrics struct {
	requests *prometheus.CounterVec // result, reason
	retries  *prometheus.CounterVec // reason
	latency  prometheus.Histogram
	bundle   *prometheus.CounterVec // op
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_ca_pod_certificates_total",
			Help: "PodCertificateRequests this replica answered, by result (issued, denied, failed) and the status condition's reason.",
		}, []string{"result", "reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_ca_pod_certificate_retries_total",
			Help: "PodCertificateRequests put back for a later attempt, by reason (unavailable, conflict, api_error, internal, lifetime).",
		}, []string{"reason"}),
		latency: metric.Histogram("meshid_ca_pod_certificate_issue_seconds",
			"Time from a PodCertificateRequest's creation (the API server's timestamp, whole seconds) to its Issued status written.",
			[]float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300}),
		bundle: metric.CounterVec("meshid_ca_cluster_trust_bundle_writes_total",
			"Writes of the signer's ClusterTrustBundle, by operation (create or update).", "op", "create", "update"),
	}
	for _, r := range []string{"unavailable", "conflict", "api_error", "internal", "lifetime"} {
		m.retries.WithLabelValues(r)
	}
	m.requests.WithLabelValues(resultIssued, reasonIssued)
	if err := metric.Register(reg, m.requests, m.retries, m.latency, m.bundle); err != nil {
		return nil, fmt.Errorf("podcert: register metrics: %w", err)
	}
	return m, nil
}
