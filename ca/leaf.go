package ca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"time"

	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"

	"github.com/meshid/meshid/ca/keystore"
)

// The leaf profile. Every leaf has:
//   - an empty subject and a critical subjectAltName holding only the
//     SPIFFE ID (RFC 5280 4.2.1.6 requires critical when the subject is empty);
//   - a random 128-bit serial;
//   - keyUsage digitalSignature, plus keyEncipherment for RSA keys (critical);
//   - extKeyUsage serverAuth and clientAuth;
//   - basicConstraints CA:false (critical);
//   - authorityKeyIdentifier = the issuer's subjectKeyIdentifier, if it has one.
//
// The extensions are encoded as x509.CreateCertificate encodes them, in the
// same order, so a leaf is byte-for-byte the certificate Go would build
// from the equivalent template (leaf_test.go checks this).

var (
	oidKeyUsage       = asn1.ObjectIdentifier{2, 5, 29, 15}
	oidExtKeyUsage    = asn1.ObjectIdentifier{2, 5, 29, 37}
	oidAuthorityKeyID = asn1.ObjectIdentifier{2, 5, 29, 35}
	oidServerAuth     = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 1}
	oidClientAuth     = asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 2}

	// emptySubject is the DER of an empty Name: an empty SEQUENCE.
	emptySubject = []byte{0x30, 0x00}

	// Key usage BIT STRINGs, bit 0 = digitalSignature, bit 2 = keyEncipherment.
	extKeyUsageSign    = mustExtension(oidKeyUsage, true, asn1.BitString{Bytes: []byte{0x80}, BitLength: 1})
	extKeyUsageSignEnc = mustExtension(oidKeyUsage, true, asn1.BitString{Bytes: []byte{0xa0}, BitLength: 3})
	extExtKeyUsage     = mustExtension(oidExtKeyUsage, false, []asn1.ObjectIdentifier{oidServerAuth, oidClientAuth})
	extNotCA           = mustExtension(oidBasicConstraints, true, struct{}{}) // SEQUENCE {}: cA defaults to false
)

// mustExtension DER-encodes an Extension whose value is asn1.Marshal(v).
// It panics only on a programming error in the constant values above.
func mustExtension(id asn1.ObjectIdentifier, critical bool, v any) []byte {
	val, err := asn1.Marshal(v)
	if err != nil {
		panic(err)
	}
	der, err := asn1.Marshal(pkix.Extension{Id: id, Critical: critical, Value: val})
	if err != nil {
		panic(err)
	}
	return der
}

// issuer is everything Sign needs from a bundle, computed once by
// SetBundle so that the hot path does no parsing or encoding of CA data.
type issuer struct {
	bundle   *keystore.Bundle
	cert     *x509.Certificate
	key      crypto.Signer
	chain    []*x509.Certificate // Cert (unless it is a root) then Intermediates; len == cap
	roots    []*x509.Certificate // len == cap
	notAfter time.Time           // the earliest NotAfter of the path to the root
	rootExp  time.Time           // the earliest NotAfter of the roots

	rawIssuer  []byte // the issuer Name, Cert.RawSubject
	sigAlg     x509.SignatureAlgorithm
	sigAlgID   []byte // DER AlgorithmIdentifier of the leaf signature
	signOpts   crypto.SignerOpts
	verifyEach bool   // verify every signature (signers outside the standard library)
	extAKI     []byte // DER authorityKeyIdentifier extension, or nil

	// The leaf's extensions but subjectAltName, as x509.ParseCertificate
	// reports them, for the leaves' *x509.Certificate (leafCert). Shared
	// by every leaf: read only.
	extsSign, extsSignEnc []pkix.Extension
}

// signatureAlgorithms maps a CA key to the leaf signature algorithm (as
// certs.SignatureAlgorithmFor and x509.CreateCertificate choose it), its
// DER AlgorithmIdentifier and the hash handed to the signer.
func signatureParams(pub crypto.PublicKey) (x509.SignatureAlgorithm, []byte, crypto.SignerOpts, error) {
	var (
		alg    x509.SignatureAlgorithm
		oid    asn1.ObjectIdentifier
		hash   crypto.Hash
		params bool // RSA PKCS#1 v1.5 identifiers carry NULL parameters
	)
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			alg, oid, hash = x509.ECDSAWithSHA256, asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 2}, crypto.SHA256
		case elliptic.P384():
			alg, oid, hash = x509.ECDSAWithSHA384, asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 3}, crypto.SHA384
		case elliptic.P521():
			alg, oid, hash = x509.ECDSAWithSHA512, asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 4}, crypto.SHA512
		default:
			return 0, nil, nil, fmt.Errorf("unsupported CA curve %s", k.Curve.Params().Name)
		}
	case *rsa.PublicKey:
		alg, oid, hash, params = x509.SHA256WithRSA, asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 11}, crypto.SHA256, true
	case ed25519.PublicKey:
		alg, oid, hash = x509.PureEd25519, asn1.ObjectIdentifier{1, 3, 101, 112}, crypto.Hash(0)
	default:
		return 0, nil, nil, fmt.Errorf("unsupported CA key type %T", pub)
	}
	var b cryptobyte.Builder
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddASN1ObjectIdentifier(oid)
		if params {
			b.AddASN1NULL()
		}
	})
	der, err := b.Bytes()
	if err != nil {
		return 0, nil, nil, err
	}
	return alg, der, hash, nil
}

func newIssuer(b *keystore.Bundle) (*issuer, error) {
	alg, algID, opts, err := signatureParams(b.Cert.PublicKey)
	if err != nil {
		return nil, err
	}
	is := &issuer{
		bundle:     b,
		cert:       b.Cert,
		key:        b.Key,
		rawIssuer:  b.Cert.RawSubject,
		sigAlg:     alg,
		sigAlgID:   algID,
		signOpts:   opts,
		verifyEach: !standardKey(b.Key),
		notAfter:   b.Cert.NotAfter,
	}
	isRoot := false
	for _, r := range b.Roots {
		isRoot = isRoot || r.Equal(b.Cert)
		if is.rootExp.IsZero() || r.NotAfter.Before(is.rootExp) {
			is.rootExp = r.NotAfter
		}
	}
	if !isRoot {
		is.chain = append(is.chain, b.Cert)
	}
	is.chain = append(is.chain, b.Intermediates...)
	is.chain = is.chain[:len(is.chain):len(is.chain)]
	is.roots = append([]*x509.Certificate(nil), b.Roots...)
	// The leaf cannot outlive any certificate on its path to the root.
	top := b.Cert
	for _, c := range b.Intermediates {
		top = c
		if c.NotAfter.Before(is.notAfter) {
			is.notAfter = c.NotAfter
		}
	}
	for _, r := range b.Roots {
		if top.CheckSignatureFrom(r) == nil && r.NotAfter.Before(is.notAfter) {
			is.notAfter = r.NotAfter
		}
	}
	if len(b.Cert.SubjectKeyId) > 0 {
		is.extAKI = mustExtension(oidAuthorityKeyID, false, struct {
			ID []byte `asn1:"optional,tag:0"`
		}{b.Cert.SubjectKeyId})
	}
	for _, der := range [][]byte{extKeyUsageSign, extKeyUsageSignEnc, extExtKeyUsage, extNotCA, is.extAKI} {
		if der == nil {
			continue
		}
		var e pkix.Extension
		if rest, err := asn1.Unmarshal(der, &e); err != nil || len(rest) > 0 {
			return nil, fmt.Errorf("leaf extension: %v", err)
		}
		if !bytes.Equal(der, extKeyUsageSignEnc) {
			is.extsSign = append(is.extsSign, e)
		}
		if !bytes.Equal(der, extKeyUsageSign) {
			is.extsSignEnc = append(is.extsSignEnc, e)
		}
	}
	return is, nil
}

// leafSpec is what varies between two leaves of one issuer.
type leafSpec struct {
	serial    *big.Int
	notBefore time.Time
	notAfter  time.Time
	pub       crypto.PublicKey // the leaf's key
	spki      []byte           // its DER SubjectPublicKeyInfo
	rsaKey    bool             // adds keyEncipherment
	uri       string           // the SPIFFE ID
}

// derP256SPKIPrefix is the DER of a P-256 SubjectPublicKeyInfo up to its
// point: SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 }, BIT STRING
// (65 bytes, no unused bits) }.
var derP256SPKIPrefix = []byte{
	0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01,
	0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
}

// marshalSPKI is x509.MarshalPKIXPublicKey, by hand for P-256 keys (almost
// every leaf): x509 builds the structure with encoding/asn1's reflection,
// about 3% of the CA's CPU per certificate. The point is the key's own
// Bytes (uncompressed, checked on the curve), as x509 encodes it.
// TestMarshalSPKIMatchesX509 compares the two.
func marshalSPKI(pub crypto.PublicKey) ([]byte, error) {
	if k, ok := pub.(*ecdsa.PublicKey); ok && k.Curve == elliptic.P256() {
		pt, err := k.Bytes()
		if err != nil {
			return nil, err
		}
		return append(append(make([]byte, 0, len(derP256SPKIPrefix)+len(pt)), derP256SPKIPrefix...), pt...), nil
	}
	return x509.MarshalPKIXPublicKey(pub)
}

// sanValue encodes the subjectAltName value of a leaf: GeneralNames
// holding one uniformResourceIdentifier.
func sanValue(uri string) ([]byte, error) {
	b := cryptobyte.NewBuilder(make([]byte, 0, len(uri)+8))
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddASN1(cbasn1.Tag(6).ContextSpecific(), func(b *cryptobyte.Builder) {
			b.AddBytes([]byte(uri))
		})
	})
	return b.Bytes()
}

