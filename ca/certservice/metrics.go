package certservice

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/internal/metric"
	"google.golang.org/grpc/codes"
)

// metrics of the gRPC endpoint. Counters are created up front per label
// value, so the hot path takes no lock.
type metrics struct {
	requests  map[codes.Code]prometheus.Counter
	duration  prometheus.Histogram
	callers   map[string]prometheus.Counter // by authentication method
	otherAuth prometheus.Counter
	conns     *connMetrics
}

var requestCodes = []codes.Code{
	codes.OK, codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated,
	codes.Unavailable, codes.ResourceExhausted, codes.Internal, codes.Canceled, codes.DeadlineExceeded,
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	requests := metric.CounterVec("meshid_ca_requests_total",
		"CreateCertificate requests, by gRPC status code.", "code")
	callers := metric.CounterVec("meshid_ca_authenticated_requests_total",
		"CreateCertificate and MintJWTSVID requests whose caller was authenticated, by method (tokenreview, jwt, clientcert).",
		"method")
	m := &metrics{
		requests: map[codes.Code]prometheus.Counter{},
		callers:  map[string]prometheus.Counter{},
		duration: metric.Histogram("meshid_ca_request_duration_seconds",
			"Time to handle a CreateCertificate request: authentication, CSR check and signing.",
			prometheus.ExponentialBuckets(50e-6, 2, 16)), // 50µs .. ~1.6s
	}
	for _, c := range requestCodes {
		m.requests[c] = requests.WithLabelValues(c.String())
	}
	for _, method := range []string{"tokenreview", "jwt", "clientcert"} {
		m.callers[method] = callers.WithLabelValues(method)
	}
	m.otherAuth = callers.WithLabelValues("other")
	conns, connCollectors := newConnMetrics()
	m.conns = conns
	if err := metric.Register(reg, append([]prometheus.Collector{requests, callers, m.duration}, connCollectors...)...); err != nil {
		return nil, fmt.Errorf("certservice: register metrics: %w", err)
	}
	return m, nil
}

func (m *metrics) request(c codes.Code) {
	if ctr, ok := m.requests[c]; ok {
		ctr.Inc()
		return
	}
	m.requests[codes.Internal].Inc()
}

func (m *metrics) authenticated(method string) {
	if ctr, ok := m.callers[method]; ok {
		ctr.Inc()
		return
	}
	m.otherAuth.Inc()
}
