package ca_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// t0 is the tests' "now".
var t0 = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

var (
	td       = spiffeid.RequireTrustDomainFromString("cluster.local")
	callerID = spiffeid.RequireFromString("spiffe://cluster.local/ns/default/sa/default")
	otherID  = spiffeid.RequireFromString("spiffe://cluster.local/ns/default/sa/other")
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// rootBundle returns a self-signed root of key type kt as a bundle.
func rootBundle(t testing.TB, kt certs.KeyType, now time.Time) *keystore.Bundle {
	t.Helper()
	b, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: td.Name(), KeyType: kt, Clock: clock.NewFake(now)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// intermediateBundle returns root -> int -> signing CA, the signing CA with
// key type kt.
func intermediateBundle(t testing.TB, kt certs.KeyType, now time.Time) *keystore.Bundle {
	t.Helper()
	root := rootBundle(t, certs.ECP256, now)
	intKey := mustKey(t, certs.ECP256)
	inter, err := certs.NewIntermediateCA(certs.CASpec{
		Subject: pkix.Name{CommonName: "int", Organization: []string{td.Name()}}, Key: intKey,
		NotBefore: now.Add(-time.Hour), TTL: 5 * 365 * 24 * time.Hour, MaxPathLen: -1,
	}, root.Cert, root.Key)
	if err != nil {
		t.Fatal(err)
	}
	caKey := mustKey(t, kt)
	caCert, err := certs.NewIntermediateCA(certs.CASpec{
		Subject: pkix.Name{CommonName: "signing", Organization: []string{td.Name()}}, Key: caKey,
		NotBefore: now.Add(-time.Hour), TTL: 365 * 24 * time.Hour, MaxPathLen: 0,
	}, inter, intKey)
	if err != nil {
		t.Fatal(err)
	}
	return &keystore.Bundle{Cert: caCert, Key: caKey, Intermediates: []*x509.Certificate{inter}, Roots: root.Roots}
}

func mustKey(t testing.TB, kt certs.KeyType) crypto.Signer { return testkit.Key(t, kt) }

func newAuthority(t testing.TB, b *keystore.Bundle, clk clock.Clock) *ca.Authority {
	t.Helper()
	a, err := ca.New(ca.Config{TrustDomain: td, Bundle: b, Clock: clk, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// csrSpec describes a CSR to build.
type csrSpec struct {
	key     crypto.Signer // nil = a new P-256 key
	subject pkix.Name
	uris    []string
	dns     []string
	ips     []net.IP
	emails  []string
	extra   []pkix.Extension
}

// mkCSR returns a PEM CSR and its key.
func mkCSR(t testing.TB, s csrSpec) ([]byte, crypto.Signer) {
	t.Helper()
	if s.key == nil {
		s.key = mustKey(t, certs.ECP256)
	}
	tmpl := &x509.CertificateRequest{
		Subject:         s.subject,
		DNSNames:        s.dns,
		IPAddresses:     s.ips,
		EmailAddresses:  s.emails,
		ExtraExtensions: s.extra,
	}
	for _, u := range s.uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, s.key)
	if err != nil {
		t.Fatal(err)
	}
	return certs.EncodeCSR(der), s.key
}

// istioCSR builds a CSR the way istio-agent does: a subject with one empty
// Organization, and the SPIFFE ID as the only URI SAN in an extension the
// agent builds itself.
func istioCSR(t testing.TB, key crypto.Signer, id string, critical bool) []byte {
	t.Helper()
	san, err := asn1.Marshal([]asn1.RawValue{{Tag: 6, Class: asn1.ClassContextSpecific, Bytes: []byte(id)}})
	if err != nil {
		t.Fatal(err)
	}
	pemCSR, _ := mkCSR(t, csrSpec{
		key:     key,
		subject: pkix.Name{Organization: []string{""}},
		extra:   []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Critical: critical, Value: san}},
	})
	return pemCSR
}

// bigRSAKey returns an RSA key of more than 8192 bits. A two-prime key that
// size takes a minute to generate, so it is built from 16 small primes
// (crypto/rsa still signs with multi-prime keys).
func bigRSAKey(t testing.TB) *rsa.PrivateKey {
	t.Helper()
	one := big.NewInt(1)
	n, phi := big.NewInt(1), big.NewInt(1)
	var primes []*big.Int
	for len(primes) < 16 {
		p, err := rand.Prime(rand.Reader, 515)
		if err != nil {
			t.Fatal(err)
		}
		primes = append(primes, p)
		n.Mul(n, p)
		phi.Mul(phi, new(big.Int).Sub(p, one))
	}
	d := new(big.Int).ModInverse(big.NewInt(65537), phi)
	if d == nil {
		return bigRSAKey(t) // e not invertible; draw again
	}
	k := &rsa.PrivateKey{PublicKey: rsa.PublicKey{N: n, E: 65537}, D: d, Primes: primes}
	if n.BitLen() <= 8192 {
		t.Fatalf("big key has %d bits", n.BitLen())
	}
	return k
}

// parseAndSign runs a PEM CSR through ParseCSR and Sign.
func parseAndSign(a *ca.Authority, pemCSR []byte, id spiffeid.ID, ttl time.Duration) (*ca.Issued, error) {
	csr, err := ca.ParseCSR(pemCSR)
	if err != nil {
		return nil, err
	}
	return a.Sign(context.Background(), ca.Request{CSR: csr, ID: id, Caller: "default/default (test)", TTL: ttl})
}
