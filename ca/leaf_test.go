package ca_test

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"encoding/asn1"
	"math/big"
	"reflect"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

var oidSAN = asn1.ObjectIdentifier{2, 5, 29, 17}

func TestLeafProfile(t *testing.T) {
	bundles := map[string]*keystore.Bundle{
		"root ec-p256":         rootBundle(t, certs.ECP256, t0),
		"root rsa-2048":        rootBundle(t, certs.RSA2048, t0),
		"intermediate ec-p384": intermediateBundle(t, certs.ECP384, t0),
	}
	leafKeys := []certs.KeyType{certs.ECP256, certs.ECP384, certs.RSA2048, certs.Ed25519}
	for bname, b := range bundles {
		for _, kt := range leafKeys {
			t.Run(bname+"/"+string(kt), func(t *testing.T) {
				clk := clock.NewFake(t0)
				a := newAuthority(t, b, clk)
				pemCSR, key := mkCSR(t, csrSpec{key: mustKey(t, kt), uris: []string{callerID.String()}})
				iss, err := parseAndSign(a, pemCSR, callerID, 0)
				if err != nil {
					t.Fatal(err)
				}
				leaf := iss.Leaf
				checkLeaf(t, leaf, b, kt)
				if want := t0.Add(-ca.DefaultClockSkew); !leaf.NotBefore.Equal(want) {
					t.Errorf("NotBefore %v, want now - skew = %v", leaf.NotBefore, want)
				}
				if want := t0.Add(ca.DefaultTTL); !leaf.NotAfter.Equal(want) {
					t.Errorf("NotAfter %v, want now + 24h = %v", leaf.NotAfter, want)
				}
				if !certs.KeyMatches(leaf.PublicKey, key) {
					t.Errorf("leaf key is not the CSR's key")
				}

				// The chain: Cert (unless a root) then the intermediates.
				wantChain := append([]*x509.Certificate{}, b.Intermediates...)
				if len(b.Intermediates) > 0 {
					wantChain = append([]*x509.Certificate{b.Cert}, wantChain...)
				}
				if len(iss.Chain) != len(wantChain) {
					t.Fatalf("chain has %d certs, want %d", len(iss.Chain), len(wantChain))
				}
				for i := range wantChain {
					if !iss.Chain[i].Equal(wantChain[i]) {
						t.Errorf("chain[%d] = %s, want %s", i, iss.Chain[i].Subject, wantChain[i].Subject)
					}
				}
				verifyChain(t, iss, t0)

				// go-spiffe accepts it as an X509-SVID with its key.
				keyDER, err := x509.MarshalPKCS8PrivateKey(key)
				if err != nil {
					t.Fatal(err)
				}
				var raw []byte
				for _, c := range append([]*x509.Certificate{leaf}, iss.Chain...) {
					raw = append(raw, c.Raw...)
				}
				svid, err := x509svid.ParseRaw(raw, keyDER)
				if err != nil {
					t.Fatalf("x509svid.ParseRaw: %v", err)
				}
				if svid.ID != callerID {
					t.Errorf("SVID ID %s, want %s", svid.ID, callerID)
				}
				id, _, err := x509svid.Verify(append([]*x509.Certificate{leaf}, iss.Chain...), x509bundle.FromX509Authorities(td, iss.Roots),
					x509svid.WithTime(t0))
				if err != nil || id != callerID {
					t.Fatalf("x509svid.Verify = %v, %v", id, err)
				}
			})
		}
	}
}

