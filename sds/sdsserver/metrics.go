package sdsserver

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/internal/metric"
	"github.com/meshid/meshid/internal/unixsock"
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
	refused *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: metric.Gauge("meshid_agent_sds_streams",
			"Open SDS streams (state of the world and delta)."),
		pushes: metric.Counter("meshid_agent_sds_pushes_total",
			"SDS responses sent on streams."),
		acks: metric.Counter("meshid_agent_sds_acks_total",
			"SDS requests acknowledging the latest response."),
		nacks: metric.Counter("meshid_agent_sds_nacks_total",
			"SDS requests rejecting the latest response (error_detail set)."),
		stale: metric.Counter("meshid_agent_sds_stale_requests_total",
			"SDS requests whose response_nonce is not the latest sent on the stream."),
		bad: metric.CounterVec("meshid_agent_sds_bad_requests_total",
			"SDS requests, or requested names, that could not be served, by reason.",
			"reason", reasonTypeURL, reasonUnknownResource, reasonNoNames, reasonTooManyNames),
		refused: metric.CounterVec("meshid_agent_sds_refused_total",
			"SDS streams, calls and connections refused by the socket's limits, by reason.",
			"reason", unixsock.ReasonStreams, unixsock.ReasonCalls, unixsock.ReasonConnections),
	}
	if err := metric.Register(reg, m.streams, m.pushes, m.acks, m.nacks, m.stale, m.bad, m.refused); err != nil {
		return nil, fmt.Errorf("sds: register metrics: %w", err)
	}
	return m, nil
}
