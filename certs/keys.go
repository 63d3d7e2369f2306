package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
)

// KeyType names a key algorithm and size, as used on the command line.
type KeyType string

// Supported key types.
const (
	ECP256  KeyType = "ec-p256"
	ECP384  KeyType = "ec-p384"
	RSA2048 KeyType = "rsa-2048"
	RSA3072 KeyType = "rsa-3072"
	RSA4096 KeyType = "rsa-4096"
	Ed25519 KeyType = "ed25519"
)

// KeyTypes lists the key types meshid can generate, default first.
var KeyTypes = []KeyType{ECP256, ECP384, RSA2048, RSA3072, RSA4096, Ed25519}

// CAKeyTypes lists the key types meshid creates CA keys of, default first.
// Ed25519 is not one: Istio and most TLS stacks do not accept Ed25519 CA
// signatures. (A CA made elsewhere and loaded from files is checked by
// package keystore, which also accepts Ed25519 and other RSA sizes.)
var CAKeyTypes = []KeyType{ECP256, ECP384, RSA2048, RSA3072, RSA4096}

// ParseKeyType validates s as a KeyType. The empty string is ECP256.
func ParseKeyType(s string) (KeyType, error) { return parseKeyType(s, KeyTypes) }

// ParseCAKeyType validates s as one of CAKeyTypes. The empty string is
// ECP256.
func ParseCAKeyType(s string) (KeyType, error) { return parseKeyType(s, CAKeyTypes) }

func parseKeyType(s string, allowed []KeyType) (KeyType, error) {
	if s == "" {
		return ECP256, nil
	}
	for _, k := range allowed {
		if string(k) == s {
			return k, nil
		}
	}
	if slices.Contains(KeyTypes, KeyType(s)) {
		return "", fmt.Errorf("certs: key type %q is not supported here (want one of %s)", s, KeyTypeNames(allowed))
	}
	return "", fmt.Errorf("certs: unknown key type %q (want one of %s)", s, KeyTypeNames(allowed))
}

// KeyTypeNames joins the names of types with ", ", as in help texts.
func KeyTypeNames(types []KeyType) string {
	s := make([]string, len(types))
	for i, k := range types {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}

// GenerateKey creates a private key of type t in memory.
func GenerateKey(t KeyType) (crypto.Signer, error) {
	switch t {
	case ECP256, "":
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case ECP384:
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case RSA2048:
		return rsa.GenerateKey(rand.Reader, 2048)
	case RSA3072:
		return rsa.GenerateKey(rand.Reader, 3072)
	case RSA4096:
		return rsa.GenerateKey(rand.Reader, 4096)
	case Ed25519:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		return k, err
	}
	return nil, fmt.Errorf("certs: unknown key type %q", t)
}

// KeyTypeOf describes a public key, such as "ec-p256" or "rsa-2048".
func KeyTypeOf(pub crypto.PublicKey) string {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return string(ECP256)
		case elliptic.P384():
			return string(ECP384)
		case elliptic.P521():
			return "ec-p521"
		}
		return "ec-" + k.Curve.Params().Name
	case *rsa.PublicKey:
		return fmt.Sprintf("rsa-%d", k.N.BitLen())
	case ed25519.PublicKey:
		return string(Ed25519)
	}
	return fmt.Sprintf("%T", pub)
}

// KeyMatches reports whether the private key belongs to the public key.
func KeyMatches(pub crypto.PublicKey, key crypto.Signer) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := key.Public().(equaler)
	return ok && e.Equal(pub)
}

// SignatureAlgorithmFor returns the signature algorithm a CA with this key
// uses: ECDSA with the curve's hash, SHA-256 RSA (PKCS#1 v1.5), or Ed25519.
func SignatureAlgorithmFor(key crypto.PublicKey) x509.SignatureAlgorithm {
	switch k := key.(type) {
	case *ecdsa.PublicKey:
		if k.Curve == elliptic.P384() {
			return x509.ECDSAWithSHA384
		}
		if k.Curve == elliptic.P521() {
			return x509.ECDSAWithSHA512
		}
		return x509.ECDSAWithSHA256
	case *rsa.PublicKey:
		return x509.SHA256WithRSA
	case ed25519.PublicKey:
		return x509.PureEd25519
	}
	return x509.UnknownSignatureAlgorithm
}
