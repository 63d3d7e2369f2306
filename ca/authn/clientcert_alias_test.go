package authn_test

import (
	"context"
	"crypto/x509"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/internal/clock"
)

// TestClientCertTrustDomainAliases: a certificate of an alias trust domain,
// signed by this CA, renews the same namespace and service account; one
// of a trust domain that is not an alias is still refused.
func TestClientCertTrustDomainAliases(t *testing.T) {
	root := newTestRoot(t, "cluster.local")
	roots := func() []*x509.Certificate { return []*x509.Certificate{root.cert} }
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	old := spiffeid.RequireTrustDomainFromString("old.example")
	alias := root.leaf(t, "spiffe://old.example/ns/prod/sa/api", nil)
	stranger := root.leaf(t, "spiffe://evil.example/ns/prod/sa/api", nil)

	plain, err := authn.NewClientCert(authn.ClientCertConfig{TrustDomain: td, Roots: roots, Clock: clock.NewFake(t0)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Authenticate(context.Background(), authn.Credentials{PeerCertificates: []*x509.Certificate{alias}}); ca.KindOf(err) != ca.KindUnauthenticated {
		t.Fatalf("without aliases: %v, want Unauthenticated", err)
	}
	cc, err := authn.NewClientCert(authn.ClientCertConfig{TrustDomain: td, TrustDomainAliases: []spiffeid.TrustDomain{old}, Roots: roots, Clock: clock.NewFake(t0)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cc.Authenticate(context.Background(), authn.Credentials{PeerCertificates: []*x509.Certificate{alias}})
	if err != nil || c.Namespace != "prod" || c.ServiceAccount != "api" || c.Certificate != alias {
		t.Fatalf("alias: %v %+v", err, c)
	}
	if id, _ := c.ID(td); id.String() != "spiffe://cluster.local/ns/prod/sa/api" {
		t.Fatalf("renews %s", id)
	}
	if _, err := cc.Authenticate(context.Background(), authn.Credentials{PeerCertificates: []*x509.Certificate{stranger}}); ca.KindOf(err) != ca.KindUnauthenticated {
		t.Fatalf("not an alias: %v", err)
	}
	if _, err := authn.NewClientCert(authn.ClientCertConfig{TrustDomain: td, TrustDomainAliases: []spiffeid.TrustDomain{{}}, Roots: roots}); err == nil {
		t.Fatal("an empty alias accepted")
	}
}
