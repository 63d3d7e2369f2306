package caserver_test

import (
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/spiffefed"
	"github.com/meshid/meshid/testkit"
)

// The bundle endpoint of the assembled CA serves exactly ROOTCA's roots
// (root-cert.pem): during a root rotation the union of the old and the
// new, from the moment the new root is prepared, before it signs, with a
// higher sequence; and the CA's JWT-SVID keys. go-spiffe's own client,
// bootstrapped with root-cert.pem, verifies the endpoint's SVID.
func TestBundleEndpointServesTheRotationUnion(t *testing.T) {
	dir := t.TempDir()
	td := spiffeid.RequireTrustDomainFromString("b.example")
	s := testkit.CA(t, caserver.Config{
		TrustDomain: td, StateDir: dir, Registerer: prometheus.NewRegistry(),
		Federation: caserver.FederationConfig{
			BundleEndpoint: spiffefed.EndpointConfig{Listen: "127.0.0.1:0"},
		},
	})
	url := "https://" + s.BundleEndpointAddr().String() + "/"
	rootFile := filepath.Join(dir, keystore.RootCertFile)
	fetch := func() *spiffebundle.Bundle {
		t.Helper()
		boot := spiffebundle.FromX509Authorities(td, testkit.ReadCerts(t, rootFile))
		b, err := federation.FetchBundle(t.Context(), td, url, federation.WithSPIFFEAuth(boot, spiffefed.EndpointID(td)))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	before := fetch()
	if len(before.X509Authorities()) != 1 || len(before.JWTAuthorities()) == 0 {
		t.Fatalf("stable: %d roots, %d JWT keys", len(before.X509Authorities()), len(before.JWTAuthorities()))
	}
	if err := s.Rotation().RotateRoot(); err != nil {
		t.Fatal(err)
	}
	during := fetch()
	roots := testkit.ReadCerts(t, rootFile)
	if len(roots) != 2 || len(during.X509Authorities()) != 2 || !during.HasX509Authority(roots[0]) || !during.HasX509Authority(roots[1]) {
		t.Fatalf("prepared: endpoint serves %d roots, root-cert.pem %d", len(during.X509Authorities()), len(roots))
	}
	s1, _ := before.SequenceNumber()
	s2, _ := during.SequenceNumber()
	if s2 <= s1 {
		t.Fatalf("sequence %d then %d", s1, s2)
	}
}
