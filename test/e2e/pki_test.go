package e2e_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// discard drops the logs of in-process components.
var discard = slog.New(slog.DiscardHandler)

// newAuthority returns a real ca.Authority on a fresh self-signed root
// created at clk's time.
func newAuthority(t testing.TB, clk clock.Clock) *ca.Authority {
	t.Helper()
	bundle, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: td.Name(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	a, err := ca.New(ca.Config{TrustDomain: td, Bundle: bundle, Clock: clk, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// issueLeaf has a signs a leaf for id with a fresh key, as its CA server
// would after authenticating id.
func issueLeaf(t testing.TB, a *ca.Authority, id spiffeid.ID, ttl time.Duration) (*ca.Issued, crypto.Signer) {
	t.Helper()
	key := testkit.Key(t, certs.ECP256)
	csr, err := ca.ParseCSR(testkit.CSRPEM(t, key, id))
	if err != nil {
		t.Fatal(err)
	}
	iss, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: id, Caller: "e2e", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return iss, key
}

// writePEM writes certificates to dir/name and returns the path.
func writePEM(t testing.TB, dir, name string, cs ...*x509.Certificate) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pemCerts(cs...), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
