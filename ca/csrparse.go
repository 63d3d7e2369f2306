package ca

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"math/big"
	"net/url"
	"unicode/utf8"

	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
)

// Why the CSR is parsed by hand
//
// x509.ParseCertificateRequest decodes a CSR with encoding/asn1, whose
// reflection was about 7% of the CA's CPU per certificate (with its
// allocations and the goroutine stack growth of its recursion, more). The
// CA needs few of its results: the key, the signature and its algorithm,
// and the requested extensions (basicConstraints, subjectAltName URIs).
// parseCSRFast reads those with cryptobyte, without reflection, for the
// CSRs agents send: version 0, a subject of printable, UTF-8 or IA5
// strings, an RSA, ECDSA P-256/P-384 or Ed25519 key, at most one
// extensionRequest attribute, URI-only subjectAltNames and a SHA-2 or
// Ed25519 signature.
//
// It is never more lenient than crypto/x509: it accepts a CSR only when
// every check x509.ParseCertificateRequest would make on it passes, and
// gives up (ok false) on anything else, unusual or malformed, which
// parseCSR then hands to x509.ParseCertificateRequest: that decides, with
// its own error. So the accepted set and the errors are crypto/x509's, and
// the parsed fields are the ones it would return, except Subject and
// Attributes, which the CA does not read (CSR.Request fills them).
// TestParseCSRFastMatchesX509 checks this against
// x509.ParseCertificateRequest on the fuzz corpus, CSRs of every key type
// with extensions and attributes, and every truncation and bit flip of
// them; FuzzParseAndCheckCSR checks it on whatever the fuzzer finds.

// parseCSR parses a DER certificate request: by hand when it has the usual
// shape, else with crypto/x509. full reports whether the result is
// crypto/x509's own (Subject and Attributes filled).
func parseCSR(der []byte) (req *x509.CertificateRequest, full bool, err error) {
	if req, ok := parseCSRFast(der); ok {
		return req, false, nil
	}
	req, err = x509.ParseCertificateRequest(der)
	return req, true, err
}

// DER encodings (the whole TLV) of the object identifiers parseCSRFast
// compares.
var (
	derOIDExtensionRequest = mustOID(1, 2, 840, 113549, 1, 9, 14)
	derOIDSubjectAltName   = mustOID(2, 5, 29, 17)
	derOIDKeyRSA           = mustOID(1, 2, 840, 113549, 1, 1, 1)
	derOIDKeyECDSA         = mustOID(1, 2, 840, 10045, 2, 1)
	derOIDKeyEd25519       = mustOID(1, 3, 101, 112)
	derOIDCurveP256        = mustOID(1, 2, 840, 10045, 3, 1, 7)
	derOIDCurveP384        = mustOID(1, 3, 132, 0, 34)
	derNULL                = []byte{0x05, 0x00}
	derVersion0            = []byte{0x02, 0x01, 0x00}

	// fastSigAlgs are the signature algorithms parseCSRFast knows, by the
	// DER of their OID, as x509's getSignatureAlgorithmFromAI maps them.
	fastSigAlgs = []struct {
		oid []byte
		alg x509.SignatureAlgorithm
	}{
		{mustOID(1, 2, 840, 10045, 4, 3, 2), x509.ECDSAWithSHA256},
		{mustOID(1, 2, 840, 10045, 4, 3, 3), x509.ECDSAWithSHA384},
		{mustOID(1, 2, 840, 10045, 4, 3, 4), x509.ECDSAWithSHA512},
		{mustOID(1, 2, 840, 113549, 1, 1, 11), x509.SHA256WithRSA},
		{mustOID(1, 2, 840, 113549, 1, 1, 12), x509.SHA384WithRSA},
		{mustOID(1, 2, 840, 113549, 1, 1, 13), x509.SHA512WithRSA},
		{mustOID(1, 3, 101, 112), x509.PureEd25519},
	}
)

func mustOID(arcs ...int) []byte {
	der, err := asn1.Marshal(asn1.ObjectIdentifier(arcs))
	if err != nil {
		panic(err)
	}
	return der
}

