package authn

import (
	"context"
	"crypto/x509"
	"errors"
	"slices"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/internal/clock"
)

// ClientCertConfig configures NewClientCert.
type ClientCertConfig struct {
	// TrustDomain is the CA's trust domain; a certificate for another
	// trust domain is rejected. Required.
	TrustDomain spiffeid.TrustDomain
	// Roots returns the CA's current root bundle (it changes when the CA
	// is rotated). Required.
	Roots func() []*x509.Certificate
	// Intermediates optionally returns the CA's own chain, so that a client
	// presenting only its leaf still verifies.
	Intermediates func() []*x509.Certificate
	Clock         clock.Clock
}

// ClientCert lets a workload renew its own identity with the still-valid
// certificate this CA issued to it.
type ClientCert struct {
	td            spiffeid.TrustDomain
	roots         func() []*x509.Certificate
	intermediates func() []*x509.Certificate
	clock         clock.Clock
}

// NewClientCert validates cfg and returns a client-certificate authenticator.
func NewClientCert(cfg ClientCertConfig) (*ClientCert, error) {
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("authn: ClientCertConfig.TrustDomain is required")
	}
	if cfg.Roots == nil {
		return nil, errors.New("authn: ClientCertConfig.Roots is required")
	}
	return &ClientCert{td: cfg.TrustDomain, roots: cfg.Roots, intermediates: cfg.Intermediates, clock: clock.OrReal(cfg.Clock)}, nil
}

// Authenticate verifies creds.PeerCertificates as an X509-SVID of this
// trust domain with the clientAuth usage. It returns ErrNoCredentials when
// the request carried no certificate.
func (c *ClientCert) Authenticate(_ context.Context, creds Credentials) (*Caller, error) {
	if len(creds.PeerCertificates) == 0 {
		return nil, ErrNoCredentials
	}
	leaf := creds.PeerCertificates[0]
	if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		return nil, ca.Errorf(ca.KindUnauthenticated, "clientcert: the client certificate lacks the clientAuth usage")
	}
	chain := creds.PeerCertificates
	if c.intermediates != nil {
		chain = append(slices.Clone(chain), c.intermediates()...)
	}
	// An X509-SVID of this trust domain only; other trust domains have no
	// roots here.
	id, err := certs.VerifySVID(chain, c.td, c.roots(), c.clock.Now())
	if err != nil {
		return nil, ca.Wrap(ca.KindUnauthenticated, err, "clientcert: the client certificate does not verify against this CA")
	}
	sa, err := identity.FromID(id)
	if err != nil {
		return nil, ca.Errorf(ca.KindUnauthenticated, "clientcert: the client certificate's SPIFFE ID is not of the form spiffe://%s/ns/<namespace>/sa/<service-account>", c.td)
	}
	return &Caller{Namespace: sa.Namespace, ServiceAccount: sa.Name, Method: MethodClientCert, Expiry: leaf.NotAfter, Certificate: leaf}, nil
}
