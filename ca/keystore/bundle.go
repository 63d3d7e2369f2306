package keystore

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/meshid/meshid/certs"
)

// Bundle is the CA's signing material.
type Bundle struct {
	Cert          *x509.Certificate   // the signing CA certificate (may be the root itself)
	Key           crypto.Signer       // its private key
	Intermediates []*x509.Certificate // certs between Cert and the root, issuer order, excluding Cert and roots
	Roots         []*x509.Certificate // the root bundle (one or more self-signed roots)
}

// names says how errors refer to the parts of a bundle: file names when the
// bundle was loaded from files, roles otherwise.
type names struct {
	cert, key, chain, roots string
}

var roleNames = names{
	cert:  "signing certificate",
	key:   "signing key",
	chain: "intermediates",
	roots: "roots",
}

// minRSABits is the smallest RSA key meshid accepts for a CA.
const minRSABits = 2048

// Validate checks that the key matches Cert, that Cert is a CA allowed to
// sign certificates, that Intermediates (in issuer order) chain Cert to one
// of Roots, and that every certificate is valid at now.
func (b *Bundle) Validate(now time.Time) error {
	_, err := b.check(now, roleNames, true)
	return err
}

// check validates b and returns the intermediates in issuer order, as found
// by path building. With strictOrder, b.Intermediates must already be that
// exact sequence.
func (b *Bundle) check(now time.Time, n names, strictOrder bool) ([]*x509.Certificate, error) {
	if b == nil || b.Cert == nil {
		return nil, fmt.Errorf("keystore: %s: no CA certificate", n.cert)
	}
	if b.Key == nil {
		return nil, fmt.Errorf("keystore: %s: no private key", n.key)
	}
	if len(b.Roots) == 0 {
		return nil, fmt.Errorf("keystore: %s: no root certificate", n.roots)
	}
	if err := checkCAKey(b.Cert.PublicKey); err != nil {
		return nil, fmt.Errorf("keystore: %s: %w", n.cert, err)
	}
	if !certs.KeyMatches(b.Cert.PublicKey, b.Key) {
		return nil, fmt.Errorf("keystore: %s: private key does not match the certificate in %s", n.key, n.cert)
	}
	if err := checkCA(b.Cert, true); err != nil {
		return nil, fmt.Errorf("keystore: %s: %w", n.cert, err)
	}
	if err := checkValidity(b.Cert, now); err != nil {
		return nil, fmt.Errorf("keystore: %s: %w", n.cert, err)
	}
	for _, c := range b.Intermediates {
		if err := checkCA(c, false); err != nil {
			return nil, fmt.Errorf("keystore: %s: %w", n.chain, err)
		}
		if err := checkValidity(c, now); err != nil {
			return nil, fmt.Errorf("keystore: %s: %w", n.chain, err)
		}
	}
	for _, c := range b.Roots {
		if err := checkCA(c, false); err != nil {
			return nil, fmt.Errorf("keystore: %s: %w", n.roots, err)
		}
		if err := checkValidity(c, now); err != nil {
			return nil, fmt.Errorf("keystore: %s: %w", n.roots, err)
		}
	}

	chains, err := certs.VerifyChain(append([]*x509.Certificate{b.Cert}, b.Intermediates...), b.Roots, now)
	if err != nil {
		return nil, fmt.Errorf("keystore: %s does not chain to %s (intermediates from %s): %w", n.cert, n.roots, n.chain, err)
	}
	for _, ch := range chains {
		var mid []*x509.Certificate // nil when Cert is itself one of the roots
		if len(ch) > 2 {
			mid = ch[1 : len(ch)-1]
		}
		if !strictOrder || sameCerts(mid, b.Intermediates) {
			return mid, nil
		}
	}
	return nil, fmt.Errorf("keystore: %s: intermediates must be in issuer order (the certificate that signed %s first) and contain only the chain", n.chain, n.cert)
}

// checkCAKey rejects signing keys that are too weak or that meshid cannot
// sign leaves with.
func checkCAKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < minRSABits {
			return fmt.Errorf("RSA key of %d bits is too weak for a CA (minimum %d)", k.N.BitLen(), minRSABits)
		}
		return nil
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
			return nil
		}
		return fmt.Errorf("unsupported EC curve %s for a CA", k.Curve.Params().Name)
	case ed25519.PublicKey:
		return nil
	}
	return fmt.Errorf("unsupported CA key type %T", pub)
}

// checkCA requires basicConstraints CA:true and, for the signing
// certificate, a keyUsage that allows certificate signing. A certificate
// without a keyUsage extension is not restricted (RFC 5280, 4.2.1.3).
func checkCA(c *x509.Certificate, signing bool) error {
	if !c.BasicConstraintsValid || !c.IsCA {
		return fmt.Errorf("certificate %q is not a CA (basicConstraints CA:true missing)", subject(c))
	}
	if signing && c.KeyUsage != 0 && c.KeyUsage&x509.KeyUsageCertSign == 0 {
		return fmt.Errorf("certificate %q may not sign certificates (keyUsage lacks keyCertSign)", subject(c))
	}
	return nil
}

func checkValidity(c *x509.Certificate, now time.Time) error {
	if now.Before(c.NotBefore) {
		return fmt.Errorf("certificate %q is not valid until %s", subject(c), c.NotBefore.UTC().Format(time.RFC3339))
	}
	if now.After(c.NotAfter) {
		return fmt.Errorf("certificate %q expired at %s", subject(c), c.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

func subject(c *x509.Certificate) string {
	if s := c.Subject.String(); s != "" {
		return s
	}
	return fmt.Sprintf("serial %x", c.SerialNumber)
}

func selfSigned(c *x509.Certificate) bool {
	return bytes.Equal(c.RawIssuer, c.RawSubject) &&
		c.CheckSignature(c.SignatureAlgorithm, c.RawTBSCertificate, c.Signature) == nil
}

func sameCerts(a, b []*x509.Certificate) bool {
	return slices.EqualFunc(a, b, (*x509.Certificate).Equal)
}

func containsCert(list []*x509.Certificate, c *x509.Certificate) bool {
	for _, x := range list {
		if x.Equal(c) {
			return true
		}
	}
	return false
}

var errMissing = errors.New("missing")

// ErrKeyUnavailable is wrapped by the errors of a signing key held outside
// the process (a PKCS#11 module) when it cannot sign: the module failed,
// was finalized, lost its session or token. The CA answers such a request
// with Unavailable, as for any dependency that is down.
var ErrKeyUnavailable = errors.New("signing key unavailable")
