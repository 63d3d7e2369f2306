package secretcache

import (
	"context"
	"crypto/x509"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/meshid/meshid/certs"
)

// issue generates a key and asks the signer for a certificate for it. The
// signer verifies the answer (caclient.Verify): the leaf holds our key and
// exactly our SPIFFE ID, and the chain verifies to the returned roots now.
// It returns the default and ROOTCA secrets.
func (m *Manager) issue(ctx context.Context) (cert, roots *Secret, err error) {
	key, err := certs.GenerateKey(m.keyType)
	if err != nil {
		return nil, nil, fmt.Errorf("secretcache: generate key: %w", err)
	}
	der, err := certs.NewCSR(key, m.id)
	if err != nil {
		return nil, nil, fmt.Errorf("secretcache: %w", err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, nil, fmt.Errorf("secretcache: %w", err)
	}
	chain, rootCerts, err := m.signer.Sign(ctx, csr, m.ttl)
	if err != nil {
		return nil, nil, err
	}
	return newCertSecret(DefaultName, chain, key, m.id.TrustDomain()),
		newRootSecret(RootName, rootCerts, m.id.TrustDomain()), nil
}

// backoff returns the delay before retry number attempt (1-based): base
// doubled per earlier attempt, capped at max, then shortened by up to 20%
// according to u in [0,1) so that many agents do not retry in step.
func backoff(attempt int, base, max time.Duration, u float64) time.Duration {
	d := base
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	d = min(d, max)
	return d - time.Duration(u*0.2*float64(d))
}

func randFloat() float64 { return rand.Float64() }