// parseCSRFast parses der as x509.ParseCertificateRequest does, for the
// shapes described above; ok is false for any other input.
func parseCSRFast(der []byte) (req *x509.CertificateRequest, ok bool) {
	input := cryptobyte.String(der)
	var outer, tbs, rawTBS, algID cryptobyte.String
	var sig []byte
	if !input.ReadASN1(&outer, cbasn1.SEQUENCE) || !input.Empty() ||
		!outer.ReadASN1Element(&rawTBS, cbasn1.SEQUENCE) ||
		!outer.ReadASN1(&algID, cbasn1.SEQUENCE) ||
		!outer.ReadASN1BitStringAsBytes(&sig) || !outer.Empty() {
		return nil, false
	}
	r := &x509.CertificateRequest{Raw: der, RawTBSCertificateRequest: rawTBS, Signature: sig}
	if r.SignatureAlgorithm, ok = fastSignatureAlgorithm(algID); !ok {
		return nil, false
	}
	tbs = rawTBS
	var version, subject, spki, attrs cryptobyte.String
	if !tbs.ReadASN1(&tbs, cbasn1.SEQUENCE) ||
		!tbs.ReadASN1Element(&version, cbasn1.INTEGER) || !bytes.Equal(version, derVersion0) ||
		!tbs.ReadASN1Element(&subject, cbasn1.SEQUENCE) ||
		!tbs.ReadASN1Element(&spki, cbasn1.SEQUENCE) ||
		!tbs.ReadASN1(&attrs, cbasn1.Tag(0).Constructed().ContextSpecific()) || !tbs.Empty() {
		return nil, false
	}
	r.RawSubject, r.RawSubjectPublicKeyInfo = subject, spki
	if !fastSubject(subject) {
		return nil, false
	}
	if r.PublicKeyAlgorithm, r.PublicKey, ok = fastPublicKey(spki); !ok {
		return nil, false
	}
	if r.Extensions, ok = fastExtensions(attrs); !ok {
		return nil, false
	}
	for _, e := range r.Extensions {
		if e.Id.Equal(oidSubjectAltName) {
			if r.URIs, ok = fastSANURIs(e.Value); !ok {
				return nil, false
			}
		}
	}
	return r, true
}

// fastSignatureAlgorithm maps a signature AlgorithmIdentifier (its
// contents) to a known algorithm: the OID alone, or followed by NULL
// parameters (which x509 ignores for ECDSA and RSA); Ed25519 takes none.
func fastSignatureAlgorithm(algID cryptobyte.String) (x509.SignatureAlgorithm, bool) {
	var oid cryptobyte.String
	if !algID.ReadASN1Element(&oid, cbasn1.OBJECT_IDENTIFIER) {
		return 0, false
	}
	for _, a := range fastSigAlgs {
		if !bytes.Equal(oid, a.oid) {
			continue
		}
		if algID.Empty() || a.alg != x509.PureEd25519 && bytes.Equal(algID, derNULL) {
			return a.alg, true
		}
		return 0, false
	}
	return 0, false
}

// fastSubject accepts a Name (its whole TLV) that asn1.Unmarshal into a
// pkix.RDNSequence accepts: SETs of (OID, value) SEQUENCEs, each value a
// valid PrintableString, UTF8String or IA5String.
func fastSubject(name cryptobyte.String) bool {
	if !name.ReadASN1(&name, cbasn1.SEQUENCE) {
		return false
	}
	for !name.Empty() {
		var rdn cryptobyte.String
		if !name.ReadASN1(&rdn, cbasn1.SET) {
			return false
		}
		for !rdn.Empty() {
			var atv cryptobyte.String
			var oid asn1.ObjectIdentifier
			var tag cbasn1.Tag
			var val cryptobyte.String
			if !rdn.ReadASN1(&atv, cbasn1.SEQUENCE) || !atv.ReadASN1ObjectIdentifier(&oid) ||
				!atv.ReadAnyASN1(&val, &tag) || !atv.Empty() {
				return false
			}
			switch tag {
			case cbasn1.PrintableString:
				for _, b := range val {
					if !printable(b) {
						return false
					}
				}
			case cbasn1.UTF8String:
				if !utf8.Valid(val) {
					return false
				}
			case cbasn1.IA5String:
				for _, b := range val {
					if b >= utf8.RuneSelf {
						return false
					}
				}
			default:
				return false
			}
		}
	}
	return true
}

// printable is encoding/asn1's PrintableString alphabet, with the '*'
// and '&' it tolerates.
func printable(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
		'\'' <= b && b <= ')' || '+' <= b && b <= '/' ||
		b == ' ' || b == ':' || b == '=' || b == '?' || b == '*' || b == '&'
}

// fastPublicKey parses a SubjectPublicKeyInfo (its whole TLV) of an RSA,
// ECDSA P-256/P-384 or Ed25519 key as x509's parsePublicKey does.
func fastPublicKey(spki cryptobyte.String) (x509.PublicKeyAlgorithm, any, bool) {
	var algID, oid, params cryptobyte.String
	var bits []byte
	if !spki.ReadASN1(&spki, cbasn1.SEQUENCE) || !spki.ReadASN1(&algID, cbasn1.SEQUENCE) ||
		!spki.ReadASN1BitStringAsBytes(&bits) || !spki.Empty() ||
		!algID.ReadASN1Element(&oid, cbasn1.OBJECT_IDENTIFIER) {
		return 0, nil, false
	}
	params = algID
	switch {
	case bytes.Equal(oid, derOIDKeyRSA):
		if !bytes.Equal(params, derNULL) {
			return 0, nil, false
		}
		der := cryptobyte.String(bits)
		var seq cryptobyte.String
		n, e := new(big.Int), 0
		if !der.ReadASN1(&seq, cbasn1.SEQUENCE) || !der.Empty() ||
			!seq.ReadASN1Integer(n) || !seq.ReadASN1Integer(&e) || !seq.Empty() ||
			n.Sign() <= 0 || e <= 0 {
			return 0, nil, false
		}
		return x509.RSA, &rsa.PublicKey{N: n, E: e}, true
	case bytes.Equal(oid, derOIDKeyECDSA):
		var curve elliptic.Curve
		switch {
		case bytes.Equal(params, derOIDCurveP256):
			curve = elliptic.P256()
		case bytes.Equal(params, derOIDCurveP384):
			curve = elliptic.P384()
		default:
			return 0, nil, false
		}
		k, err := ecdsa.ParseUncompressedPublicKey(curve, bits)
		if err != nil {
			return 0, nil, false
		}
		return x509.ECDSA, k, true
	case bytes.Equal(oid, derOIDKeyEd25519):
		if !params.Empty() || len(bits) != ed25519.PublicKeySize {
			return 0, nil, false
		}
		return x509.Ed25519, ed25519.PublicKey(bits), true
	}
	return 0, nil, false
}

