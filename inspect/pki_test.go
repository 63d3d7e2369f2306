package inspect_test

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
)

// now is the fixed time of every test: goldens depend on it.
var now = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

// authority is a test CA: a certificate and its key, created at run time.
type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newKey(t testing.TB) crypto.Signer {
	t.Helper()
	k, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// newRoot makes a self-signed root valid from nb for ttl.
func newRoot(t testing.TB, subject pkix.Name, nb time.Time, ttl time.Duration) authority {
	t.Helper()
	k := newKey(t)
	c, err := certs.NewRootCA(certs.CASpec{Subject: subject, Key: k, NotBefore: nb, TTL: ttl, MaxPathLen: -1})
	if err != nil {
		t.Fatal(err)
	}
	return authority{c, k}
}

// intermediate makes a CA signed by a with the given path length.
func (a authority) intermediate(t testing.TB, subject pkix.Name, nb time.Time, ttl time.Duration, pathLen int) authority {
	t.Helper()
	k := newKey(t)
	c, err := certs.NewIntermediateCA(certs.CASpec{Subject: subject, Key: k, NotBefore: nb, TTL: ttl, MaxPathLen: pathLen}, a.cert, a.key)
	if err != nil {
		t.Fatal(err)
	}
	return authority{c, k}
}

// leaf makes a SPIFFE workload certificate signed by a; mutate may change
// the template (URIs, key usage...) before signing.
func (a authority) leaf(t testing.TB, id string, nb time.Time, ttl time.Duration, mutate func(*x509.Certificate)) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	k := newKey(t)
	serial, err := certs.NewSerial()
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    nb,
		NotAfter:     nb.Add(ttl),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if id != "" {
		u, err := url.Parse(id)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	if mutate != nil {
		mutate(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, k.Public(), a.key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

// mesh is the usual hierarchy: root -> intermediate (pathlen 0) -> leaf.
type mesh struct {
	root, inter authority
	leaf        *x509.Certificate
	leafKey     crypto.Signer
}

const workload = "spiffe://cluster.local/ns/default/sa/default"

func newMesh(t testing.TB) mesh {
	t.Helper()
	root := newRoot(t, pkix.Name{Organization: []string{"meshid"}, CommonName: "Root CA"}, now.Add(-24*time.Hour), 10*365*24*time.Hour)
	inter := root.intermediate(t, pkix.Name{Organization: []string{"meshid"}, CommonName: "Intermediate CA", Locality: []string{"west"}},
		now.Add(-24*time.Hour), 365*24*time.Hour, 0)
	leaf, key := inter.leaf(t, workload, now.Add(-2*time.Minute), 12*time.Hour, nil)
	return mesh{root: root, inter: inter, leaf: leaf, leafKey: key}
}
