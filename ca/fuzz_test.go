package ca_test

import (
	"context"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"net"
	"testing"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// FuzzParseAndCheckCSR feeds arbitrary bytes through ParseCSR and Sign. It
// must never panic, must fail only with InvalidArgument or
// PermissionDenied, and must only ever sign a non-CA leaf for the caller's
// own identity.
func FuzzParseAndCheckCSR(f *testing.F) {
	a := newAuthority(f, rootBundle(f, certs.ECP256, t0), clock.NewFake(t0))
	id := callerID.String()
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		// The hand-written parser reads what x509 reads, or leaves the
		// input to x509 (ca/csrparse.go).
		checkFastMatchesX509(t, data)
		checkPEMFastMatchesPEM(t, data) // the PEM decoder reads what encoding/pem reads
		if b, _ := pem.Decode(data); b != nil {
			checkFastMatchesX509(t, b.Bytes)
		}
		csr, err := ca.ParseCSR(data)
		if err != nil {
			if k := ca.KindOf(err); k != ca.KindInvalidArgument {
				t.Fatalf("ParseCSR error of kind %v: %v", k, err)
			}
			return
		}
		iss, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: callerID, Caller: "fuzz"})
		if err != nil {
			if k := ca.KindOf(err); k != ca.KindInvalidArgument && k != ca.KindPermissionDenied {
				t.Fatalf("Sign error of kind %v: %v", k, err)
			}
			return
		}
		leaf := iss.Leaf
		if leaf.IsCA || len(leaf.URIs) != 1 || leaf.URIs[0].String() != id ||
			len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0 {
			t.Fatalf("signed a leaf outside the profile: CA=%v URIs=%v DNS=%v IP=%v email=%v",
				leaf.IsCA, leaf.URIs, leaf.DNSNames, leaf.IPAddresses, leaf.EmailAddresses)
		}
		if err := leaf.CheckSignatureFrom(a.Bundle().Cert); err != nil {
			t.Fatalf("leaf does not verify: %v", err)
		}
	})
}

// fuzzSeeds is the seed corpus of FuzzParseAndCheckCSR, which the
// differential test of the CSR parser also reads.
func fuzzSeeds(t testing.TB) [][]byte {
	id := callerID.String()
	basicCA, _ := asn1.Marshal(struct {
		IsCA bool `asn1:"optional"`
	}{true})
	var seeds [][]byte
	for _, s := range []csrSpec{
		{uris: []string{id}},
		{},
		{key: mustKey(t, certs.RSA2048), uris: []string{id}},
		{key: mustKey(t, certs.Ed25519), uris: []string{id}},
		{key: mustKey(t, certs.ECP384), subject: pkix.Name{Organization: []string{""}}, uris: []string{id}},
		{uris: []string{otherID.String()}},
		{uris: []string{id, id}},
		{dns: []string{"a.example"}, ips: []net.IP{net.IPv4(10, 0, 0, 1)}, emails: []string{"x@y.example"}},
		{extra: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: basicCA}}},
	} {
		pemCSR, _ := mkCSR(t, s)
		seeds = append(seeds, pemCSR, append(append([]byte{}, pemCSR...), pemCSR...), pemCSR[:len(pemCSR)/2])
	}
	return append(seeds,
		istioCSR(t, mustKey(t, certs.ECP256), id, false),
		[]byte("-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----\n"),
		[]byte("not a CSR"),
		[]byte{})
}
