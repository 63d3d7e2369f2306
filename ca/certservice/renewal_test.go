package certservice_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

// TestClientCertRenewalNeverOutlivesThePresentedCert reproduces issue 9,
// hole 1 against the real server: a certificate proved by a token renews
// itself (no token) asking for the maximum TTL, then the renewed
// certificate renews itself again. On b96f7b0 each renewal was a fresh
// 90-day certificate, so a workload whose token expired and whose pod was
// deleted kept its identity forever. Now every renewed leaf ends no later
// than the token-proved certificate, and the audit line names the
// presented certificate's serial.
func TestClientCertRenewalNeverOutlivesThePresentedCert(t *testing.T) {
	logs := testkit.NewLogRecorder()
	e := newEnv(t, envOpts{caCfg: func(c *ca.Config) { c.Logger = logs.Logger() }})
	id := sid("shop", "cart")
	key := testkit.Key(t, certs.ECP256)
	resp, err := e.client(t, "localhost", nil).CreateCertificate(withToken(context.Background(), e.token(t, "shop", "cart")),
		&securityv1alpha1.IstioCertificateRequest{Csr: csrFor(t, key, id, nil), ValidityDuration: int64(time.Hour / time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	first := verifyChain(t, resp.CertChain, e.authority.Bundle().Roots, 0, id.String())

	presented := first
	for i := range 3 {
		c := e.client(t, "localhost", &tls.Certificate{Certificate: [][]byte{presented.Raw}, PrivateKey: key, Leaf: presented})
		resp, err := c.CreateCertificate(context.Background(), &securityv1alpha1.IstioCertificateRequest{
			Csr: csrFor(t, key, id, nil), ValidityDuration: int64(ca.DefaultMaxTTL / time.Second),
		})
		if err != nil {
			t.Fatalf("renewal %d: %v", i, err)
		}
		renewed := verifyChain(t, resp.CertChain, e.authority.Bundle().Roots, 0, id.String())
		if renewed.NotAfter.After(first.NotAfter) {
			t.Fatalf("renewal %d: NotAfter %s outlives the token-proved certificate's %s", i, renewed.NotAfter, first.NotAfter)
		}
		if want := "renewed_serial=" + presented.SerialNumber.Text(16); logs.CountContaining(want) != 1 {
			t.Fatalf("renewal %d: no audit line with %s in:\n%s", i, want, logs.All())
		}
		presented = renewed
	}
}

// TestCapTTLToToken: with ca.Config.CapTTLToToken, a leaf issued on a
// token ends when the token does; without it (the default, as Istio), it
// lives its requested TTL.
func TestCapTTLToToken(t *testing.T) {
	for _, capped := range []bool{false, true} {
		e := newEnv(t, envOpts{caCfg: func(c *ca.Config) { c.CapTTLToToken = capped }})
		id := sid("shop", "cart")
		now := time.Now()
		tok, err := e.issuer.Mint("shop", "cart", []string{"istio-ca"}, time.Hour, now)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := e.client(t, "localhost", nil).CreateCertificate(withToken(context.Background(), tok),
			&securityv1alpha1.IstioCertificateRequest{Csr: csrFor(t, testkit.Key(t, certs.ECP256), id, nil)})
		if err != nil {
			t.Fatal(err)
		}
		leaf := verifyChain(t, resp.CertChain, e.authority.Bundle().Roots, 0, id.String())
		tokenExp := now.Add(time.Hour)
		if got := leaf.NotAfter.After(tokenExp.Add(time.Second)); got == capped {
			t.Errorf("CapTTLToToken=%v: leaf NotAfter %s, token exp %s", capped, leaf.NotAfter, tokenExp)
		}
	}
}
