package spiffefed

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/internal/metric"
)

// endpointMetrics are the bundle endpoint's.
type endpointMetrics struct {
	requests     *prometheus.CounterVec
	refusedConns *prometheus.CounterVec
}

func newEndpointMetrics(reg prometheus.Registerer, sequence func() uint64) (*endpointMetrics, error) {
	m := &endpointMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_federation_endpoint_requests_total",
			Help: "Requests to the bundle endpoint, by HTTP status code.",
		}, []string{"code"}),
		refusedConns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_federation_endpoint_refused_connections_total",
			Help: "Connections to the bundle endpoint closed by a connection cap, by reason.",
		}, []string{"reason"}),
	}
	seq := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "meshid_federation_endpoint_sequence",
		Help: "spiffe_sequence of the bundle the endpoint serves (0 before the first request).",
	}, func() float64 { return float64(sequence()) })
	return m, metric.Register(reg, m.requests, m.refusedConns, seq)
}

// federatorMetrics are the Federator's: a failure counter and, read at
// scrape time, each trust domain's last success, bundle age and sequence.
type federatorMetrics struct {
	failures *prometheus.CounterVec
	f        *Federator
}

var (
	lastSuccessDesc = prometheus.NewDesc("meshid_federation_bundle_last_success_timestamp_seconds",
		"Unix time of the last successful fetch of a federated trust domain's bundle (0: never).", []string{"trust_domain"}, nil)
	ageDesc = prometheus.NewDesc("meshid_federation_bundle_age_seconds",
		"Seconds since a federated trust domain's bundle was last fetched successfully (since the start when never).", []string{"trust_domain"}, nil)
	seqDesc = prometheus.NewDesc("meshid_federation_bundle_sequence",
		"spiffe_sequence of the federated bundle held (0: none).", []string{"trust_domain"}, nil)
)

func newFederatorMetrics(reg prometheus.Registerer, f *Federator) (*federatorMetrics, error) {
	m := &federatorMetrics{f: f, failures: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshid_federation_bundle_refresh_failures_total",
		Help: "Refused or failed fetches of a federated trust domain's bundle, by trust domain and reason.",
	}, []string{"trust_domain", "reason"})}
	return m, metric.Register(reg, m.failures, m)
}

func (m *federatorMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- lastSuccessDesc
	ch <- ageDesc
	ch <- seqDesc
}

func (m *federatorMetrics) Collect(ch chan<- prometheus.Metric) {
	now := m.f.cfg.Clock.Now()
	for _, st := range m.f.Status() {
		last, since := 0.0, m.f.started
		if !st.LastSuccess.IsZero() {
			last, since = float64(st.LastSuccess.Unix()), st.LastSuccess
		}
		ch <- prometheus.MustNewConstMetric(lastSuccessDesc, prometheus.GaugeValue, last, st.TrustDomain)
		ch <- prometheus.MustNewConstMetric(ageDesc, prometheus.GaugeValue, now.Sub(since).Seconds(), st.TrustDomain)
		ch <- prometheus.MustNewConstMetric(seqDesc, prometheus.GaugeValue, float64(st.Sequence), st.TrustDomain)
	}
}