// checkLeaf asserts the leaf profile.
func checkLeaf(t *testing.T, leaf *x509.Certificate, b *keystore.Bundle, kt certs.KeyType) {
	t.Helper()
	if !bytes.Equal(leaf.RawSubject, []byte{0x30, 0}) || len(leaf.Subject.Names) != 0 {
		t.Errorf("subject %q, want empty", leaf.Subject)
	}
	sanCritical := false
	nSAN := 0
	for _, e := range leaf.Extensions {
		if e.Id.Equal(oidSAN) {
			nSAN++
			sanCritical = e.Critical
		}
	}
	if nSAN != 1 || !sanCritical {
		t.Errorf("subjectAltName: %d extensions, critical=%v; want one, critical", nSAN, sanCritical)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != callerID.String() {
		t.Errorf("URIs %v, want [%s]", leaf.URIs, callerID)
	}
	if len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0 {
		t.Errorf("unexpected SANs: %v %v %v", leaf.DNSNames, leaf.IPAddresses, leaf.EmailAddresses)
	}
	if leaf.SerialNumber.Sign() <= 0 || leaf.SerialNumber.BitLen() > 128 {
		t.Errorf("serial %x is not a positive 128-bit number", leaf.SerialNumber)
	}
	wantKU := x509.KeyUsageDigitalSignature
	if kt == certs.RSA2048 {
		wantKU |= x509.KeyUsageKeyEncipherment
	}
	if leaf.KeyUsage != wantKU {
		t.Errorf("KeyUsage %b, want %b", leaf.KeyUsage, wantKU)
	}
	if len(leaf.ExtKeyUsage) != 2 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth || leaf.ExtKeyUsage[1] != x509.ExtKeyUsageClientAuth {
		t.Errorf("ExtKeyUsage %v, want [serverAuth clientAuth]", leaf.ExtKeyUsage)
	}
	if !leaf.BasicConstraintsValid || leaf.IsCA {
		t.Errorf("basicConstraints valid=%v CA=%v, want present and CA:false", leaf.BasicConstraintsValid, leaf.IsCA)
	}
	if len(b.Cert.SubjectKeyId) == 0 || !bytes.Equal(leaf.AuthorityKeyId, b.Cert.SubjectKeyId) {
		t.Errorf("AuthorityKeyId %x, want issuer SKI %x", leaf.AuthorityKeyId, b.Cert.SubjectKeyId)
	}
	if !bytes.Equal(leaf.RawIssuer, b.Cert.RawSubject) {
		t.Errorf("issuer %s, want %s", leaf.Issuer, b.Cert.Subject)
	}
	if want := certs.SignatureAlgorithmFor(b.Cert.PublicKey); leaf.SignatureAlgorithm != want {
		t.Errorf("signature algorithm %v, want %v", leaf.SignatureAlgorithm, want)
	}
	if err := leaf.CheckSignatureFrom(b.Cert); err != nil {
		t.Errorf("leaf signature: %v", err)
	}
}

// verifyChain verifies the leaf to the roots for both TLS usages.
func verifyChain(t *testing.T, iss *ca.Issued, now time.Time) {
	t.Helper()
	opts := x509.VerifyOptions{Roots: x509.NewCertPool(), Intermediates: x509.NewCertPool(), CurrentTime: now}
	for _, r := range iss.Roots {
		opts.Roots.AddCert(r)
	}
	for _, c := range iss.Chain {
		opts.Intermediates.AddCert(c)
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		opts.KeyUsages = []x509.ExtKeyUsage{u}
		if _, err := iss.Leaf.Verify(opts); err != nil {
			t.Errorf("x509.Verify (%v): %v", u, err)
		}
	}
}

func TestSerialsDiffer(t *testing.T) {
	a := newAuthority(t, rootBundle(t, certs.ECP256, t0), clock.NewFake(t0))
	seen := map[string]bool{}
	for i := 0; i < 50; i++ {
		pemCSR, _ := mkCSR(t, csrSpec{})
		iss, err := parseAndSign(a, pemCSR, callerID, 0)
		if err != nil {
			t.Fatal(err)
		}
		s := iss.Leaf.SerialNumber.String()
		if seen[s] {
			t.Fatalf("serial %s issued twice", s)
		}
		seen[s] = true
	}
}

// TestLeafMatchesCreateCertificate checks that the hand-built leaf is the
// certificate x509.CreateCertificate builds from the same template: same
// TBSCertificate bytes, including GeneralizedTime after 2049 and the
// authorityKeyIdentifier, for each CA and leaf key type.
func TestLeafMatchesCreateCertificate(t *testing.T) {
	late := time.Date(2049, 12, 31, 12, 0, 0, 0, time.UTC) // NotAfter crosses into 2050
	early := time.Date(1950, 1, 1, 12, 0, 0, 0, time.UTC)  // the first year of UTCTime
	tests := []struct {
		name   string
		bundle *keystore.Bundle
		now    time.Time
		leaf   certs.KeyType
	}{
		{"ec-p256 CA, ec-p256 leaf", rootBundle(t, certs.ECP256, t0), t0, certs.ECP256},
		{"ec-p256 CA, rsa-2048 leaf", rootBundle(t, certs.ECP256, t0), t0, certs.RSA2048},
		{"ec-p384 CA, ed25519 leaf", intermediateBundle(t, certs.ECP384, t0), t0, certs.Ed25519},
		{"rsa-3072 CA, ec-p384 leaf", rootBundle(t, certs.RSA3072, t0), t0, certs.ECP384},
		{"rsa-4096 CA, ec-p256 leaf: a signature longer than the TBSCertificate", rootBundle(t, certs.RSA4096, t0), t0, certs.ECP256},
		{"ec-p256 CA, NotAfter in 2050", rootBundle(t, certs.ECP256, late), late, certs.ECP256},
		{"ec-p256 CA, NotBefore in 1950", rootBundle(t, certs.ECP256, early), early, certs.ECP256},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newAuthority(t, tc.bundle, clock.NewFake(tc.now))
			pemCSR, _ := mkCSR(t, csrSpec{key: mustKey(t, tc.leaf)})
			iss, err := parseAndSign(a, pemCSR, callerID, 0)
			if err != nil {
				t.Fatal(err)
			}
			leaf := iss.Leaf
			tmpl := &x509.Certificate{
				SerialNumber:          leaf.SerialNumber,
				NotBefore:             leaf.NotBefore,
				NotAfter:              leaf.NotAfter,
				URIs:                  leaf.URIs,
				KeyUsage:              leaf.KeyUsage,
				ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
				BasicConstraintsValid: true,
			}
			der, err := x509.CreateCertificate(rand.Reader, tmpl, tc.bundle.Cert, leaf.PublicKey, tc.bundle.Key)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(leaf.RawTBSCertificate, ref.RawTBSCertificate) {
				t.Errorf("TBSCertificate differs from x509.CreateCertificate's\n got %x\nwant %x", leaf.RawTBSCertificate, ref.RawTBSCertificate)
			}
			if tc.now == late && leaf.NotAfter.Year() != 2050 {
				t.Errorf("NotAfter %v, want a 2050 date", leaf.NotAfter)
			}
			if tc.now == early && leaf.NotBefore.Year() != 1950 {
				t.Errorf("NotBefore %v, want a 1950 date", leaf.NotBefore)
			}
		})
	}
}

