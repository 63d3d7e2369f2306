package secretcache

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Resource names, as Istio's agent and Envoy use them.
const (
	// DefaultName is the workload certificate and key.
	DefaultName = "default"
	// RootName is the root bundle of the mesh.
	RootName = "ROOTCA"
	// FederatedRootName is the mesh's roots and those of every federated
	// trust domain, one bundle per trust domain (federated.go).
	FederatedRootName = "ROOTCA_FEDERATED"
	// FileCertPrefix starts a file-mounted certificate name:
	// file-cert:<cert-path>~<key-path>.
	FileCertPrefix = "file-cert:"
	// FileRootPrefix starts a file-mounted root bundle name:
	// file-root:<path>.
	FileRootPrefix = "file-root:"
)

var (
	// ErrUnknownResource is returned for a name the Manager cannot serve.
	ErrUnknownResource = errors.New("secretcache: unknown resource")
	// ErrNotReady is returned when a known resource cannot be produced
	// yet: the CA failed (the cause is wrapped too), the cached
	// certificate expired, or a mounted file is missing or invalid.
	ErrNotReady = errors.New("secretcache: resource not ready")
)

// Secret is one resource served over SDS. A Secret is immutable once
// returned; a change produces a new *Secret with a new Version.
type Secret struct {
	Name string
	// Version changes whenever the content changes, and only then: it is
	// derived from a hash of the certificates.
	Version string
	// Chain is the TLS certificate: leaf then intermediates (nil for root
	// secrets).
	Chain []*x509.Certificate
	// Key is the TLS certificate's private key (nil for root secrets).
	Key crypto.Signer
	// Roots is the validation context (ROOTCA, file-root); nil for
	// certificate secrets.
	Roots []*x509.Certificate
	// TrustDomain is the trust domain the secret belongs to, for the SPIFFE
	// certificate validator.
	TrustDomain spiffeid.TrustDomain
	// Federated holds the roots of each federated trust domain
	// (FederatedRootName only; Roots are then the mesh's own).
	Federated map[spiffeid.TrustDomain][]*x509.Certificate
	// NotAfter is the earliest expiry of the certificates held.
	NotAfter time.Time
}

// newCertSecret builds a certificate secret.
func newCertSecret(name string, chain []*x509.Certificate, key crypto.Signer, td spiffeid.TrustDomain) *Secret {
	return &Secret{
		Name:        name,
		Version:     versionOf(chain),
		Chain:       chain,
		Key:         key,
		TrustDomain: td,
		NotAfter:    earliestNotAfter(chain),
	}
}

// newRootSecret builds a root bundle secret.
func newRootSecret(name string, roots []*x509.Certificate, td spiffeid.TrustDomain) *Secret {
	return &Secret{
		Name:        name,
		Version:     versionOf(roots),
		Roots:       roots,
		TrustDomain: td,
		NotAfter:    earliestNotAfter(roots),
	}
}

// versionOf hashes the DER of the certificates, so that a version changes
// exactly when the content does. The key needs no hashing: it must match the
// leaf, so a new key means a new leaf.
func versionOf(cs []*x509.Certificate) string {
	h := sha256.New()
	for _, c := range cs {
		h.Write(c.Raw)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

func earliestNotAfter(cs []*x509.Certificate) time.Time {
	var t time.Time
	for _, c := range cs {
		if t.IsZero() || c.NotAfter.Before(t) {
			t = c.NotAfter
		}
	}
	return t
}

// resourceKind classifies a resource name.
type resourceKind int

const (
	kindUnknown resourceKind = iota
	kindDefault
	kindRoot
	kindFileCert
	kindFileRoot
	kindFederatedRoot
)

// parsedName is a parsed resource name. For file names the paths are
// absolute and clean.
type parsedName struct {
	kind     resourceKind
	certPath string // file-cert: certificate; file-root: the bundle
	keyPath  string // file-cert only
}

// clean reports whether a file name's path is spelled cleanly: as
// filepath.Clean spells it, or that with "./" in front (Istio's
// "./etc/certs/..."). Other spellings ("a//b", "a/./b", "a/../b") are
// refused, by name alone: each spelling is a resource of its own, with its
// own encoded copy of the file, so free spellings would let one client
// multiply the memory a large file costs.
func clean(p string) bool {
	c := filepath.Clean(p)
	return p == c || p == "./"+c
}

// parseName classifies name and, for file names, extracts the paths.
func parseName(name string) (parsedName, error) {
	switch {
	case name == DefaultName:
		return parsedName{kind: kindDefault}, nil
	case name == RootName:
		return parsedName{kind: kindRoot}, nil
	case name == FederatedRootName:
		return parsedName{kind: kindFederatedRoot}, nil
	case strings.HasPrefix(name, FileCertPrefix):
		cert, key, ok := strings.Cut(strings.TrimPrefix(name, FileCertPrefix), "~")
		if ok && cert != "" && key != "" && (!clean(cert) || !clean(key)) {
			return parsedName{}, fileNotFound(name)
		}
		if !ok || cert == "" || key == "" || strings.Contains(key, "~") {
			return parsedName{}, fmt.Errorf("%w %q: want file-cert:<cert-path>~<key-path>", ErrUnknownResource, name)
		}
		cp, err := filepath.Abs(cert)
		if err != nil {
			return parsedName{}, fmt.Errorf("%w %q: %v", ErrUnknownResource, name, err)
		}
		kp, err := filepath.Abs(key)
		if err != nil {
			return parsedName{}, fmt.Errorf("%w %q: %v", ErrUnknownResource, name, err)
		}
		return parsedName{kind: kindFileCert, certPath: cp, keyPath: kp}, nil
	case strings.HasPrefix(name, FileRootPrefix):
		p := strings.TrimPrefix(name, FileRootPrefix)
		if p != "" && !clean(p) {
			return parsedName{}, fileNotFound(name)
		}
		if p == "" {
			return parsedName{}, fmt.Errorf("%w %q: want file-root:<path>", ErrUnknownResource, name)
		}
		rp, err := filepath.Abs(p)
		if err != nil {
			return parsedName{}, fmt.Errorf("%w %q: %v", ErrUnknownResource, name, err)
		}
		return parsedName{kind: kindFileRoot, certPath: rp}, nil
	}
	return parsedName{}, fmt.Errorf("%w %q", ErrUnknownResource, name)
}
