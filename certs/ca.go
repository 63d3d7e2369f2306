package certs

import (
	"crypto"
	"crypto/rand"
	"crypto/sha1"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"time"
)

// CASpec describes a CA certificate to create.
type CASpec struct {
	Subject   pkix.Name
	Key       crypto.Signer // the new CA's key
	NotBefore time.Time
	TTL       time.Duration
	// MaxPathLen is the basicConstraints path length; -1 means unlimited.
	MaxPathLen int
}

// NewSerial returns a random positive 128-bit serial number.
func NewSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("certs: serial: %w", err)
	}
	if s.Sign() == 0 {
		s.SetInt64(1)
	}
	return s, nil
}

// SubjectKeyID returns the RFC 5280 method-1 key identifier of pub.
func SubjectKeyID(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	// Hash the subjectPublicKey BIT STRING contents, approximated by the
	// full SPKI; only uniqueness matters for key identifiers.
	sum := sha1.Sum(der)
	return sum[:], nil
}

func caTemplate(spec CASpec) (*x509.Certificate, error) {
	if spec.Key == nil {
		return nil, fmt.Errorf("certs: CA spec has no key")
	}
	if spec.TTL <= 0 {
		return nil, fmt.Errorf("certs: CA TTL must be positive")
	}
	serial, err := NewSerial()
	if err != nil {
		return nil, err
	}
	ski, err := SubjectKeyID(spec.Key.Public())
	if err != nil {
		return nil, err
	}
	t := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               spec.Subject,
		NotBefore:             spec.NotBefore,
		NotAfter:              spec.NotBefore.Add(spec.TTL),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SubjectKeyId:          ski,
		SignatureAlgorithm:    SignatureAlgorithmFor(spec.Key.Public()),
	}
	switch {
	case spec.MaxPathLen < 0:
		t.MaxPathLen = -1
	case spec.MaxPathLen == 0:
		t.MaxPathLen, t.MaxPathLenZero = 0, true
	default:
		t.MaxPathLen = spec.MaxPathLen
	}
	return t, nil
}

// NewRootCA creates a self-signed root certificate.
func NewRootCA(spec CASpec) (*x509.Certificate, error) {
	t, err := caTemplate(spec)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, t, t, spec.Key.Public(), spec.Key)
	if err != nil {
		return nil, fmt.Errorf("certs: create root: %w", err)
	}
	return x509.ParseCertificate(der)
}

// NewIntermediateCA creates a CA certificate for spec.Key signed by the
// parent certificate and key.
func NewIntermediateCA(spec CASpec, parent *x509.Certificate, parentKey crypto.Signer) (*x509.Certificate, error) {
	t, err := caTemplate(spec)
	if err != nil {
		return nil, err
	}
	t.SignatureAlgorithm = SignatureAlgorithmFor(parentKey.Public())
	der, err := x509.CreateCertificate(rand.Reader, t, parent, spec.Key.Public(), parentKey)
	if err != nil {
		return nil, fmt.Errorf("certs: create intermediate: %w", err)
	}
	return x509.ParseCertificate(der)
}
