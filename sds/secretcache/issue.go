package secretcache

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/certs"
)

// errInvalidResponse marks a CA answer the Manager refused.
var errInvalidResponse = errors.New("secretcache: invalid CA response")

// issue generates a key, asks the signer for a certificate and checks the
// answer: the leaf must hold our key and exactly our SPIFFE ID, and the chain
// must verify to the returned roots now. It returns the default and ROOTCA
// secrets.
func (m *Manager) issue(ctx context.Context) (cert, roots *Secret, err error) {
	key, err := certs.GenerateKey(m.keyType)
	if err != nil {
		return nil, nil, fmt.Errorf("secretcache: generate key: %w", err)
	}
	der, err := certs.NewCSR(key, m.id)
	if err != nil {
		return nil, nil, fmt.Errorf("secretcache: %w", err)
	}
	chain, rootCerts, err := m.signer.Sign(ctx, certs.EncodeCSR(der), m.ttl)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case len(chain) == 0:
		return nil, nil, fmt.Errorf("%w: no certificate", errInvalidResponse)
	case len(rootCerts) == 0:
		return nil, nil, fmt.Errorf("%w: no roots", errInvalidResponse)
	case !certs.KeyMatches(chain[0].PublicKey, key):
		return nil, nil, fmt.Errorf("%w: the leaf does not hold the key of the CSR", errInvalidResponse)
	}
	// go-spiffe's X509-SVID verification checks the leaf's SPIFFE ID (one
	// URI SAN), that it is not a CA, and the chain to the bundle.
	bundle := x509bundle.FromX509Authorities(m.id.TrustDomain(), rootCerts)
	got, _, err := x509svid.Verify(chain, bundle, x509svid.WithTime(m.clock.Now()))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", errInvalidResponse, err)
	}
	if got != m.id {
		return nil, nil, fmt.Errorf("%w: leaf identity %s, want %s", errInvalidResponse, got, m.id)
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

// codeOf names the failure for logs and metrics: "invalid_response" for
// answers the Manager refused, the FailureCode of an error that has one
// (caclient's local failures), else the gRPC code.
func codeOf(err error) string {
	if errors.Is(err, errInvalidResponse) {
		return "invalid_response"
	}
	var fc interface{ FailureCode() string }
	if errors.As(err, &fc) {
		return fc.FailureCode()
	}
	if s, ok := status.FromError(err); ok {
		return s.Code().String()
	}
	return "Unknown"
}
