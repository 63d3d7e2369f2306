package ca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
)

// MaxCSRSize is the largest PEM CSR ParseCSR accepts: 64 KiB.
const MaxCSRSize = 64 << 10

// Leaf key limits. The RSA public exponent must be 65537 (F4), what every
// key generator uses: a huge exponent, like a huge modulus, makes the CSR's
// signature check cost seconds of CPU.
const (
	MinRSABits  = 2048
	MaxRSABits  = 8192
	RSAExponent = 65537
)

// Failure reasons, the values of the reason label of
// meshid_ca_sign_failures_total.
const (
	reasonBadCSR      = "bad_csr"             // malformed CSR or bad signature
	reasonWeakKey     = "weak_key"            // key type or size not allowed
	reasonExtension   = "forbidden_extension" // basicConstraints CA:true
	reasonSAN         = "forbidden_san"       // DNS/IP/email/other SANs, several URIs
	reasonIdentity    = "identity_mismatch"   // a URI SAN that is not the caller's identity
	reasonTTL         = "ttl"                 // TTL negative or above the maximum
	reasonCredential  = "credential_expired"  // the presented certificate (or, capped, the token) has expired
	reasonUnavailable = "unavailable"         // CA expired, request canceled
	reasonInternal    = "internal"            // a bug or a signer failure
)

// maxEchoedInputBytes is the longest piece of caller input quoted in an error.
const maxEchoedInputBytes = 128

var failureReasons = []string{reasonBadCSR, reasonWeakKey, reasonExtension, reasonSAN, reasonIdentity, reasonTTL, reasonCredential, reasonUnavailable, reasonInternal}

// rejection is an *Error with the metrics reason that produced it.
type rejection struct {
	reason string
	err    *Error
}

func (r *rejection) Error() string { return r.err.Error() }
func (r *rejection) Unwrap() error { return r.err }

func reject(reason string, k Kind, format string, args ...any) error {
	return &rejection{reason: reason, err: &Error{Kind: k, Msg: fmt.Sprintf(format, args...)}}
}

var (
	oidBasicConstraints = asn1.ObjectIdentifier{2, 5, 29, 19}
	oidSubjectAltName   = asn1.ObjectIdentifier{2, 5, 29, 17}
)

// ParseCSR parses a PEM certificate request, checks its key type and size
// (before anything costly) and its signature, the proof that the caller
// holds the private key. It returns InvalidArgument for input over
// MaxCSRSize, anything but exactly one CERTIFICATE REQUEST PEM block, a
// malformed CSR, a key the policy refuses or a bad signature.
//
// cfssl's helpers.ParseCSR is not used: it accepts DER as well as PEM,
// ignores further PEM blocks and reports a bad signature like a malformed
// CSR, where this policy needs strict input and distinct messages.
func ParseCSR(pemData []byte) (*CSR, error) {
	if len(pemData) > MaxCSRSize {
		return nil, Errorf(KindInvalidArgument, "CSR is %d bytes, more than the %d KiB limit", len(pemData), MaxCSRSize>>10)
	}
	trimmed := bytes.TrimSpace(pemData)
	if !bytes.HasPrefix(trimmed, []byte("-----BEGIN ")) {
		return nil, Errorf(KindInvalidArgument, "CSR is not PEM (want one CERTIFICATE REQUEST block)")
	}
	der, ok := decodeCSRPEMFast(trimmed)
	if !ok {
		block, rest := pem.Decode(trimmed)
		if block == nil {
			return nil, Errorf(KindInvalidArgument, "CSR PEM is malformed")
		}
		if block.Type != "CERTIFICATE REQUEST" && block.Type != "NEW CERTIFICATE REQUEST" {
			return nil, Errorf(KindInvalidArgument, "PEM block is %q, want CERTIFICATE REQUEST", truncate(block.Type))
		}
		if rest = bytes.TrimSpace(rest); len(rest) > 0 {
			if bytes.Contains(rest, []byte("-----BEGIN ")) {
				return nil, Errorf(KindInvalidArgument, "CSR PEM holds several blocks, want exactly one")
			}
			return nil, Errorf(KindInvalidArgument, "trailing data after the CSR PEM block")
		}
		der = block.Bytes
	}
	req, full, err := parseCSR(der)
	if err != nil {
		return nil, Wrap(KindInvalidArgument, err, "CSR is malformed")
	}
	csr, err := VerifyCSR(req)
	if err != nil {
		return nil, err
	}
	csr.partial = !full
	return csr, nil
}

