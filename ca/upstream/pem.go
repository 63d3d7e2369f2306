package upstream

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"io"
	"os"

	"github.com/meshid/meshid/certs"
)

// Limits of the certificates a backend reads from an upstream's answer or
// from a file of its URL (ca=, roots=).
const (
	// MaxPEMSize bounds one PEM answer or file.
	MaxPEMSize = 64 << 10
	// MaxCerts bounds the certificates of an answer or a file.
	MaxCerts = 16
)

// ParseCerts parses 1 to MaxCerts PEM certificates of at most MaxPEMSize
// bytes.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	if len(data) > MaxPEMSize {
		return nil, fmt.Errorf("%d bytes of PEM, more than %d", len(data), MaxPEMSize)
	}
	cs, err := certs.ParseCertificates(data)
	if err != nil {
		return nil, err
	}
	if len(cs) == 0 || len(cs) > MaxCerts {
		return nil, fmt.Errorf("%d certificates, want 1 to %d", len(cs), MaxCerts)
	}
	return cs, nil
}

// ReadPEMCerts reads the certificates of the file at path under
// ParseCerts' limits.
func ReadPEMCerts(path string) ([]*x509.Certificate, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxPEMSize+1))
	if err != nil {
		return nil, err
	}
	return ParseCerts(data)
}

// SelfSigned reports whether c is a root: issued by itself, under its own
// key.
func SelfSigned(c *x509.Certificate) bool {
	return bytes.Equal(c.RawIssuer, c.RawSubject) && c.CheckSignatureFrom(c) == nil
}
