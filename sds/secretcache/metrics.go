package secretcache

import (
	"errors"
	"fmt"
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/internal/metric"
	"github.com/meshid/meshid/sds/caclient"
)

type metrics struct {
	rotations     prometheus.Counter
	caFailures    *prometheus.CounterVec
	fileFailures  prometheus.Counter
	pushes        prometheus.Counter
	expirySeconds prometheus.GaugeFunc
	jwtRequests   prometheus.GaugeFunc
	jwtRefused    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, m *Manager) (*metrics, error) {
	met := &metrics{
		rotations: metric.Counter("meshid_agent_rotations_total",
			"Workload certificates obtained from the CA and installed (the first one and every renewal)."),
		caFailures: metric.CounterVec("meshid_agent_rotation_failures_total",
			"Failed rotations: attempts to obtain and install a workload certificate that failed, by gRPC code (invalid_response for refused answers); each failed CA call is also counted by meshid_agent_ca_request_failures_total.",
			"code"),
		fileFailures: metric.Counter("meshid_agent_file_secret_failures_total",
			"File-mounted secrets that could not be (re)loaded or watched; the last good content stays served."),
		pushes: metric.Counter("meshid_agent_secret_notifications_total",
			"Watch callbacks called for changed secrets."),
		expirySeconds: metric.GaugeFunc("meshid_agent_cert_expiry_seconds",
			"Seconds until the workload certificate expires (negative once expired, NaN before the first one).",
			func() float64 {
				s := m.cert.Load()
				if s == nil {
					// NaN, not 0: "expires in under an hour" (< 3600)
					// is false for NaN, so an alert on this gauge does
					// not fire on every agent that has just started.
					return math.NaN()
				}
				return s.NotAfter.Sub(m.clock.Now()).Seconds()
			}),
		jwtRequests: metric.GaugeFunc("meshid_agent_jwt_requests",
			"JWT-SVID requests in progress (one per audience set, waiting for a CA slot or at the CA).",
			func() float64 { return float64(m.JWTRequestsInProgress()) }),
		jwtRefused: metric.Counter("meshid_agent_jwt_requests_refused_total",
			"JWT-SVID requests refused because MaxJWTFlights requests were in progress."),
	}
	err := metric.Register(reg, met.rotations, met.caFailures, met.fileFailures, met.pushes, met.expirySeconds,
		met.jwtRequests, met.jwtRefused)
	var already prometheus.AlreadyRegisteredError
	switch {
	case errors.As(err, &already):
		return nil, fmt.Errorf("secretcache: metrics already registered (one Manager per registry): %w", err)
	case err != nil:
		return nil, fmt.Errorf("secretcache: register metrics: %w", err)
	}
	return met, nil
}

func (met *metrics) caFailure(err error) {
	met.caFailures.WithLabelValues(caclient.FailureCode(err)).Inc()
}
