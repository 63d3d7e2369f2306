package spiffefed

import (
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/internal/clock"
)

// Source returns what the bundle endpoint publishes: the CA's current
// roots (during a rotation the union of the old and new ones, exactly what
// ROOTCA holds) and the JWKS of the JWT-SVID signing keys (nil: none).
type Source func() (roots []*x509.Certificate, jwks []byte, err error)

// publisher is the spiffebundle.Source of the endpoint: the bundle of the
// Source's keys, whose sequence number grows on every change.
type publisher struct {
	td    spiffeid.TrustDomain
	hint  time.Duration
	src   Source
	clock clock.Clock

	mu  sync.Mutex
	cur *spiffebundle.Bundle
}

// GetBundleForTrustDomain implements spiffebundle.Source.
func (p *publisher) GetBundleForTrustDomain(td spiffeid.TrustDomain) (*spiffebundle.Bundle, error) {
	if td != p.td {
		return nil, fmt.Errorf("spiffefed: no bundle for trust domain %s", td)
	}
	return p.bundle()
}

// bundle returns the current bundle. A change of content takes the
// sequence number max(previous+1, now in Unix seconds): it grows on every
// change and, on the clock, across restarts too without any state.
func (p *publisher) bundle() (*spiffebundle.Bundle, error) {
	roots, jwks, err := p.src()
	if err != nil {
		return nil, err
	}
	b := spiffebundle.FromX509Authorities(p.td, roots)
	if len(jwks) > 0 {
		jb, err := jwtbundle.Parse(p.td, jwks)
		if err != nil {
			return nil, fmt.Errorf("spiffefed: the JWT-SVID keys: %w", err)
		}
		b.SetJWTAuthorities(jb.JWTAuthorities())
	}
	b.SetRefreshHint(p.hint)
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := uint64(max(p.clock.Now().Unix(), 1))
	if p.cur != nil {
		old, _ := p.cur.SequenceNumber()
		b.SetSequenceNumber(old)
		if b.Equal(p.cur) {
			return p.cur, nil
		}
		seq = max(seq, old+1)
	}
	b.SetSequenceNumber(seq)
	p.cur = b
	return b, nil
}

// sequence returns the sequence number of the last bundle served (0
// before the first).
func (p *publisher) sequence() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return 0
	}
	n, _ := p.cur.SequenceNumber()
	return n
}