// tbs encodes the TBSCertificate of a leaf whose subjectAltName value is san.
func (is *issuer) tbs(s *leafSpec, san []byte) ([]byte, error) {
	b := cryptobyte.NewBuilder(make([]byte, 0, 640))
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddASN1(cbasn1.Tag(0).Constructed().ContextSpecific(), func(b *cryptobyte.Builder) {
			b.AddASN1Int64(2) // v3
		})
		b.AddASN1BigInt(s.serial)
		b.AddBytes(is.sigAlgID)
		b.AddBytes(is.rawIssuer)
		b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
			addTime(b, s.notBefore)
			addTime(b, s.notAfter)
		})
		b.AddBytes(emptySubject)
		b.AddBytes(s.spki)
		b.AddASN1(cbasn1.Tag(3).Constructed().ContextSpecific(), func(b *cryptobyte.Builder) {
			b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
				if s.rsaKey {
					b.AddBytes(extKeyUsageSignEnc)
				} else {
					b.AddBytes(extKeyUsageSign)
				}
				b.AddBytes(extExtKeyUsage)
				b.AddBytes(extNotCA)
				b.AddBytes(is.extAKI)
				b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) { // subjectAltName
					b.AddASN1ObjectIdentifier(oidSubjectAltName)
					b.AddASN1Boolean(true) // critical: the subject is empty
					b.AddASN1OctetString(san)
				})
			})
		})
	})
	return b.Bytes()
}

// addTime encodes a validity time as RFC 5280 4.1.2.5 requires: UTCTime
// through 2049, GeneralizedTime from 2050, in UTC, to the second.
func addTime(b *cryptobyte.Builder, t time.Time) {
	t = t.UTC().Truncate(time.Second)
	if y := t.Year(); y >= 1950 && y < 2050 {
		b.AddASN1UTCTime(t)
		return
	}
	b.AddASN1GeneralizedTime(t)
}

// certificate wraps a TBSCertificate and its signature.
func (is *issuer) certificate(tbs, sig []byte) ([]byte, error) {
	b := cryptobyte.NewBuilder(make([]byte, 0, len(tbs)+len(sig)+32))
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddBytes(tbs)
		b.AddBytes(is.sigAlgID)
		b.AddASN1BitString(sig)
	})
	return b.Bytes()
}

// leafCert returns the *x509.Certificate of a leaf that issue encoded from
// s: der is the certificate, san its subjectAltName value and sig its
// signature. Every field is what x509.ParseCertificate(der) reports (the
// test TestLeafStructIsParsed and each bundle's probe compare the two),
// filled from the values that were encoded instead of decoding them again.
func (is *issuer) leafCert(s *leafSpec, der, san, sig []byte) (*x509.Certificate, error) {
	input := cryptobyte.String(der)
	var outer, rawTBS cryptobyte.String
	if !input.ReadASN1(&outer, cbasn1.SEQUENCE) || !outer.ReadASN1Element(&rawTBS, cbasn1.SEQUENCE) {
		return nil, errors.New("malformed leaf")
	}
	u, err := url.Parse(s.uri)
	if err != nil {
		return nil, err
	}
	ku, base := x509.KeyUsageDigitalSignature, is.extsSign
	if s.rsaKey {
		ku, base = ku|x509.KeyUsageKeyEncipherment, is.extsSignEnc
	}
	exts := make([]pkix.Extension, len(base), len(base)+1)
	copy(exts, base)
	exts = append(exts, pkix.Extension{Id: oidSubjectAltName, Critical: true, Value: san})
	var pkAlg x509.PublicKeyAlgorithm
	switch s.pub.(type) {
	case *rsa.PublicKey:
		pkAlg = x509.RSA
	case *ecdsa.PublicKey:
		pkAlg = x509.ECDSA
	case ed25519.PublicKey:
		pkAlg = x509.Ed25519
	}
	var aki []byte
	if is.extAKI != nil {
		aki = is.cert.SubjectKeyId
	}
	return &x509.Certificate{
		Raw:                     der,
		RawTBSCertificate:       rawTBS,
		RawSubjectPublicKeyInfo: s.spki,
		RawSubject:              emptySubject,
		RawIssuer:               is.rawIssuer,
		Signature:               sig,
		SignatureAlgorithm:      is.sigAlg,
		PublicKeyAlgorithm:      pkAlg,
		PublicKey:               s.pub,
		Version:                 3,
		SerialNumber:            s.serial,
		Issuer:                  is.cert.Subject,
		NotBefore:               s.notBefore.UTC().Truncate(time.Second),
		NotAfter:                s.notAfter.UTC().Truncate(time.Second),
		KeyUsage:                ku,
		Extensions:              exts,
		ExtKeyUsage:             []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid:   true,
		MaxPathLen:              -1,
		AuthorityKeyId:          aki,
		URIs:                    []*url.URL{u},
	}, nil
}
