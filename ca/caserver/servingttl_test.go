package caserver_test

import (
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/testkit"
)

// TestServingTTLIndependentOfWorkloadLimits: `meshid server --max-ttl 3m
// --default-ttl 90s` starts, serves TLS with its own serving lifetime (the
// 24 h default, or ServingTTL when set) and is ready. The serving certificate is the CA's own, not a
// workload's: the workload maximum does not apply to it (issue 19).
func TestServingTTLIndependentOfWorkloadLimits(t *testing.T) {
	for name, tc := range map[string]struct {
		serving, want time.Duration
	}{
		"default serving TTL": {0, 24 * time.Hour},
		"set serving TTL":     {2 * time.Hour, 2 * time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			iss, err := devissuer.LoadOrCreate(dir, "https://meshid.dev.local")
			if err != nil {
				t.Fatal(err)
			}
			s := testkit.CA(t, caserver.Config{
				TrustDomain: spiffeid.RequireTrustDomainFromString("example.org"),
				StateDir:    dir,
				Authn: caserver.AuthnConfig{
					JWTIssuer: iss.Issuer(),
					JWKSFile:  filepath.Join(dir, devissuer.JWKSFile),
				},
				Issuance: caserver.IssuanceConfig{
					DefaultTTL: 90 * time.Second,
					MaxTTL:     3 * time.Minute,
				},
				Serving: caserver.ServingConfig{
					CertTTL: tc.serving,
				},
			})
			pool := x509.NewCertPool()
			pool.AddCert(s.Authority().Bundle().Roots[0])
			conn, err := tls.Dial("tcp", s.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "localhost"})
			if err != nil {
				t.Fatalf("TLS handshake with the CA: %v", err)
			}
			defer conn.Close()
			leaf := conn.ConnectionState().PeerCertificates[0]
			if got := leaf.NotAfter.Sub(leaf.NotBefore); got < tc.want || got > tc.want+time.Hour {
				t.Fatalf("serving certificate lives %v (%s to %s), want %v (plus clock skew)", got, leaf.NotBefore, leaf.NotAfter, tc.want)
			}
			if err := s.Ready(); err != nil {
				t.Fatalf("serving but not ready: %v", err)
			}
		})
	}
}
