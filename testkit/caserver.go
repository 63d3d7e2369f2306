package testkit

import (
	"log/slog"
	"testing"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/internal/logs"
)

// DevJWT returns offline JWT authentication of iss's tokens for the
// audience istio-ca, logging nothing: what meshid dev runs.
func DevJWT(t testing.TB, iss *devissuer.Issuer) *authn.JWT {
	t.Helper()
	jwt, err := authn.NewJWT(authn.JWTConfig{Issuer: iss.Issuer(), Audiences: []string{"istio-ca"}, JWKS: iss.JWKS(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return jwt
}

// ServeCA runs a real CA server (ca/certservice) with cfg until the test ends or
// stop is called, and returns its address. cfg.Listen "" = 127.0.0.1:0.
func ServeCA(t testing.TB, cfg certservice.Config) (addr string, stop func()) {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	srv, err := certservice.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	stop = Start(t, "CA server", srv.Run)
	t.Cleanup(stop)
	return srv.Addr().String(), stop
}

// CA runs the CA assembly (ca/caserver, what `meshid server` runs) with cfg
// until the test ends, bound before it returns. Unset in cfg: Listen is
// 127.0.0.1:0, StateDir a temporary directory, logs are discarded;
// MonitoringListen stays as given (empty: no monitoring).
func CA(t testing.TB, cfg caserver.Config) *caserver.Server {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	s, err := caserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	Run(t, "CA", s.Run)
	return s
}
