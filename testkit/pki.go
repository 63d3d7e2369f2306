package testkit

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"os"
	"testing"

	"github.com/meshid/meshid/certs"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
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

// CSR returns the parsed CSR that certs.NewCSR makes for key and id (what
// the agent sends), failing the test on error.
func CSR(t testing.TB, key crypto.Signer, id spiffeid.ID) *x509.CertificateRequest {
	t.Helper()
	der, err := certs.NewCSR(key, id)
	if err != nil {
		t.Fatal(err)
	}
	req, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// CSRPEM returns the PEM CSR that certs.NewCSR makes for key and id (what
// the agent puts on the wire), failing the test on error.
func CSRPEM(t testing.TB, key crypto.Signer, id spiffeid.ID) []byte {
	t.Helper()
	der, err := certs.NewCSR(key, id)
	if err != nil {
		t.Fatal(err)
	}
	return certs.EncodeCSR(der)
}

// ReadCerts returns the certificates of the PEM file at path, failing the
// test on error.
func ReadCerts(t testing.TB, path string) []*x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := certs.ParseCertificates(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cs
}

// FilePerm returns the permission bits of the file at path, failing the
// test on error.
func FilePerm(t testing.TB, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}
