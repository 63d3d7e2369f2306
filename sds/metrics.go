package sds

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons of meshid_agent_sds_bad_requests_total.
const (
	reasonTypeURL         = "type_url"          // a type other than Secret
	reasonUnknownResource = "unknown_resource"  // a name the Source cannot serve
	reasonNoNames         = "no_resource_names" // FetchSecrets without names
	reasonTooManyNames    = "too_many_names"    // more names than Config.MaxResourceNames
)

type metrics struct {
	streams prometheus.Gauge
	pushes  prometheus.Counter
	acks    prometheus.Counter
	nacks   prometheus.Counter
	stale   prometheus.Counter
	bad     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "meshid_agent_sds_streams",
			Help: "Open SDS streams (state of the world and delta).",
		}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshid_agent_sds_pushes_total",
			Help: "SDS responses sent on streams.",
		}),
		acks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshid_agent_sds_acks_total",
			Help: "SDS requests acknowledging the latest response.",
		}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshid_agent_sds_nacks_total",
			Help: "SDS requests rejecting the latest response (error_detail set).",
		}),
		stale: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshid_agent_sds_stale_requests_total",
			Help: "SDS requests whose response_nonce is not the latest sent on the stream.",
		}),
		bad: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_agent_sds_bad_requests_total",
			Help: "SDS requests, or requested names, that could not be served, by reason.",
		}, []string{"reason"}),
	}
	for _, r := range []string{reasonTypeURL, reasonUnknownResource, reasonNoNames, reasonTooManyNames} {
		m.bad.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.streams, m.pushes, m.acks, m.nacks, m.stale, m.bad} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("sds: register metrics: %w", err)
		}
	}
	return m, nil
}
