package caserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"

	"k8s.io/client-go/rest"

	"github.com/meshid/meshid/internal/metric"
	"github.com/meshid/meshid/internal/reachability"
)

// apiServerTracker returns the Tracker of the local API server that Ready
// consults, or nil without a cluster, with APIServerGrace negative, or with
// a KubeClient that has no REST client (client-go's fake).
//
// The probe is GET /readyz with the CA's credentials, on the controllers'
// client: API Priority and Fairness exempts /readyz (the built-in "probes"
// FlowSchema), so a restart storm that fills the CA's TokenReview priority
// level, or queues on the TokenReview client's own rate limit, never times
// the probe out and takes a busy replica out of its Service.
func (s *Server) apiServerTracker() (*reachability.Tracker, error) {
	cfg := s.cfg
	if s.kc == nil || cfg.Kube.APIServerGrace < 0 {
		return nil, nil
	}
	rc := s.kc.controllers.CoreV1().RESTClient()
	if rc == nil || reflect.ValueOf(rc).IsNil() {
		return nil, nil
	}
	tr, err := reachability.New(reachability.Config{
		Name:     "the Kubernetes API server",
		Probe:    func(ctx context.Context) error { return probeAPIServer(ctx, rc) },
		Interval: cfg.Kube.APIServerProbeInterval,
		Grace:    cfg.Kube.APIServerGrace,
		Clock:    cfg.Clock,
		Logger:   cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("caserver: %w", err)
	}
	reachable := metric.GaugeFunc("meshid_ca_kube_apiserver_reachable",
		"1 when the API server answered the CA's latest readiness probe (GET /readyz, every 5s by default), else 0; see /readyz.",
		func() float64 {
			if tr.Reachable() {
				return 1
			}
			return 0
		})
	if err := metric.Register(cfg.Registerer, reachable); err != nil {
		return nil, fmt.Errorf("caserver: register metrics: %w", err)
	}
	return tr, nil
}

// probeAPIServer asks the API server's /readyz. It answered unless the
// request got no HTTP answer, the API server refused the CA's credentials
// (401: no TokenReview would pass either), or it said it is not ready
// (5xx). A 403 (a cluster that does not let service accounts read
// /readyz) still proves it authenticated the CA and answers.
func probeAPIServer(ctx context.Context, rc rest.Interface) error {
	var code int
	err := rc.Get().AbsPath("/readyz").Do(ctx).StatusCode(&code).Error()
	switch {
	case code == 0 && err == nil:
		return errors.New("no answer")
	case code == 0:
		return err
	case code == http.StatusUnauthorized:
		return fmt.Errorf("it refuses the CA's credentials (401): %w", err)
	case code >= 500:
		return fmt.Errorf("it is not ready (%d): %w", code, err)
	}
	return nil
}

// authReady is nil when the CA can authenticate the cluster's callers:
// the API server answers (or answered within APIServerGrace), or the
// cluster's bound tokens are verified here (local verification synced,
// which keeps working through an API-server outage).
func (s *Server) authReady() error {
	if s.apiserver == nil {
		return nil
	}
	err := s.apiserver.Ready()
	if err == nil {
		return nil
	}
	s.mu.Lock()
	bound := s.bound
	s.mu.Unlock()
	if bound != nil && bound.Active() {
		return nil
	}
	return fmt.Errorf("caserver: cannot authenticate the cluster's callers (no local token verification, and %w)", err)
}