// TestLeafStructIsParsed checks that the *x509.Certificate Sign returns,
// which ca/sign.go builds from the values it encoded instead of parsing the
// DER back, is exactly what x509.ParseCertificate reads from the DER: every
// field, for each CA key (root and intermediate) and each leaf key type,
// before and after 2050. (A CA without a subject key identifier is
// covered by the probe, which compares the two for every bundle.)
func TestLeafStructIsParsed(t *testing.T) {
	late := time.Date(2049, 12, 31, 12, 0, 0, 0, time.UTC)
	bundles := []struct {
		name string
		b    *keystore.Bundle
		now  time.Time
	}{
		{"root ec-p256", rootBundle(t, certs.ECP256, t0), t0},
		{"root rsa-2048", rootBundle(t, certs.RSA2048, t0), t0},
		{"intermediate ec-p384", intermediateBundle(t, certs.ECP384, t0), t0},
		{"root ec-p256, NotAfter in 2050", rootBundle(t, certs.ECP256, late), late},
	}
	for _, bc := range bundles {
		for _, kt := range []certs.KeyType{certs.ECP256, certs.ECP384, certs.RSA2048, certs.Ed25519} {
			t.Run(bc.name+"/"+string(kt), func(t *testing.T) {
				a := newAuthority(t, bc.b, clock.NewFake(bc.now.Add(123*time.Millisecond)))
				pemCSR, _ := mkCSR(t, csrSpec{key: mustKey(t, kt), uris: []string{callerID.String()}})
				iss, err := parseAndSign(a, pemCSR, callerID, 0)
				if err != nil {
					t.Fatal(err)
				}
				parsed, err := x509.ParseCertificate(iss.Leaf.Raw)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(iss.Leaf, parsed) {
					t.Errorf("the returned leaf is not its parsed DER:\n got %+v\nwant %+v", iss.Leaf, parsed)
				}
			})
		}
	}
}

// TestMarshalSPKIMatchesX509: the leaf's SubjectPublicKeyInfo is
// x509.MarshalPKIXPublicKey's, byte for byte, for every key type (P-256 by
// hand, the others through x509), and a P-256 point off the curve is an
// error both ways.
func TestMarshalSPKIMatchesX509(t *testing.T) {
	var keys []crypto.PublicKey
	for range 64 {
		keys = append(keys, mustKey(t, certs.ECP256).Public())
	}
	for _, kt := range []certs.KeyType{certs.ECP384, certs.RSA2048, certs.Ed25519} {
		keys = append(keys, mustKey(t, kt).Public())
	}
	for _, k := range keys {
		got, err := ca.MarshalSPKI(k)
		want, werr := x509.MarshalPKIXPublicKey(k)
		if err != nil || werr != nil || !bytes.Equal(got, want) {
			t.Fatalf("%T: %x, %v; x509: %x, %v", k, got, err, want, werr)
		}
	}
	p := *mustKey(t, certs.ECP256).Public().(*ecdsa.PublicKey)
	p.X = new(big.Int).Add(p.X, big.NewInt(1))
	if _, err := ca.MarshalSPKI(&p); err == nil {
		t.Fatal("a point off the curve was encoded")
	}
	if _, err := x509.MarshalPKIXPublicKey(&p); err == nil {
		t.Fatal("x509 encoded a point off the curve: the comparison above is moot")
	}
}
