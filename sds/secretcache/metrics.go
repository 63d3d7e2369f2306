package secretcache

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/sds/caclient"
)

type metrics struct {
	rotations     prometheus.Counter
	caFailures    *prometheus.CounterVec
	fileFailures  prometheus.Counter
	pushes        prometheus.Counter
	expirySeconds prometheus.GaugeFunc
}

func newMetrics(reg prometheus.Registerer, m *Manager) (*metrics, error) {
	met := &metrics{
		rotations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshid_agent_rotations_total",
			Help: "Workload certificates obtained from the CA and installed (the first one and every renewal).",
		}),
		caFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_agent_ca_failures_total",
			Help: "Failed attempts to obtain a workload certificate, by gRPC code (invalid_response for refused answers).",
		}, []string{"code"}),
		fileFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshid_agent_file_secret_failures_total",
			Help: "File-mounted secrets that could not be (re)loaded or watched; the last good content stays served.",
		}),
		pushes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshid_agent_secret_notifications_total",
			Help: "Watch callbacks called for changed secrets.",
		}),
		expirySeconds: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshid_agent_cert_expiry_seconds",
			Help: "Seconds until the workload certificate expires (negative once expired, 0 before the first one).",
		}, func() float64 {
			s := m.cert.Load()
			if s == nil {
				return 0
			}
			return s.NotAfter.Sub(m.clock.Now()).Seconds()
		}),
	}
	if reg == nil {
		return met, nil
	}
	for _, c := range []prometheus.Collector{met.rotations, met.caFailures, met.fileFailures, met.pushes, met.expirySeconds} {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if errors.As(err, &already) {
				return nil, fmt.Errorf("secretcache: metrics already registered (one Manager per registry): %w", err)
			}
			return nil, fmt.Errorf("secretcache: register metrics: %w", err)
		}
	}
	return met, nil
}

func (met *metrics) caFailure(err error) {
	met.caFailures.WithLabelValues(caclient.FailureCode(err)).Inc()
}
