package rootfile

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/meshid/meshid/certs"
)

// DefaultMaxRoots bounds the certificates a root file may hold. A mesh
// bundle holds its root, two during a CA rotation (the old and the new
// root, test/e2e/carotation_test.go), a few more with federated or
// multi-cluster roots; a system CA bundle holds 100-150.
const DefaultMaxRoots = 16

// MaxSize bounds the bytes Read reads: DefaultMaxRoots roots of RSA-4096
// are about 35 KB of PEM.
const MaxSize = 1 << 20

// SystemBundles are the system CA bundles of the Linux distributions (the
// list of Go's crypto/x509 root_linux.go, and FreeBSD's): Read refuses
// them, and any path that is the same file (a symbolic or hard link).
var SystemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",                // Debian, Ubuntu, Gentoo, distroless
	"/etc/pki/tls/certs/ca-bundle.crt",                  // Fedora, RHEL 6
	"/etc/ssl/ca-bundle.pem",                            // OpenSUSE
	"/etc/pki/tls/cacert.pem",                           // OpenELEC
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", // CentOS, RHEL 7
	"/etc/ssl/cert.pem",                                 // Alpine
	"/var/lib/ca-certificates/ca-bundle.pem",            // OpenSUSE
	"/usr/local/share/certs/ca-root-nss.crt",            // FreeBSD
}

// ErrSystemBundle is the error of a root file that is a system CA bundle.
var ErrSystemBundle = errors.New("is the system CA bundle: the agent would trust every public CA for its CA connection and push them to Envoy as ROOTCA; give the mesh's root (istio-ca-root-cert's root-cert.pem)")

// Read returns the roots of the PEM file path, or an error naming path: the
// file cannot be read, is a system bundle, is larger than MaxSize, is not
// PEM certificates, or holds more than maxRoots (below 1: DefaultMaxRoots).
func Read(path string, maxRoots int) ([]*x509.Certificate, error) {
	if sys := systemBundle(path); sys != "" {
		if sys != filepath.Clean(path) {
			return nil, fmt.Errorf("%s (the same file as %s) %w", path, sys, ErrSystemBundle)
		}
		return nil, fmt.Errorf("%s %w", path, ErrSystemBundle)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err // names path
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(data) > MaxSize {
		return nil, fmt.Errorf("%s: larger than %d bytes, more than a mesh's roots (a system CA bundle?)", path, MaxSize)
	}
	roots, err := certs.ParseCertificates(data) // at least one, or an error
	if err == nil {
		err = Check(roots, maxRoots)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return roots, nil
}

// Check refuses more than maxRoots roots (below 1: DefaultMaxRoots).
func Check(roots []*x509.Certificate, maxRoots int) error {
	if maxRoots < 1 {
		maxRoots = DefaultMaxRoots
	}
	if len(roots) > maxRoots {
		return fmt.Errorf("%d certificates, more than the %d roots of a mesh (a system CA bundle?): give only the mesh's roots", len(roots), maxRoots)
	}
	return nil
}

// systemBundle is the entry of SystemBundles that path is, or "".
func systemBundle(path string) string {
	clean := filepath.Clean(path)
	st, err := os.Stat(path)
	for _, sys := range SystemBundles {
		if clean == sys {
			return sys
		}
		if err != nil {
			continue
		}
		if sst, serr := os.Stat(sys); serr == nil && os.SameFile(st, sst) {
			return sys
		}
	}
	return ""
}
