package sdsserver

import (
	"crypto/x509"
	"fmt"
	"maps"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshid/meshid/sds/envoysecret"
)

// newFederatedEntry completes e, whose secret is ROOTCA_FEDERATED: Envoy's
// SPIFFE certificate validator with one trust bundle per trust domain, the
// mesh's own and each federated one. It has no plain trusted_ca form
// (that would merge the trust domains), so both forms are this one.
func newFederatedEntry(e *entry) (*entry, error) {
	sec := e.secret
	bundles := make(map[spiffeid.TrustDomain][]*x509.Certificate, len(sec.Federated)+1)
	maps.Copy(bundles, sec.Federated)
	bundles[sec.TrustDomain] = sec.Roots
	s, err := envoysecret.SPIFFEValidatorBundles(sec.Name, bundles)
	if err != nil {
		return nil, fmt.Errorf("sds: %w", err)
	}
	a, err := anypb.New(s)
	if err != nil {
		return nil, fmt.Errorf("sds: secret %q: %w", sec.Name, err)
	}
	e.root = true
	e.plain = a
	e.dPlain = &discoveryv3.Resource{Name: sec.Name, Version: sec.Version, Resource: a}
	e.spiffeOnce.Do(func() { e.spiffe, e.dSpiffe = e.plain, e.dPlain })
	return e, nil
}
