package certs_test

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"time"

	"github.com/meshid/meshid/certs"
)

// A root and an intermediate under it, written as PEM and read back,
// then verified as a chain.
func ExampleNewIntermediateCA() {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	rootKey, _ := certs.GenerateKey(certs.ECP256)
	root, err := certs.NewRootCA(certs.CASpec{
		Subject: pkix.Name{Organization: []string{"example"}, CommonName: "root"},
		Key:     rootKey, NotBefore: now, TTL: 10 * 365 * 24 * time.Hour, MaxPathLen: -1,
	})
	if err != nil {
		panic(err)
	}
	interKey, _ := certs.GenerateKey(certs.ECP256)
	inter, err := certs.NewIntermediateCA(certs.CASpec{
		Subject: pkix.Name{Organization: []string{"example"}, CommonName: "west"},
		Key:     interKey, NotBefore: now, TTL: 365 * 24 * time.Hour, MaxPathLen: 0,
	}, root, rootKey)
	if err != nil {
		panic(err)
	}
	pem := certs.EncodeCertificates(inter, root) // cert-chain.pem's order
	parsed, err := certs.ParseCertificates(pem)
	if err != nil {
		panic(err)
	}
	chains, err := certs.VerifyChain(parsed[:1], []*x509.Certificate{parsed[1]}, now.Add(time.Hour))
	fmt.Println(len(parsed), parsed[0].Subject.CommonName, certs.KeyTypeOf(parsed[0].PublicKey), len(chains), err)
	// Output: 2 west ec-p256 1 <nil>
}

// When a 24-hour certificate is renewed at the agent's default grace
// ratio of one half, without jitter.
func ExampleRenewAt() {
	notBefore := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	fmt.Println(certs.RenewAt(notBefore, notBefore.Add(24*time.Hour), 0.5, 0))
	// Output: 2026-12-04 12:00:00 +0000 UTC
}
