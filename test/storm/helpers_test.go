package storm_test

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/caclient"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

var quiet = slog.New(slog.DiscardHandler)

// guard returns a channel closed after d of real time, a bound on waits
// that would otherwise hang a broken test.
func guard(t *testing.T, d time.Duration) <-chan struct{} {
	ch := make(chan struct{})
	timer := time.AfterFunc(d, func() { close(ch) })
	t.Cleanup(func() { timer.Stop() })
	return ch
}

// newAuthority returns a CA with a fresh ec-p256 self-signed root, on clk.
func newAuthority(t testing.TB, clk clock.Clock, reg prometheus.Registerer) *ca.Authority {
	t.Helper()
	b, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: td.Name(), KeyType: certs.ECP256, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	a, err := ca.New(ca.Config{TrustDomain: td, Bundle: b, Clock: clk, Logger: quiet, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// caServer is a running ca/certservice on 127.0.0.1 with JWT authentication
// (the dev issuer), on a fake clock.
type caServer struct {
	authority *ca.Authority
	issuer    *devissuer.Issuer
	addr      string
	reg       *prometheus.Registry
	clk       *clock.Fake
}

func startCA(t *testing.T, clk *clock.Fake, rate float64, burst int, wrap ...func(authn.Authenticator) authn.Authenticator) *caServer {
	t.Helper()
	s := &caServer{reg: prometheus.NewRegistry(), clk: clk}
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	if s.issuer, err = devissuer.New(key, ""); err != nil {
		t.Fatal(err)
	}
	// The issuer's keys in memory: a JWKS file would add its refresh timer
	// to the fake clock the storm steps through.
	j, err := authn.NewJWT(authn.JWTConfig{Issuer: s.issuer.Issuer(), JWKS: s.issuer.JWKS(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	var auth authn.Authenticator = j
	for _, w := range wrap {
		auth = w(auth)
	}
	// The CA assembly `meshid server` runs, with a self-signed root made
	// at the fake time.
	srv := testkit.CA(t, caserver.Config{
		TrustDomain: td, Authn: caserver.AuthnConfig{
			Extra: []authn.Authenticator{auth},
		},

		Limits: caserver.LimitsConfig{
			Rate:  rate,
			Burst: burst,
		},
		Clock: clk, Logger: quiet, Registerer: s.reg,
		// No root-rotation timer: the storm counts the fake clock's waiters.
		Rotation: caserver.RotationConfig{
			RootThreshold: -1,
		},
	})
	s.authority, s.addr = srv.Authority(), srv.Addr().String()
	return s
}

// managerConfig is the SecretManager configuration the agent assembly
// (sds/agent, what `meshid agent` runs) gives an agent with the default
// flags but ttl, on clk, for id and signer.
func managerConfig(t testing.TB, signer secretcache.Signer, id spiffeid.ID, ttl time.Duration, clk clock.Clock) secretcache.Config {
	t.Helper()
	cfg, err := agent.Config{CertTTL: ttl, Clock: clk, Logger: quiet}.ManagerConfig(signer, id)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// token mints a service-account token for ns/sa valid for a day of fake time.
func (s *caServer) token(t testing.TB, ns, sa string) string {
	t.Helper()
	tok, err := s.issuer.Mint(ns, sa, []string{"istio-ca"}, 24*time.Hour, s.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// client returns a caclient for ns/sa: the agent's real CA client, with the
// token in a file, verifying on the fake clock.
func (s *caServer) client(t *testing.T, ns, sa string) *caclient.Client {
	t.Helper()
	file := filepath.Join(t.TempDir(), fmt.Sprintf("token-%s-%s", ns, sa))
	if err := os.WriteFile(file, []byte(s.token(t, ns, sa)), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := caclient.New(caclient.Config{
		Addr: s.addr, Roots: s.authority.Bundle().Roots, ServerName: "localhost",
		TokenFile: file, Clock: s.clk, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// requests reads meshid_ca_requests_total{code}.
func (s *caServer) requests(t *testing.T, code string) float64 {
	t.Helper()
	return testkit.Metric(t, s.reg, "meshid_ca_requests_total", "code", code)
}
