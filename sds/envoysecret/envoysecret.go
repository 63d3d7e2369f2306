package envoysecret

import (
	"bytes"
	"cmp"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshid/meshid/certs"
)

// TypeURL is the xDS type of every SDS resource. It is spelled out rather
// than taken from go-control-plane's resource package, which would pull
// every other xDS type into the agent; a test checks it against the
// generated message.
const TypeURL = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"

// SPIFFEValidatorName is the name of Envoy's SPIFFE certificate validator
// extension.
const SPIFFEValidatorName = "envoy.tls.cert_validator.spiffe"

// SPIFFEValidatorMetadataKey is the node metadata field with which a client
// asks for root secrets in the SPIFFE validator form.
const SPIFFEValidatorMetadataKey = "MESHID_SPIFFE_VALIDATOR"

// TLSCertificate encodes a certificate chain (leaf first) and its key.
func TLSCertificate(name string, chain []*x509.Certificate, key crypto.Signer) (*tlsv3.Secret, error) {
	keyPEM, err := certs.EncodePrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("envoysecret: secret %q: %w", name, err)
	}
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: inline(certs.EncodeCertificates(chain...)),
		PrivateKey:       inline(keyPEM),
	}}}, nil
}

// ValidationContext encodes a root bundle as trusted_ca.
func ValidationContext(name string, roots []*x509.Certificate) *tlsv3.Secret {
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: inline(certs.EncodeCertificates(roots...)),
	}}}
}

// SPIFFEValidator encodes a root bundle as Envoy's SPIFFE certificate
// validator for the trust domain td.
func SPIFFEValidator(name string, td spiffeid.TrustDomain, roots []*x509.Certificate) (*tlsv3.Secret, error) {
	return SPIFFEValidatorBundles(name, map[spiffeid.TrustDomain][]*x509.Certificate{td: roots})
}

// SPIFFEValidatorBundles encodes Envoy's SPIFFE certificate validator
// with one trust bundle per trust domain (sorted by name): Envoy picks the
// bundle of the peer's trust domain, so the domains are never merged.
func SPIFFEValidatorBundles(name string, bundles map[spiffeid.TrustDomain][]*x509.Certificate) (*tlsv3.Secret, error) {
	tds := slices.SortedFunc(maps.Keys(bundles), func(a, b spiffeid.TrustDomain) int { return cmp.Compare(a.Name(), b.Name()) })
	vc := &tlsv3.SPIFFECertValidatorConfig{}
	for _, td := range tds {
		vc.TrustDomains = append(vc.TrustDomains, &tlsv3.SPIFFECertValidatorConfig_TrustDomain{
			Name:        td.Name(),
			TrustBundle: inline(certs.EncodeCertificates(bundles[td]...)),
		})
	}
	cfg, err := anypb.New(vc)
	if err != nil {
		return nil, fmt.Errorf("envoysecret: secret %q: %w", name, err)
	}
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		CustomValidatorConfig: &corev3.TypedExtensionConfig{Name: SPIFFEValidatorName, TypedConfig: cfg},
	}}}, nil
}

func inline(b []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
}

// Kind is the kind of a decoded secret.
type Kind string

// Secret kinds.
const (
	KindTLSCertificate    Kind = "tls_certificate"
	KindValidationContext Kind = "validation_context"
	KindOther             Kind = "other" // session ticket keys, generic secrets
)

// Secret is a decoded SDS Secret.
type Secret struct {
	Name  string
	Kind  Kind
	Chain []*x509.Certificate // tls_certificate.certificate_chain, leaf first
	Key   crypto.Signer       // tls_certificate.private_key; nil when not sent
	Roots []*x509.Certificate // validation_context.trusted_ca and SPIFFE validator bundles
}

// Parse decodes an SDS Secret into typed values. Errors name the field and
// never include key material. A filename data source is read from this
// host, as Envoy on the same host would.
func Parse(sec *tlsv3.Secret) (*Secret, error) {
	s := &Secret{Name: sec.GetName(), Kind: KindOther}
	switch t := sec.GetType().(type) {
	case *tlsv3.Secret_TlsCertificate:
		s.Kind = KindTLSCertificate
		chain, err := dataSource(t.TlsCertificate.GetCertificateChain())
		if err != nil {
			return nil, fmt.Errorf("certificate_chain: %w", err)
		}
		if s.Chain, err = parseCertificates(chain); err != nil {
			return nil, fmt.Errorf("certificate_chain: %w", err)
		}
		if pk := t.TlsCertificate.GetPrivateKey(); pk != nil {
			key, err := dataSource(pk)
			if err != nil {
				return nil, fmt.Errorf("private_key: %w", err)
			}
			if s.Key, err = certs.ParsePrivateKey(key); err != nil {
				return nil, fmt.Errorf("private_key: %w", err)
			}
		}
	case *tlsv3.Secret_ValidationContext:
		s.Kind = KindValidationContext
		vc := t.ValidationContext
		if ca := vc.GetTrustedCa(); ca != nil {
			pemData, err := dataSource(ca)
			if err != nil {
				return nil, fmt.Errorf("trusted_ca: %w", err)
			}
			if s.Roots, err = parseCertificates(pemData); err != nil {
				return nil, fmt.Errorf("trusted_ca: %w", err)
			}
		}
		if cv := vc.GetCustomValidatorConfig(); cv != nil && cv.GetName() == SPIFFEValidatorName {
			var cfg tlsv3.SPIFFECertValidatorConfig
			if err := cv.GetTypedConfig().UnmarshalTo(&cfg); err != nil {
				return nil, fmt.Errorf("custom_validator_config: %v", err)
			}
			for _, td := range cfg.GetTrustDomains() {
				pemData, err := dataSource(td.GetTrustBundle())
				if err != nil {
					return nil, fmt.Errorf("trust domain %q bundle: %w", td.GetName(), err)
				}
				roots, err := parseCertificates(pemData)
				if err != nil {
					return nil, fmt.Errorf("trust domain %q bundle: %w", td.GetName(), err)
				}
				s.Roots = append(s.Roots, roots...)
			}
		}
		if len(s.Roots) == 0 {
			return nil, errors.New("validation context has no trusted CA")
		}
	}
	return s, nil
}

// parseCertificates is certs.ParseCertificates, with a truncated first
// block called truncated rather than absent.
func parseCertificates(data []byte) ([]*x509.Certificate, error) {
	cs, err := certs.ParseCertificates(data)
	if errors.Is(err, certs.ErrNoPEM) && bytes.Contains(data, []byte("-----BEGIN")) {
		return nil, errors.New("truncated or corrupt PEM")
	}
	return cs, err
}

// dataSource returns the bytes of an Envoy DataSource.
func dataSource(ds *corev3.DataSource) ([]byte, error) {
	switch sp := ds.GetSpecifier().(type) {
	case *corev3.DataSource_InlineBytes:
		return sp.InlineBytes, nil
	case *corev3.DataSource_InlineString:
		return []byte(sp.InlineString), nil
	case *corev3.DataSource_Filename:
		b, err := os.ReadFile(sp.Filename)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return nil, fmt.Errorf("read %s: %w", sp.Filename, err)
		}
		return b, nil
	case nil:
		return nil, errors.New("empty data source")
	default:
		return nil, fmt.Errorf("unsupported data source %T", sp)
	}
}
