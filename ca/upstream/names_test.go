package upstream_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/upstream"
)

// constrainingCA signs each CSR as an intermediate (path length 0) under
// its root, with the URI name constraints it is given, as an upstream
// profile with name constraints does.
type constrainingCA struct {
	root               *x509.Certificate
	key                *ecdsa.PrivateKey
	permitted, exclude []string
}

func newConstrainingCA(t *testing.T) *constrainingCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "upstream root"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	root, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &constrainingCA{root: root, key: key}
}

func (c *constrainingCA) MintX509CA(_ context.Context, csrDER []byte, ttl time.Duration) (*upstream.Minted, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: csr.Subject, URIs: csr.URIs,
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(ttl),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign,
		PermittedURIDomains: c.permitted, ExcludedURIDomains: c.exclude,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.root, csr.PublicKey, c.key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &upstream.Minted{Chain: []*x509.Certificate{cert}, Roots: []*x509.Certificate{c.root}}, nil
}

// TestNameConstraintsOfTheIntermediate: an intermediate whose own URI
// name constraints leave out the trust domain is refused, and one that
// permits it is accepted. Each verdict is held against Go's verification
// of a workload leaf the intermediate signs: refused exactly when that
// leaf would not verify.
func TestNameConstraintsOfTheIntermediate(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	for _, tc := range []struct {
		name               string
		permitted, exclude []string
		refused            bool
	}{
		{name: "none"},
		{name: "permits the domain", permitted: []string{"example.org"}},
		{name: "permits it among others", permitted: []string{"other.org", "EXAMPLE.org"}},
		{name: "permits a parent", permitted: []string{"org"}},
		{name: "permits only subdomains", permitted: []string{".example.org"}, refused: true},
		{name: "permits another domain", permitted: []string{"other.org"}, refused: true},
		{name: "permits a subdomain", permitted: []string{"mesh.example.org"}, refused: true},
		{name: "excludes the domain", exclude: []string{"example.org"}, refused: true},
		{name: "excludes a parent", exclude: []string{"org"}, refused: true},
		{name: "excludes another", exclude: []string{"other.org"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newConstrainingCA(t)
			up.permitted, up.exclude = tc.permitted, tc.exclude
			r, err := upstream.NewRenewer(upstream.RenewerConfig{Upstream: up, TrustDomain: td, Lifetime: 2 * time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			b, err := r.Mint(context.Background())
			if tc.refused {
				if !errors.Is(err, upstream.ErrRefused) {
					t.Fatalf("minted with permitted %v, excluded %v: %v", tc.permitted, tc.exclude, err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			// What Go's verification says of a leaf under such an
			// intermediate (the upstream's key plays it when refused).
			inter := b
			if inter == nil {
				m, err := up.MintX509CA(context.Background(), csrFor(t, td, up.key), time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				if verifiesLeaf(t, td, m.Chain[0], up.key, up.root) {
					t.Fatal("refused an intermediate whose leaves verify")
				}
				return
			}
			signer, ok := inter.Key.(*ecdsa.PrivateKey)
			if !ok {
				t.Fatalf("software key %T", inter.Key)
			}
			if !verifiesLeaf(t, td, inter.Cert, signer, up.root) {
				t.Fatal("accepted an intermediate whose leaves do not verify")
			}
		})
	}
}

func csrFor(t *testing.T, td spiffeid.TrustDomain, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	u, _ := url.Parse(spiffeid.RequireFromPath(td, "").String())
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// verifiesLeaf signs a workload leaf of td with inter (key) and reports
// whether Go's x509 verifies it to root.
func verifiesLeaf(t *testing.T, td spiffeid.TrustDomain, inter *x509.Certificate, key *ecdsa.PrivateKey, root *x509.Certificate) bool {
	t.Helper()
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(spiffeid.RequireFromPath(td, "/ns/default/sa/app").String())
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), URIs: []*url.URL{u},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, inter, leafKey.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots, inters := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(root)
	inters.AddCert(inter)
	_, err = leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err == nil
}
