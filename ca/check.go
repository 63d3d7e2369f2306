package ca

import (
	"fmt"

	"github.com/meshid/meshid/ca/keystore"
)

// Check runs on b every test SetBundle runs (the bundle validates now, its
// key signs a probe leaf that verifies) without switching to it. A CA
// rotation checks a new CA with it when the CA is offered, long before it
// is activated, so that a CA that cannot sign is refused at once.
func (a *Authority) Check(b *keystore.Bundle) error {
	_, err := a.issuerFor(b)
	return err
}

// issuerFor is the issuer of b once b has passed the checks SetBundle and
// Check share: it validates now, and its key signs a probe leaf that verifies.
func (a *Authority) issuerFor(b *keystore.Bundle) (*issuer, error) {
	now := a.clock.Now()
	if err := b.Validate(now); err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	is, err := newIssuer(b)
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	if err := is.probe(now); err != nil {
		return nil, fmt.Errorf("ca: CA key cannot sign leaves: %w", err)
	}
	return is, nil
}
