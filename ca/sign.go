package ca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"time"
)

// Why leaves are not signed with cfssl or x509.CreateCertificate
//
// cfssl's local signer takes a PEM CSR, parses it again, merges a profile
// into a template and calls x509.CreateCertificate: the CSR would be
// parsed and its signature checked twice per request, and the profile
// machinery adds nothing to a fixed SPIFFE leaf profile.
//
// x509.CreateCertificate itself verifies the signature it has just made,
// "to ensure the crypto.Signer behaved correctly". With an ECDSA P-256 CA
// that verify costs about twice the sign, so it doubles the CA's share of
// the work. meshid builds the leaf's TBSCertificate itself (leaf.go, a
// fixed profile encoded exactly as Go encodes it) and signs it here,
// without that verify, because the checks it stands for are made once per
// bundle instead:
//   - SetBundle verifies that the key matches the CA certificate
//     (keystore.Bundle.Validate) and issues a probe leaf through this very
//     path, which must parse and verify against the CA certificate before
//     the bundle is used (probe below);
//   - the standard library's own keys sign correctly or fail: crypto/rsa
//     already checks every RSA signature against the CRT fault attack, and
//     ECDSA and Ed25519 signing has no such failure mode;
//   - any other crypto.Signer (an HSM, a KMS, PKCS#11) is not trusted that
//     way: each of its signatures is still verified (verifyEach).
// A wrong signature could only make clients reject a leaf; it cannot make
// them accept a wrong one.

// signTBS signs a DER TBSCertificate with the issuer's key. It is the only
// place that touches the CA key on the hot path.
func (is *issuer) signTBS(tbs []byte) ([]byte, error) {
	sig, err := crypto.SignMessage(is.key, rand.Reader, tbs, is.signOpts)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	if is.verifyEach {
		if err := is.cert.CheckSignature(is.sigAlg, tbs, sig); err != nil {
			return nil, fmt.Errorf("signer returned an invalid signature: %w", err)
		}
	}
	return sig, nil
}

// issue builds and signs one leaf. Its *x509.Certificate is filled from
// the values just encoded (leafCert), not parsed back from the DER: the
// parse cost 5% of the CA's CPU per certificate and can only return what
// was encoded. That this holds is checked where it can fail, once per
// bundle: the probe parses its leaf with x509.ParseCertificate and
// requires the parsed and the built certificate to be equal, and
// TestLeafStructIsParsed does the same for every CA and leaf key type.
func (is *issuer) issue(s *leafSpec) (*x509.Certificate, error) {
	san, err := sanValue(s.uri)
	if err != nil {
		return nil, fmt.Errorf("encode leaf: %w", err)
	}
	tbs, err := is.tbs(s, san)
	if err != nil {
		return nil, fmt.Errorf("encode leaf: %w", err)
	}
	sig, err := is.signTBS(tbs)
	if err != nil {
		return nil, err
	}
	der, err := is.certificate(tbs, sig)
	if err != nil {
		return nil, fmt.Errorf("encode leaf: %w", err)
	}
	leaf, err := is.leafCert(s, der, san, sig)
	if err != nil {
		return nil, fmt.Errorf("encode leaf: %w", err)
	}
	return leaf, nil
}

// standardKey reports whether k is one of the standard library's in-memory
// private keys.
func standardKey(k crypto.Signer) bool {
	switch k.(type) {
	case *ecdsa.PrivateKey, *rsa.PrivateKey, ed25519.PrivateKey:
		return true
	}
	return false
}

const probeID = "spiffe://probe.invalid/probe"

// probe issues a throwaway leaf for the CA's own public key and checks that
// its DER parses, carries the profile and verifies against the CA
// certificate, and that the *x509.Certificate issue returns is the parsed
// DER, so a bundle whose signer or encoding misbehaves is refused before use.
func (is *issuer) probe(now time.Time) error {
	spki, err := x509.MarshalPKIXPublicKey(is.cert.PublicKey)
	if err != nil {
		return err
	}
	built, err := is.issue(&leafSpec{
		serial:    big.NewInt(1),
		notBefore: now,
		notAfter:  now.Add(time.Minute),
		pub:       is.cert.PublicKey,
		spki:      spki,
		uri:       probeID,
	})
	if err != nil {
		return err
	}
	leaf, err := x509.ParseCertificate(built.Raw)
	if err != nil {
		return fmt.Errorf("parse own leaf: %w", err)
	}
	if err := leaf.CheckSignatureFrom(is.cert); err != nil {
		return fmt.Errorf("probe leaf does not verify against the CA certificate: %w", err)
	}
	if leaf.IsCA || len(leaf.URIs) != 1 || leaf.URIs[0].String() != probeID || len(leaf.Subject.Names) != 0 {
		return errors.New("probe leaf does not have the leaf profile")
	}
	if !reflect.DeepEqual(built, leaf) {
		return errors.New("probe leaf: the certificate built for it is not its parsed DER")
	}
	return nil
}
