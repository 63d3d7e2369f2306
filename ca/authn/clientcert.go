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
	// TrustDomainAliases are other trust domains whose identities this CA
	// also accepts (--trust-domain-aliases, Istio's trust domain aliases),
	// for a mesh moving from one trust domain to another: a certificate
	// of spiffe://<alias>/ns/<ns>/sa/<sa> that verifies against Roots
	// renews ns/sa, in TrustDomain.
	TrustDomainAliases []spiffeid.TrustDomain
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
	cfg   ClientCertConfig // validated, the aliases copied
	clock clock.Clock
}

// NewClientCert validates cfg and returns a client-certificate authenticator.
func NewClientCert(cfg ClientCertConfig) (*ClientCert, error) {
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("authn: ClientCertConfig.TrustDomain is required")
	}
	if cfg.Roots == nil {
		return nil, errors.New("authn: ClientCertConfig.Roots is required")
	}
	if slices.ContainsFunc(cfg.TrustDomainAliases, spiffeid.TrustDomain.IsZero) {
		return nil, errors.New("authn: empty trust domain alias")
	}
	cfg.TrustDomainAliases = slices.Clone(cfg.TrustDomainAliases)
	return &ClientCert{cfg: cfg, clock: clock.OrReal(cfg.Clock)}, nil
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
	if c.cfg.Intermediates != nil {
		chain = append(slices.Clone(chain), c.cfg.Intermediates()...)
	}
	// An X509-SVID of this trust domain or an alias only; other trust
	// domains have no roots here.
	id, err := c.verify(chain)
	if err != nil {
		return nil, ca.Wrap(ca.KindUnauthenticated, err, "clientcert: the client certificate does not verify against this CA")
	}
	sa, err := identity.FromID(id)
	if err != nil {
		return nil, ca.Errorf(ca.KindUnauthenticated, "clientcert: the client certificate's SPIFFE ID is not of the form spiffe://%s/ns/<namespace>/sa/<service-account>", c.cfg.TrustDomain)
	}
	return &Caller{Namespace: sa.Namespace, ServiceAccount: sa.Name, Method: MethodClientCert, Expiry: leaf.NotAfter, Certificate: leaf}, nil
}

// verify verifies chain as an X509-SVID of the trust domain, or else of
// one of its aliases, against this CA's roots.
func (c *ClientCert) verify(chain []*x509.Certificate) (spiffeid.ID, error) {
	roots, now := c.cfg.Roots(), c.clock.Now()
	id, err := certs.VerifySVID(chain, c.cfg.TrustDomain, roots, now)
	for _, td := range c.cfg.TrustDomainAliases {
		if err == nil {
			break
		}
		var aliasErr error
		if id, aliasErr = certs.VerifySVID(chain, td, roots, now); aliasErr == nil {
			err = nil
		}
	}
	return id, err
}
