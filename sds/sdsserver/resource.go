package sdsserver

import (
	"fmt"
	"sync"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshid/meshid/sds/envoysecret"
	"github.com/meshid/meshid/sds/secretcache"
)

// The SDS wire constants, from the one place that defines the format.
const (
	// SecretTypeURL is the xDS type of every SDS resource.
	SecretTypeURL = envoysecret.TypeURL
	// SPIFFEValidatorName is the name of Envoy's SPIFFE certificate
	// validator extension.
	SPIFFEValidatorName = envoysecret.SPIFFEValidatorName
	// SPIFFEValidatorMetadataKey is the node metadata field with which a
	// client asks for root secrets in the SPIFFE validator form.
	SPIFFEValidatorMetadataKey = envoysecret.SPIFFEValidatorMetadataKey
)

// entry is one version of one secret together with the Envoy resources built
// from it. It is immutable once built, except for the lazily built SPIFFE
// form, and shared by every stream.
type entry struct {
	name    string
	version string
	unknown bool                // the Source does not know the name
	secret  *secretcache.Secret // nil when unknown
	root    bool                // a validation context (ROOTCA, file-root)

	plain  *anypb.Any            // the Secret as Any
	dPlain *discoveryv3.Resource // the same for delta responses

	spiffeOnce sync.Once
	spiffe     *anypb.Any
	dSpiffe    *discoveryv3.Resource
}

// unknown is the entry of a name the Source does not know.
var unknown = &entry{unknown: true}

// newEntry builds the resources of sec. The private key is PEM-encoded here,
// once per version; the PEM lives only in the serialized resource.
func newEntry(sec *secretcache.Secret) (*entry, error) {
	e := &entry{name: sec.Name, version: sec.Version, secret: sec}
	var s *tlsv3.Secret
	switch {
	case sec.Name == secretcache.FederatedRootName:
		return newFederatedEntry(e)
	case len(sec.Chain) > 0 && sec.Key != nil:
		var err error
		if s, err = envoysecret.TLSCertificate(sec.Name, sec.Chain, sec.Key); err != nil {
			return nil, fmt.Errorf("sds: %w", err)
		}
	case len(sec.Roots) > 0:
		e.root = true
		s = envoysecret.ValidationContext(sec.Name, sec.Roots)
	default:
		return nil, fmt.Errorf("sds: secret %q has neither a certificate and key nor roots", sec.Name)
	}
	a, err := anypb.New(s)
	if err != nil {
		return nil, fmt.Errorf("sds: secret %q: %w", sec.Name, err)
	}
	e.plain = a
	e.dPlain = &discoveryv3.Resource{Name: sec.Name, Version: sec.Version, Resource: a}
	return e, nil
}

// resource returns the Any to send; spiffe selects the SPIFFE validator form
// of a root secret that has a trust domain.
func (e *entry) resource(spiffe bool) *anypb.Any {
	if spiffe && e.buildSPIFFE() {
		return e.spiffe
	}
	return e.plain
}

// deltaResource is resource for delta responses.
func (e *entry) deltaResource(spiffe bool) *discoveryv3.Resource {
	if spiffe && e.buildSPIFFE() {
		return e.dSpiffe
	}
	return e.dPlain
}

// buildSPIFFE builds the SPIFFE validator form once and reports whether it
// exists for this entry.
func (e *entry) buildSPIFFE() bool {
	if !e.root || e.secret.TrustDomain.IsZero() {
		return false
	}
	e.spiffeOnce.Do(func() {
		s, err := envoysecret.SPIFFEValidator(e.name, e.secret.TrustDomain, e.secret.Roots)
		if err != nil {
			return
		}
		a, err := anypb.New(s)
		if err != nil {
			return
		}
		e.spiffe = a
		e.dSpiffe = &discoveryv3.Resource{Name: e.name, Version: e.version, Resource: a}
	})
	return e.spiffe != nil
}

// expired reports whether the entry holds a certificate that must no longer
// be served.
func (e *entry) expired(now time.Time) bool {
	return e.secret != nil && !e.secret.NotAfter.IsZero() && !now.Before(e.secret.NotAfter)
}
