package certs

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"net/url"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// NewCSR returns a DER certificate request, signed by key, whose only SAN is
// the SPIFFE ID. The subject is empty, as SPIFFE X509-SVIDs expect.
func NewCSR(key crypto.Signer, id spiffeid.ID) ([]byte, error) {
	u, err := url.Parse(id.String())
	if err != nil {
		return nil, fmt.Errorf("certs: spiffe id: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}}, key)
	if err != nil {
		return nil, fmt.Errorf("certs: create CSR: %w", err)
	}
	return der, nil
}
