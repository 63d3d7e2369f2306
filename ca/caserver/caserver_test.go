package caserver_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/internal/testkit"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/secretcache"
)

// TestServe: the assembled CA on a self-signed root in its state directory
// writes root-cert.pem, authenticates the configured JWT issuer's tokens,
// signs for a real agent, and reports ready on /readyz.
func TestServe(t *testing.T) {
	dir := t.TempDir()
	iss, err := devissuer.LoadOrCreate(dir, "https://meshid.dev.local")
	if err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString("example.org")
	s := testkit.CA(t, caserver.Config{
		TrustDomain:      td,
		StateDir:         dir,
		JWTIssuer:        iss.Issuer(),
		JWKSFile:         filepath.Join(dir, devissuer.JWKSFile),
		MonitoringListen: "127.0.0.1:0",
	})
	if s.Authority() == nil || s.Authority().TrustDomain() != td {
		t.Fatalf("authority %v, want one for %s", s.Authority(), td)
	}
	pem, err := os.ReadFile(filepath.Join(dir, "root-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots, err := certs.ParseCertificates(pem)
	if err != nil || !roots[0].Equal(s.Authority().Bundle().Roots[0]) {
		t.Fatalf("root-cert.pem is not the authority's root (%v)", err)
	}

	tok, err := iss.Mint("ns1", "sa1", []string{"istio-ca"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	a := testkit.RunAgent(t, agent.Config{CAAddr: s.Addr().String(), CARootFile: filepath.Join(dir, "root-cert.pem"), TokenFile: tokenFile, TrustDomain: td})
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	sec, err := a.Manager().Secret(ctx, secretcache.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	if got := sec.Chain[0].URIs[0].String(); got != "spiffe://example.org/ns/ns1/sa/sa1" {
		t.Fatalf("issued %s", got)
	}
	if err := s.Ready(); err != nil {
		t.Fatalf("Ready after serving: %v", err)
	}
	resp, err := http.Get("http://" + s.MonitoringAddr().String() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz: %s", resp.Status)
	}
}

// TestNotReadyBeforeRun: a built CA that does not serve yet is not ready.
func TestNotReadyBeforeRun(t *testing.T) {
	s, err := caserver.New(caserver.Config{StateDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(); err == nil {
		t.Fatal("ready before Run")
	}
	if s.Addr() != nil || s.MonitoringAddr() != nil {
		t.Fatal("addresses before Listen")
	}
}

// TestDefaults: the zero Config serves the trust domain and TTLs of
// `meshid server`'s defaults.
func TestDefaults(t *testing.T) {
	s, err := caserver.New(caserver.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Authority().TrustDomain().Name(); got != caserver.DefaultTrustDomain {
		t.Fatalf("trust domain %s", got)
	}
	if k := s.Authority().Bundle().Roots[0].PublicKeyAlgorithm.String(); k != "ECDSA" {
		t.Fatalf("root key %s, want the default ec-p256", k)
	}
}

func TestConfigErrors(t *testing.T) {
	for name, cfg := range map[string]caserver.Config{
		"kube CA secret without a cluster": {KubeCASecret: true},
		"bad root key type":                {RootKeyType: "dsa-1024"},
		"negative TTL":                     {DefaultTTL: -time.Hour},
		"negative rate limit":              {RateLimit: -1},
		"missing CA dir":                   {CADir: filepath.Join(t.TempDir(), "absent")},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.StateDir = t.TempDir()
			if _, err := caserver.New(cfg); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
}

// TestBuildInfoGauge: the CA registers meshid_build_info (1) on its registry.
func TestBuildInfoGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := caserver.New(caserver.Config{StateDir: t.TempDir(), Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if v := testkit.Metric(t, reg, "meshid_build_info", "goversion", runtime.Version()); v != 1 {
		t.Fatalf("meshid_build_info = %v", v)
	}
}
