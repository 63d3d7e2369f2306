package authn_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newTestRoot(t *testing.T, name string) testCA {
	t.Helper()
	key := mustKey(t)
	c, err := certs.NewRootCA(certs.CASpec{Subject: pkix.Name{Organization: []string{name}}, Key: key, NotBefore: t0.Add(-time.Hour), TTL: 24 * time.Hour, MaxPathLen: -1})
	if err != nil {
		t.Fatal(err)
	}
	return testCA{c, key}
}

func (p testCA) intermediate(t *testing.T) testCA {
	t.Helper()
	key := mustKey(t)
	c, err := certs.NewIntermediateCA(certs.CASpec{Subject: pkix.Name{Organization: []string{"int"}}, Key: key, NotBefore: t0.Add(-time.Hour), TTL: 24 * time.Hour}, p.cert, p.key)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{c, key}
}

// leaf issues a workload certificate for uri; mod may change the template.
func (p testCA) leaf(t *testing.T, uri string, mod func(*x509.Certificate)) *x509.Certificate {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := certs.NewSerial()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    t0.Add(-time.Minute),
		NotAfter:     t0.Add(time.Hour),
		URIs:         []*url.URL{u},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if mod != nil {
		mod(tmpl)
	}
	return testkit.Certificate(t, tmpl, p.cert, mustKey(t).Public(), p.key)
}

func TestClientCert(t *testing.T) {
	root := newTestRoot(t, "cluster.local")
	other := newTestRoot(t, "other")
	inter := root.intermediate(t)
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	const good = "spiffe://cluster.local/ns/prod/sa/api"

	tests := []struct {
		name          string
		peer          []*x509.Certificate
		intermediates []*x509.Certificate
		now           time.Time
		want          *authn.Caller
		noCreds       bool
	}{
		{name: "valid leaf", peer: []*x509.Certificate{root.leaf(t, good, nil)}, want: &authn.Caller{Namespace: "prod", ServiceAccount: "api", Method: "clientcert"}},
		{name: "leaf with presented intermediate", peer: []*x509.Certificate{inter.leaf(t, good, nil), inter.cert}, want: &authn.Caller{Namespace: "prod", ServiceAccount: "api", Method: "clientcert"}},
		{name: "leaf with CA's own intermediate", peer: []*x509.Certificate{inter.leaf(t, good, nil)}, intermediates: []*x509.Certificate{inter.cert}, want: &authn.Caller{Namespace: "prod", ServiceAccount: "api", Method: "clientcert"}},
		{name: "no certificate", noCreds: true},
		{name: "leaf via unknown intermediate", peer: []*x509.Certificate{inter.leaf(t, good, nil)}},
		{name: "expired", peer: []*x509.Certificate{root.leaf(t, good, nil)}, now: t0.Add(2 * time.Hour)},
		{name: "other CA", peer: []*x509.Certificate{other.leaf(t, good, nil)}},
		{name: "foreign trust domain", peer: []*x509.Certificate{root.leaf(t, "spiffe://evil.org/ns/prod/sa/api", nil)}},
		{name: "not an ns/sa path", peer: []*x509.Certificate{root.leaf(t, "spiffe://cluster.local/workload/api", nil)}},
		{name: "empty sa", peer: []*x509.Certificate{root.leaf(t, "spiffe://cluster.local/ns/prod/sa", nil)}},
		{name: "no clientAuth", peer: []*x509.Certificate{root.leaf(t, good, func(c *x509.Certificate) {
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		})}},
		{name: "CA certificate", peer: []*x509.Certificate{root.leaf(t, good, func(c *x509.Certificate) {
			c.IsCA, c.BasicConstraintsValid = true, true
			c.KeyUsage |= x509.KeyUsageCertSign
		})}},
		{name: "no SPIFFE ID", peer: []*x509.Certificate{root.leaf(t, good, func(c *x509.Certificate) { c.URIs = nil; c.DNSNames = []string{"api"} })}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := tc.now
			if now.IsZero() {
				now = t0
			}
			cfg := authn.ClientCertConfig{TrustDomain: td, Roots: func() []*x509.Certificate { return []*x509.Certificate{root.cert} }, Clock: clock.NewFake(now)}
			if tc.intermediates != nil {
				cfg.Intermediates = func() []*x509.Certificate { return tc.intermediates }
			}
			a, err := authn.NewClientCert(cfg)
			if err != nil {
				t.Fatal(err)
			}
			c, err := a.Authenticate(context.Background(), authn.Credentials{PeerCertificates: tc.peer})
			switch {
			case tc.noCreds:
				if !errors.Is(err, authn.ErrNoCredentials) {
					t.Fatalf("err %v, want ErrNoCredentials", err)
				}
			case tc.want != nil:
				if err != nil {
					t.Fatal(err)
				}
				if !c.Expiry.Equal(tc.peer[0].NotAfter) {
					t.Fatalf("expiry %v, want the leaf's NotAfter", c.Expiry)
				}
				if c.Certificate != tc.peer[0] {
					t.Fatalf("Certificate is not the presented leaf")
				}
				c.Expiry, c.Certificate = time.Time{}, nil
				if *c != *tc.want {
					t.Fatalf("caller %+v, want %+v", *c, *tc.want)
				}
			default:
				wantKind(t, err, ca.KindUnauthenticated, "")
			}
		})
	}
}

func TestClientCertConfig(t *testing.T) {
	if _, err := authn.NewClientCert(authn.ClientCertConfig{Roots: func() []*x509.Certificate { return nil }}); err == nil {
		t.Fatal("no trust domain accepted")
	}
	if _, err := authn.NewClientCert(authn.ClientCertConfig{TrustDomain: spiffeid.RequireTrustDomainFromString("x")}); err == nil {
		t.Fatal("no roots accepted")
	}
}