// checkCSR applies the CSR policy for a caller that proved identity id.
// The caller's identity, not the CSR, decides what is signed: the CSR only
// contributes its public key, and anything else it asks for must agree
// with the policy or the request is rejected.
func checkCSR(csr *x509.CertificateRequest, id spiffeid.ID) error {
	if err := checkLeafKey(csr.PublicKey); err != nil {
		return err
	}
	for _, ext := range csr.Extensions {
		switch {
		case ext.Id.Equal(oidBasicConstraints):
			isCA, ok := parseBasicConstraints(ext.Value)
			if !ok {
				return reject(reasonExtension, KindInvalidArgument, "CSR has a malformed basicConstraints extension")
			}
			if isCA {
				return reject(reasonExtension, KindInvalidArgument, "CSR asks for a CA certificate (basicConstraints CA:true); only leaf certificates are issued")
			}
		case ext.Id.Equal(oidSubjectAltName):
			if err := checkSANTypes(ext.Value); err != nil {
				return err
			}
		}
	}
	switch {
	case len(csr.DNSNames) > 0:
		return reject(reasonSAN, KindInvalidArgument, "CSR has DNS SAN %q; only the caller's SPIFFE ID may be requested", truncate(csr.DNSNames[0]))
	case len(csr.IPAddresses) > 0:
		return reject(reasonSAN, KindInvalidArgument, "CSR has IP SAN %s; only the caller's SPIFFE ID may be requested", csr.IPAddresses[0])
	case len(csr.EmailAddresses) > 0:
		return reject(reasonSAN, KindInvalidArgument, "CSR has email SAN %q; only the caller's SPIFFE ID may be requested", truncate(csr.EmailAddresses[0]))
	}
	want := id.String()
	for _, u := range csr.URIs {
		if got := u.String(); got != want {
			return reject(reasonIdentity, KindPermissionDenied, "CSR asks for identity %q but the caller is %q", truncate(got), want)
		}
	}
	if len(csr.URIs) > 1 {
		return reject(reasonSAN, KindInvalidArgument, "CSR has %d URI SANs; an SVID has exactly one", len(csr.URIs))
	}
	return nil
}

// checkLeafKey allows RSA keys of 2048 to 8192 bits with exponent 65537,
// ECDSA P-256 and P-384, and Ed25519. It costs no cryptographic operation,
// so it runs before any signature check.
func checkLeafKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		if n := k.N.BitLen(); n < MinRSABits || n > MaxRSABits {
			return reject(reasonWeakKey, KindInvalidArgument, "RSA key of %d bits not allowed (want %d to %d bits)", n, MinRSABits, MaxRSABits)
		}
		if k.E != RSAExponent {
			return reject(reasonWeakKey, KindInvalidArgument, "RSA public exponent %d not allowed (want %d)", k.E, RSAExponent)
		}
		return nil
	case *ecdsa.PublicKey:
		if k.Curve == elliptic.P256() || k.Curve == elliptic.P384() {
			return nil
		}
		return reject(reasonWeakKey, KindInvalidArgument, "EC curve %s not allowed (want P-256 or P-384)", k.Curve.Params().Name)
	case ed25519.PublicKey:
		return nil
	}
	return reject(reasonWeakKey, KindInvalidArgument, "CSR key type %T not allowed (want RSA, ECDSA P-256/P-384 or Ed25519)", pub)
}

// parseBasicConstraints reads the cA flag of a basicConstraints value.
func parseBasicConstraints(der []byte) (isCA, ok bool) {
	s := cryptobyte.String(der)
	var seq cryptobyte.String
	if !s.ReadASN1(&seq, cbasn1.SEQUENCE) || !s.Empty() {
		return false, false
	}
	if seq.PeekASN1Tag(cbasn1.BOOLEAN) && !seq.ReadASN1Boolean(&isCA) {
		return false, false
	}
	return isCA, true // absent cA means false; a pathLenConstraint may follow
}

// checkSANTypes rejects every GeneralName but a URI, including the types
// crypto/x509 does not parse into fields (otherName, directoryName,
// registeredID...).
func checkSANTypes(der []byte) error {
	s := cryptobyte.String(der)
	var names cryptobyte.String
	if !s.ReadASN1(&names, cbasn1.SEQUENCE) || !s.Empty() {
		return reject(reasonSAN, KindInvalidArgument, "CSR has a malformed subjectAltName extension")
	}
	for !names.Empty() {
		var (
			v   cryptobyte.String
			tag cbasn1.Tag
		)
		if !names.ReadAnyASN1(&v, &tag) {
			return reject(reasonSAN, KindInvalidArgument, "CSR has a malformed subjectAltName extension")
		}
		switch tag {
		case cbasn1.Tag(6).ContextSpecific(): // uniformResourceIdentifier
		case cbasn1.Tag(1).ContextSpecific():
			return reject(reasonSAN, KindInvalidArgument, "CSR has an email SAN; only the caller's SPIFFE ID may be requested")
		case cbasn1.Tag(2).ContextSpecific():
			return reject(reasonSAN, KindInvalidArgument, "CSR has a DNS SAN; only the caller's SPIFFE ID may be requested")
		case cbasn1.Tag(7).ContextSpecific():
			return reject(reasonSAN, KindInvalidArgument, "CSR has an IP SAN; only the caller's SPIFFE ID may be requested")
		default:
			return reject(reasonSAN, KindInvalidArgument, "CSR has a SAN of type [%d]; only the caller's SPIFFE ID (a URI) may be requested", uint8(tag)&0x1f)
		}
	}
	return nil
}

// truncate shortens caller input quoted in an error message.
func truncate(s string) string {
	if len(s) <= maxEchoedInputBytes {
		return s
	}
	return s[:maxEchoedInputBytes] + "..."
}
