package cluster

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/internal/metric"
)

// States of a remote cluster, the values of the state label of
// meshid_ca_remote_cluster_state.
const (
	StateConfigured   = "configured"   // a client exists; not checked yet
	StateReady        = "ready"        // its API server answered the last review or probe
	StateUnreachable  = "unreachable"  // its API server did not answer
	StateUnauthorized = "unauthorized" // its API server refused the CA's credentials
	StateInvalid      = "invalid"      // its kubeconfig was refused
)

var states = []string{StateConfigured, StateReady, StateUnreachable, StateUnauthorized, StateInvalid}

// Results of an authentication, the values of the result label.
const (
	resultAuthenticated   = "authenticated"
	resultUnauthenticated = "unauthenticated"
	resultUnavailable     = "unavailable"
)

type metrics struct {
	auths   *prometheus.CounterVec
	latency *prometheus.HistogramVec
	state   *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, local string) (*metrics, error) {
	m := &metrics{
		auths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_ca_cluster_authentications_total",
			Help: "Token authentications by the cluster that reviewed them (the local cluster, a remote one, or \"unknown\") and result (authenticated, unauthenticated, unavailable).",
		}, []string{"cluster", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "meshid_ca_cluster_authentication_duration_seconds",
			Help:    "Latency of token authentications by cluster, review cache hits included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"cluster"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "meshid_ca_remote_cluster_state",
			Help: "State of each remote cluster: 1 for its current state (configured, ready, unreachable, unauthorized, invalid), 0 for the others.",
		}, []string{"cluster", "state"}),
	}
	for _, l := range []string{local, UnknownLabel} {
		for _, r := range []string{resultAuthenticated, resultUnauthenticated, resultUnavailable} {
			m.auths.WithLabelValues(l, r)
		}
	}
	return m, metric.Register(reg, m.auths, m.latency, m.state)
}

// observe counts one authentication of cluster (a label the Router
// chose: the local ID, a configured remote ID or UnknownLabel).
func (m *metrics) observe(cluster string, d time.Duration, err error) {
	result := resultAuthenticated
	switch {
	case err == nil:
	case ca.KindOf(err) == ca.KindUnavailable:
		result = resultUnavailable
	default:
		result = resultUnauthenticated
	}
	m.auths.WithLabelValues(cluster, result).Inc()
	m.latency.WithLabelValues(cluster).Observe(d.Seconds())
}

func (m *metrics) setState(cluster, state string) {
	for _, s := range states {
		v := 0.0
		if s == state {
			v = 1
		}
		m.state.WithLabelValues(cluster, s).Set(v)
	}
}

// forget drops every series of a removed cluster.
func (m *metrics) forget(cluster string) {
	l := prometheus.Labels{"cluster": cluster}
	m.auths.DeletePartialMatch(l)
	m.latency.DeletePartialMatch(l)
	m.state.DeletePartialMatch(l)
}
