package sdsfetch

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/meshid/meshid/certs"
)

// spiffeValidator is the name Envoy gives its SPIFFE certificate validator.
const spiffeValidator = "envoy.tls.cert_validator.spiffe"

// parseSecret turns an SDS Secret into typed values. Errors name the field
// and never include key material.
func parseSecret(sec *tlsv3.Secret) (*Secret, error) {
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
		if cv := vc.GetCustomValidatorConfig(); cv != nil && cv.GetName() == spiffeValidator {
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

// dataSource returns the bytes of an Envoy DataSource. A filename source is
// read from this host, as Envoy on the same host would.
func dataSource(ds *corev3.DataSource) ([]byte, error) {
	switch sp := ds.GetSpecifier().(type) {
	case *corev3.DataSource_InlineBytes:
		return sp.InlineBytes, nil
	case *corev3.DataSource_InlineString:
		return []byte(sp.InlineString), nil
	case *corev3.DataSource_Filename:
		b, err := os.ReadFile(sp.Filename)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", sp.Filename, unwrapPath(err))
		}
		return b, nil
	case nil:
		return nil, errors.New("empty data source")
	default:
		return nil, fmt.Errorf("unsupported data source %T", sp)
	}
}
