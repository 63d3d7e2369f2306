package certs

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// PEM block types.
const (
	BlockCertificate = "CERTIFICATE"
	BlockCSR         = "CERTIFICATE REQUEST"
	BlockPKCS8       = "PRIVATE KEY"
	BlockECKey       = "EC PRIVATE KEY"
	BlockRSAKey      = "RSA PRIVATE KEY"
	// BlockECParams is written by `openssl ecparam -genkey` before the key.
	BlockECParams = "EC PARAMETERS"
)

// ErrNoPEM is returned when input holds no PEM block at all.
var ErrNoPEM = errors.New("certs: no PEM data found")

// EncodeCertificates returns the certificates as concatenated PEM blocks.
func EncodeCertificates(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: BlockCertificate, Bytes: c.Raw})...)
	}
	return out
}

// EncodeCSR returns a DER CSR as PEM.
func EncodeCSR(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: BlockCSR, Bytes: der})
}

// EncodePrivateKey returns key as a PKCS#8 PEM block.
func EncodePrivateKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certs: encode private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: BlockPKCS8, Bytes: der}), nil
}

// ParseCertificates parses every CERTIFICATE block in data. Other block
// types are an error, as is trailing non-PEM data that is not whitespace.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := data
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != BlockCertificate {
			return nil, fmt.Errorf("certs: unexpected PEM block %q, want %q", b.Type, BlockCertificate)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certs: parse certificate %d: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, ErrNoPEM
	}
	if len(trimSpace(rest)) != 0 {
		return nil, errors.New("certs: trailing data after the last PEM block (truncated or corrupt PEM?)")
	}
	return out, nil
}

// ParsePrivateKey parses a single unencrypted PKCS#8, SEC1 (EC) or PKCS#1
// (RSA) PEM key, after any EC PARAMETERS blocks (which `openssl ecparam
// -genkey` writes first). It is meshid's one private-key parser. Errors
// never include key bytes.
func ParsePrivateKey(data []byte) (crypto.Signer, error) {
	b, rest := pem.Decode(data)
	for b != nil && b.Type == BlockECParams {
		b, rest = pem.Decode(rest)
	}
	if b == nil {
		return nil, ErrNoPEM
	}
	if len(trimSpace(rest)) != 0 {
		return nil, errors.New("certs: more than one PEM block in private key file")
	}
	return ParsePrivateKeyBlock(b)
}

// ParsePrivateKeyBlock parses one decoded PEM key block, as ParsePrivateKey
// does. Errors never include key bytes.
func ParsePrivateKeyBlock(b *pem.Block) (crypto.Signer, error) {
	if len(b.Headers) != 0 {
		return nil, errors.New("certs: encrypted or annotated PEM private keys are not supported")
	}
	var (
		k   any
		err error
	)
	switch b.Type {
	case BlockPKCS8:
		k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	case BlockECKey:
		k, err = x509.ParseECPrivateKey(b.Bytes)
	case BlockRSAKey:
		k, err = x509.ParsePKCS1PrivateKey(b.Bytes)
	default:
		return nil, fmt.Errorf("certs: unexpected PEM block %q in private key file", b.Type)
	}
	if err != nil {
		return nil, errors.New("certs: private key is malformed")
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("certs: private key type %T cannot sign", k)
	}
	return s, nil
}

func trimSpace(b []byte) []byte {
	i, j := 0, len(b)
	for i < j && isSpace(b[i]) {
		i++
	}
	for j > i && isSpace(b[j-1]) {
		j--
	}
	return b[i:j]
}

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }
