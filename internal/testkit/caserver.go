package testkit

import (
	"log/slog"
	"testing"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/server"
	"github.com/meshid/meshid/internal/devissuer"
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

// ServeCA runs a real CA server (ca/server) with cfg until the test ends or
// stop is called, and returns its address. cfg.Listen "" = 127.0.0.1:0.
func ServeCA(t testing.TB, cfg server.Config) (addr string, stop func()) {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	srv, err := server.New(cfg)
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
