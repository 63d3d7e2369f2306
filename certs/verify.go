package certs

import (
	"crypto/x509"
	"errors"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// VerifyChain verifies chain[0] with chain[1:] as intermediates against
// roots at now. Any extended key usage is accepted: SPIFFE leaves and CA
// certificates may carry any or none. It returns the verified chains, each
// from chain[0] to one of roots. crypto/x509 does the path building (name
// constraints, path length, key usage).
func VerifyChain(chain, roots []*x509.Certificate, now time.Time) ([][]*x509.Certificate, error) {
	if len(chain) == 0 {
		return nil, errors.New("certs: verify: empty chain")
	}
	opts := x509.VerifyOptions{
		Roots:         x509.NewCertPool(),
		Intermediates: x509.NewCertPool(),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}
	for _, r := range roots {
		opts.Roots.AddCert(r)
	}
	for _, c := range chain[1:] {
		opts.Intermediates.AddCert(c)
	}
	return chain[0].Verify(opts)
}

// VerifySVID verifies chain (leaf first) as an X509-SVID of trust domain td
// whose roots are roots, at now, and returns the leaf's SPIFFE ID.
// go-spiffe checks what an X509-SVID must be (exactly one SPIFFE URI SAN,
// not a CA, no certSign or CRLSign usage) and verifies the chain as
// VerifyChain does; a leaf of another trust domain has no roots here and is
// refused.
func VerifySVID(chain []*x509.Certificate, td spiffeid.TrustDomain, roots []*x509.Certificate, now time.Time) (spiffeid.ID, error) {
	bundle := x509bundle.FromX509Authorities(td, roots)
	id, _, err := x509svid.Verify(chain, bundle, x509svid.WithTime(now))
	return id, err
}
