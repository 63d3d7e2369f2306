package workloadendpoint

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/internal/unixsock"
)

type metrics struct {
	streams prometheus.Gauge
	refused *prometheus.CounterVec
	pushes  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshid_agent_workloadapi_streams",
			Help: "Workload API streams open.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_agent_workloadapi_refused_total",
			Help: "Workload API calls and connections refused, by reason (metadata, streams, calls, connections).",
		}, []string{"reason"}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_agent_workloadapi_pushes_total",
			Help: "Workload API responses sent, by method.",
		}, []string{"method"}),
	}
	// Every series exists from the start, at 0.
	for _, mth := range []string{"FetchX509SVID", "FetchX509Bundles"} {
		m.pushes.WithLabelValues(mth)
	}
	for _, r := range []string{reasonMetadata, unixsock.ReasonStreams, unixsock.ReasonCalls, unixsock.ReasonConnections} {
		m.refused.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.streams, m.refused, m.pushes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
