package secretdump

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/meshid/meshid/certs"
)

// Path is where the agent serves the dump.
const Path = "/debug/secrets"

// MaxSize bounds a dump a client reads: a chain and a root bundle are a
// few KiB; 4 MiB leaves room for very large bundles.
const MaxSize = 4 << 20

// Types of a Secret, as Envoy names them.
const (
	TypeTLSCertificate    = "tls_certificate"
	TypeValidationContext = "validation_context"
)

// Dump is what the agent holds.
type Dump struct {
	Identity string `json:"identity"`
	// Ready is the agent's readiness; Reason says why it is not (for
	// example the CA's last refusal), the same text as /readyz.
	Ready   bool     `json:"ready"`
	Reason  string   `json:"reason,omitempty"`
	Secrets []Secret `json:"secrets"`
}

// Secret is one resource: a certificate chain (leaf first) or roots, as
// PEM.
type Secret struct {
	Name     string    `json:"name"`
	Type     string    `json:"type"`
	Version  string    `json:"version,omitempty"`
	NotAfter time.Time `json:"not_after"`
	// CertificateChain is set for TypeTLSCertificate.
	CertificateChain string `json:"certificate_chain,omitempty"`
	// TrustedCA is set for TypeValidationContext.
	TrustedCA string `json:"trusted_ca,omitempty"`
}

// Chain is the secret for a certificate chain.
func Chain(name, version string, chain []*x509.Certificate, notAfter time.Time) Secret {
	return Secret{Name: name, Type: TypeTLSCertificate, Version: version, NotAfter: notAfter, CertificateChain: string(certs.EncodeCertificates(chain...))}
}

// Roots is the secret for a root bundle.
func Roots(name, version string, roots []*x509.Certificate, notAfter time.Time) Secret {
	return Secret{Name: name, Type: TypeValidationContext, Version: version, NotAfter: notAfter, TrustedCA: string(certs.EncodeCertificates(roots...))}
}

// Certificates parses the secret's chain or roots.
func (s Secret) Certificates() ([]*x509.Certificate, error) {
	pem := s.CertificateChain
	if s.Type == TypeValidationContext {
		pem = s.TrustedCA
	}
	cs, err := certs.ParseCertificates([]byte(pem))
	if err != nil {
		return nil, fmt.Errorf("secret %q: %v", s.Name, err)
	}
	return cs, nil
}

// Handler serves current() as JSON to GET and HEAD.
func Handler(current func() Dump) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "GET only", http.StatusMethodNotAllowed)
			return
		}
		d := current()
		if d.Secrets == nil {
			d.Secrets = []Secret{}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(d)
	})
}

// OffMessage is the answer of an agent whose dump is turned off.
const OffMessage = Path + " is turned off on this agent (--debug-secrets=false)"

// Off answers every request 404 with OffMessage, so that `meshid inspect
// --pod` says why there is nothing to read.
func Off() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, OffMessage, http.StatusNotFound)
	})
}

// Parse decodes a dump and checks that every secret parses.
func Parse(data []byte) (*Dump, error) {
	if len(data) > MaxSize {
		return nil, fmt.Errorf("secretdump: %d bytes, more than %d", len(data), MaxSize)
	}
	var d Dump
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("secretdump: not a secret dump: %v", err)
	}
	for _, s := range d.Secrets {
		switch s.Type {
		case TypeTLSCertificate, TypeValidationContext:
		default:
			return nil, fmt.Errorf("secretdump: secret %q: unknown type %q", s.Name, s.Type)
		}
		if _, err := s.Certificates(); err != nil {
			return nil, fmt.Errorf("secretdump: %v", err)
		}
	}
	if d.Identity == "" && len(d.Secrets) == 0 && !d.Ready && d.Reason == "" {
		return nil, errors.New("secretdump: empty dump")
	}
	return &d, nil
}
