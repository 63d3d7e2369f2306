package testkit

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"testing"

	"github.com/meshid/meshid/certs"
)

// Key returns a new private key of type kt, failing the test on error.
func Key(t testing.TB, kt certs.KeyType) crypto.Signer {
	t.Helper()
	k, err := certs.GenerateKey(kt)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Certificate creates and parses the certificate tmpl for pub, signed by
// parent's key (parent = tmpl and key = pub's own key for a self-signed
// one), failing the test on error.
func Certificate(t testing.TB, tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Root returns the self-signed CA certificate of spec and its key (a new
// ECDSA P-256 key when spec.Key is nil), failing the test on error.
func Root(t testing.TB, spec certs.CASpec) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	if spec.Key == nil {
		spec.Key = Key(t, certs.ECP256)
	}
	root, err := certs.NewRootCA(spec)
	if err != nil {
		t.Fatal(err)
	}
	return root, spec.Key
}
