package ca

import "crypto/x509"

// ParseCSRFast exposes the hand-written CSR parser (csrparse.go) to the
// differential tests, which compare it with x509.ParseCertificateRequest.
func ParseCSRFast(der []byte) (*x509.CertificateRequest, bool) { return parseCSRFast(der) }

// MarshalSPKI exposes the leaf key's SubjectPublicKeyInfo encoder to
// TestMarshalSPKIMatchesX509.
var MarshalSPKI = marshalSPKI

// DecodeCSRPEMFast exposes the hand-written PEM decoder to
// TestDecodeCSRPEMFastMatchesPEM.
var DecodeCSRPEMFast = decodeCSRPEMFast