// fastExtensions reads the requested extensions from the attributes (the
// contents of the [0] field). x509 ignores attributes it cannot parse and
// those of other types; an attribute whose type is extensionRequest must
// be well formed here, or parseCSRFast gives up. Only one extensionRequest
// and distinct extension OIDs are accepted (x509 refuses duplicates).
func fastExtensions(attrs cryptobyte.String) ([]pkix.Extension, bool) {
	var exts []pkix.Extension
	seen := false
	for !attrs.Empty() {
		var attr cryptobyte.String
		var tag cbasn1.Tag
		if !attrs.ReadAnyASN1Element(&attr, &tag) {
			return nil, false
		}
		var body, oid cryptobyte.String
		if tag != cbasn1.SEQUENCE || !attr.ReadASN1(&body, cbasn1.SEQUENCE) ||
			!body.PeekASN1Tag(cbasn1.OBJECT_IDENTIFIER) || !body.ReadASN1Element(&oid, cbasn1.OBJECT_IDENTIFIER) ||
			!bytes.Equal(oid, derOIDExtensionRequest) {
			continue // not an extensionRequest whichever way it is read: x509 ignores it too
		}
		var values, list cryptobyte.String
		if seen || !body.ReadASN1(&values, cbasn1.SET) || !body.Empty() ||
			!values.ReadASN1(&list, cbasn1.SEQUENCE) || !values.Empty() {
			return nil, false
		}
		seen = true
		for !list.Empty() {
			var ext cryptobyte.String
			var e pkix.Extension
			var value []byte
			if !list.ReadASN1(&ext, cbasn1.SEQUENCE) || !ext.ReadASN1ObjectIdentifier(&e.Id) {
				return nil, false
			}
			if ext.PeekASN1Tag(cbasn1.BOOLEAN) && !ext.ReadASN1Boolean(&e.Critical) {
				return nil, false
			}
			if !ext.ReadASN1Bytes(&value, cbasn1.OCTET_STRING) || !ext.Empty() {
				return nil, false
			}
			for _, prev := range exts {
				if prev.Id.Equal(e.Id) {
					return nil, false
				}
			}
			e.Value = value
			exts = append(exts, e)
		}
	}
	return exts, true
}

// fastSANURIs reads a subjectAltName holding only URIs, as x509's
// parseSANExtension does: IA5 characters, url.Parse, and a valid domain
// when there is a host. Any other name type gives up (x509 then reports
// them and the policy refuses them).
func fastSANURIs(der cryptobyte.String) ([]*url.URL, bool) {
	var names cryptobyte.String
	if !der.ReadASN1(&names, cbasn1.SEQUENCE) || !der.Empty() {
		return nil, false
	}
	var uris []*url.URL
	for !names.Empty() {
		var v cryptobyte.String
		if !names.ReadASN1(&v, cbasn1.Tag(6).ContextSpecific()) {
			return nil, false
		}
		for _, b := range v {
			if b >= utf8.RuneSelf {
				return nil, false
			}
		}
		u, err := url.Parse(string(v))
		if err != nil || len(u.Host) > 0 && !domainNameValid(u.Host) {
			return nil, false
		}
		uris = append(uris, u)
	}
	return uris, true
}

// domainNameValid is crypto/x509's check of a URI SAN's host (its
// domainNameValid for a name, not a constraint): no trailing dot, no empty
// label, only characters 33 to 126.
func domainNameValid(s string) bool {
	if len(s) == 0 {
		return true
	}
	if s[len(s)-1] == '.' {
		return false
	}
	lastDot := -1
	for i := 0; i <= len(s); i++ {
		if i < len(s) && (s[i] < 33 || s[i] > 126) {
			return false
		}
		if i == len(s) || s[i] == '.' {
			if i-lastDot-1 == 0 {
				return false
			}
			lastDot = i
		}
	}
	return true
}
