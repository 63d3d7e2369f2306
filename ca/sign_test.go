package ca_test

import (
	"crypto"
	"crypto/ed25519"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// flakySigner is a CA key outside the standard library (as an HSM or KMS
// signer would be) that signs correctly until broken is set, then returns
// a wrong signature without an error.
type flakySigner struct {
	crypto.Signer
	broken atomic.Bool
}

func (f *flakySigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	sig, err := f.Signer.Sign(r, digest, opts)
	if err == nil && f.broken.Load() {
		sig[len(sig)/2] ^= 0xff
	}
	return sig, err
}

// TestNonStandardSignerVerifiedEachTime (issue 19): a signer outside the
// standard library has each signature verified (ca/sign.go's verifyEach),
// so one that starts returning wrong signatures after the bundle's probe
// fails the request instead of serving a leaf no client will accept. With
// verifyEach false this test gets a leaf whose signature does not verify.
func TestNonStandardSignerVerifiedEachTime(t *testing.T) {
	for _, kt := range []certs.KeyType{certs.ECP256, certs.RSA2048, certs.Ed25519} {
		t.Run(string(kt), func(t *testing.T) {
			b := caBundle(t, kt)
			signer := &flakySigner{Signer: b.Key}
			b.Key = signer
			a := newAuthority(t, b, clock.NewFake(t0))
			pemCSR, _ := mkCSR(t, csrSpec{uris: []string{callerID.String()}})
			iss, err := parseAndSign(a, pemCSR, callerID, 0)
			if err != nil {
				t.Fatalf("a correct non-standard signer: %v", err)
			}
			if err := iss.Leaf.CheckSignatureFrom(b.Cert); err != nil {
				t.Fatal(err)
			}
			signer.broken.Store(true)
			iss, err = parseAndSign(a, pemCSR, callerID, 0)
			if err == nil {
				t.Fatalf("a wrong signature was served (leaf verifies: %v)", iss.Leaf.CheckSignatureFrom(b.Cert))
			}
			if ca.KindOf(err) != ca.KindInternal || !strings.Contains(err.Error(), "invalid signature") {
				t.Fatalf("err %v, want internal about an invalid signature", err)
			}
		})
	}
}

// TestBundleProbeRefusesMismatchedKey (issue 19): the probe leaf SetBundle
// signs must verify against the CA certificate (ca/sign.go's safety
// argument for not verifying each standard-library signature). An Ed25519
// key whose public half is the certificate's but whose seed is another
// key's passes keystore's key match and signs without an error, with
// signatures that never verify: only the probe's CheckSignatureFrom stops
// it. Without that check, New accepts the bundle and every leaf is bad.
func TestBundleProbeRefusesMismatchedKey(t *testing.T) {
	b := caBundle(t, certs.Ed25519)
	other := mustKey(t, certs.Ed25519).(ed25519.PrivateKey)
	own := b.Key.(ed25519.PrivateKey)
	mixed := append(append(ed25519.PrivateKey{}, other[:ed25519.SeedSize]...), own[ed25519.SeedSize:]...)
	if !certs.KeyMatches(b.Cert.PublicKey, mixed) {
		t.Fatal("the mixed key must pass the key match, or this test proves nothing")
	}
	bad := &keystore.Bundle{Cert: b.Cert, Key: mixed, Intermediates: b.Intermediates, Roots: b.Roots}
	if err := bad.Validate(t0); err != nil {
		t.Fatalf("keystore refuses the mixed key itself (%v): the probe is not what is tested", err)
	}
	_, err := ca.New(ca.Config{TrustDomain: td, Bundle: bad, Clock: clock.NewFake(t0), Logger: discard})
	if err == nil || !strings.Contains(err.Error(), "does not verify against the CA certificate") {
		t.Fatalf("New with a key that does not sign for its certificate: %v, want the probe's refusal", err)
	}
	a := newAuthority(t, b, clock.NewFake(t0))
	if err := a.SetBundle(bad); err == nil {
		t.Fatal("SetBundle accepted a key that does not sign for its certificate")
	}
	if a.Bundle() != b {
		t.Fatal("a refused bundle replaced the one in use")
	}
}

// caBundle is a self-signed root of key type kt, made with certs directly
// because keystore does not create Ed25519 roots (it accepts them).
func caBundle(t *testing.T, kt certs.KeyType) *keystore.Bundle {
	t.Helper()
	key := mustKey(t, kt)
	root, err := certs.NewRootCA(certs.CASpec{
		Subject: pkix.Name{CommonName: "root", Organization: []string{td.Name()}}, Key: key,
		NotBefore: t0.Add(-time.Hour), TTL: 10 * 365 * 24 * time.Hour, MaxPathLen: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &keystore.Bundle{Cert: root, Key: key, Roots: []*x509.Certificate{root}}
}
