package testkit

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// NewAuthority returns a real CA for td with a fresh ec-p256 self-signed
// root, on clk (nil = the real clock), logging nothing, registering its
// metrics with reg (nil = none).
func NewAuthority(t testing.TB, td spiffeid.TrustDomain, clk clock.Clock, reg prometheus.Registerer) *ca.Authority {
	t.Helper()
	b, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: td.Name(), KeyType: certs.ECP256, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	a, err := ca.New(ca.Config{TrustDomain: td, Bundle: b, Clock: clk, Logger: slog.New(slog.DiscardHandler), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// AuthoritySigner is a secretcache.Signer that signs with an in-process
// ca.Authority: the CA's whole signing path without the gRPC hop. The chain
// it returns is the leaf then the Authority's chain; the roots come
// separately, as over CreateCertificate.
type AuthoritySigner struct {
	Authority *ca.Authority
	// ID is the identity issued to; zero = the SPIFFE ID the CSR names (the
	// agent's CA client would prove it with a token).
	ID spiffeid.ID
	// Caller names the caller in the Authority's logs.
	Caller string
}

func (s AuthoritySigner) Sign(ctx context.Context, req *x509.CertificateRequest, ttl time.Duration) (chain, roots []*x509.Certificate, err error) {
	// The CSR goes through the CA's own parser, as it would over the wire.
	csr, err := ca.ParseCSR(certs.EncodeCSR(req.Raw))
	if err != nil {
		return nil, nil, err
	}
	id := s.ID
	if id.IsZero() {
		if id, err = x509svid.IDFromCert(&x509.Certificate{URIs: csr.Request().URIs}); err != nil {
			return nil, nil, err
		}
	}
	iss, err := s.Authority.Sign(ctx, ca.Request{CSR: csr, ID: id, Caller: s.Caller, TTL: ttl})
	if err != nil {
		return nil, nil, err
	}
	return append([]*x509.Certificate{iss.Leaf}, iss.Chain...), iss.Roots, nil
}

// Plugged returns the files of an operator's CA in Istio's cacerts layout
// (what `kubectl create secret generic cacerts` or a mounted --ca-dir
// holds): an intermediate (ca-cert.pem, the key that signs) under a new
// root, named name. It returns the intermediate and the root.
func Plugged(t testing.TB, name string) (files map[string][]byte, inter, root *x509.Certificate) {
	t.Helper()
	now := time.Now()
	root, rootKey := Root(t, certs.CASpec{Subject: pkix.Name{CommonName: name + " root"},
		NotBefore: now.Add(-time.Hour), TTL: 48 * time.Hour, MaxPathLen: -1})
	key := Key(t, certs.ECP256)
	inter, err := certs.NewIntermediateCA(certs.CASpec{Subject: pkix.Name{CommonName: name + " intermediate"}, Key: key,
		NotBefore: now.Add(-time.Hour), TTL: 24 * time.Hour, MaxPathLen: 0}, root, rootKey)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := certs.EncodePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		keystore.CACertFile:    certs.EncodeCertificates(inter),
		keystore.CAKeyFile:     keyPEM,
		keystore.CertChainFile: certs.EncodeCertificates(inter, root),
		keystore.RootCertFile:  certs.EncodeCertificates(root),
	}, inter, root
}
