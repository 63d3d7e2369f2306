package sds

import (
	"fmt"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/sds/secretcache"
)

// SecretTypeURL is the xDS type of every SDS resource. It is derived from the
// generated message rather than taken from go-control-plane's resource
// package, which would pull every other xDS type into the agent.
var SecretTypeURL = "type.googleapis.com/" + string(proto.MessageName(&tlsv3.Secret{}))

// SPIFFEValidatorName is the name of Envoy's SPIFFE certificate validator
// extension.
const SPIFFEValidatorName = "envoy.tls.cert_validator.spiffe"

// SPIFFEValidatorMetadataKey is the node metadata field with which a client
// asks for root secrets in the SPIFFE validator form.
const SPIFFEValidatorMetadataKey = "MESHID_SPIFFE_VALIDATOR"

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
	s := &tlsv3.Secret{Name: sec.Name}
	switch {
	case len(sec.Chain) > 0 && sec.Key != nil:
		keyPEM, err := certs.EncodePrivateKey(sec.Key)
		if err != nil {
			return nil, fmt.Errorf("sds: secret %q: %w", sec.Name, err)
		}
		s.Type = &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline(certs.EncodeCertificates(sec.Chain...)),
			PrivateKey:       inline(keyPEM),
		}}
	case len(sec.Roots) > 0:
		e.root = true
		s.Type = &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: inline(certs.EncodeCertificates(sec.Roots...)),
		}}
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
		cfg, err := anypb.New(&tlsv3.SPIFFECertValidatorConfig{
			TrustDomains: []*tlsv3.SPIFFECertValidatorConfig_TrustDomain{{
				Name:        e.secret.TrustDomain.Name(),
				TrustBundle: inline(certs.EncodeCertificates(e.secret.Roots...)),
			}},
		})
		if err != nil {
			return
		}
		a, err := anypb.New(&tlsv3.Secret{
			Name: e.name,
			Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
				CustomValidatorConfig: &corev3.TypedExtensionConfig{Name: SPIFFEValidatorName, TypedConfig: cfg},
			}},
		})
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

func inline(b []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
}
