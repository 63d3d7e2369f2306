package keystore

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/meshid/meshid/certs"
)

// File names of the two supported layouts.
const (
	// Istio's cacerts layout (also the istio-ca-secret Secret's keys).
	CACertFile    = "ca-cert.pem"    // the signing CA certificate
	CAKeyFile     = "ca-key.pem"     // its private key
	CertChainFile = "cert-chain.pem" // the signing cert's chain up to the root (may include ca-cert and the root)
	RootCertFile  = "root-cert.pem"  // one or more roots

	// RootKeyFile is the key of a root directory (`meshid certs root`):
	// a root that signs intermediates, never a CA directory itself.
	RootKeyFile = "root-key.pem"

	// The Kubernetes TLS Secret layout (cert-manager, kubernetes.io/tls).
	TLSCertFile = "tls.crt" // the signing CA certificate, optionally followed by its chain
	TLSKeyFile  = "tls.key" // its private key
	TLSCAFile   = "ca.crt"  // the roots
)

type layout struct {
	cert, key, chain, roots string // chain is "" when the layout has no chain file
}

var (
	istioLayout = layout{cert: CACertFile, key: CAKeyFile, chain: CertChainFile, roots: RootCertFile}
	tlsLayout   = layout{cert: TLSCertFile, key: TLSKeyFile, roots: TLSCAFile}
)

func (l layout) files() []string {
	out := []string{l.cert, l.key, l.roots}
	if l.chain != "" {
		out = append(out, l.chain)
	}
	return out
}

const wantFiles = "want ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem, or tls.crt, tls.key, ca.crt"

// LoadDir loads a plugged-in CA from dir, in Istio's cacerts layout
// (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem) or the TLS layout
// (tls.crt, tls.key, ca.crt), and validates it at now. Errors name the file
// at fault.
func LoadDir(dir string, now time.Time) (*Bundle, error) {
	return loadDir(dir, nil, now)
}

// LoadDirSigner is LoadDir for a CA whose private key is held elsewhere (a
// PKCS#11 module, see ca/keystore/pkcs11): the certificates come from dir
// and key signs. dir must not hold a key file (ca-key.pem, tls.key), so
// there is never doubt about which key the CA uses; key must match the
// signing certificate.
func LoadDirSigner(dir string, key crypto.Signer, now time.Time) (*Bundle, error) {
	if key == nil {
		return nil, errors.New("keystore: no signing key")
	}
	return loadDir(dir, key, now)
}

func loadDir(dir string, key crypto.Signer, now time.Time) (*Bundle, error) {
	if st, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("keystore: CA directory: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("keystore: %s: not a directory", dir)
	}
	files := map[string][]byte{}
	for _, l := range []layout{istioLayout, tlsLayout} {
		for _, name := range l.files() {
			data, err := os.ReadFile(filepath.Join(dir, name))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("keystore: %w", err)
			}
			files[name] = data
		}
	}
	if len(files[CACertFile]) == 0 && len(files[TLSCertFile]) == 0 {
		if _, err := os.Stat(filepath.Join(dir, RootKeyFile)); err == nil {
			return nil, fmt.Errorf("keystore: %s holds a root (root-cert.pem, root-key.pem), which signs only intermediates: run `meshid certs intermediate --root %s --out DIR --name CLUSTER` and use DIR", dir, dir)
		}
	}
	l, ok := detect(files)
	if !ok {
		return nil, fmt.Errorf("keystore: %s: no CA files found (%s)", dir, wantFiles)
	}
	n := names{
		cert:  filepath.Join(dir, l.cert),
		key:   filepath.Join(dir, l.key),
		roots: filepath.Join(dir, l.roots),
	}
	if l.chain != "" {
		n.chain = filepath.Join(dir, l.chain)
	}
	return load(files, l, n, key, now)
}

// LoadFiles is LoadDir for file contents held in memory, keyed by file name
// (the data of a Kubernetes Secret). Empty entries count as missing, as in
// Istio's istio-ca-secret, whose cert-chain.pem and root-cert.pem are empty
// for a self-signed root.
func LoadFiles(files map[string][]byte, now time.Time) (*Bundle, error) {
	l, ok := detect(files)
	if !ok {
		return nil, fmt.Errorf("keystore: no CA files found (%s)", wantFiles)
	}
	return load(files, l, names{cert: l.cert, key: l.key, chain: l.chain, roots: l.roots}, nil, now)
}

func detect(files map[string][]byte) (layout, bool) {
	for _, l := range []layout{istioLayout, tlsLayout} {
		for _, name := range l.files() {
			if len(files[name]) > 0 {
				return l, true
			}
		}
	}
	return layout{}, false
}

// load builds a bundle from files; with a non-nil signer the key comes
// from it and the key file must be absent.
func load(files map[string][]byte, l layout, n names, signer crypto.Signer, now time.Time) (*Bundle, error) {
	certData := files[l.cert]
	if len(certData) == 0 {
		return nil, fmt.Errorf("keystore: %s: %w", n.cert, errMissing)
	}
	certList, err := certs.ParseCertificates(certData)
	if err != nil {
		return nil, fmt.Errorf("keystore: %s: %w", n.cert, err)
	}
	keyData := files[l.key]
	key := signer
	switch {
	case signer != nil && len(keyData) > 0:
		return nil, fmt.Errorf("keystore: %s exists but the CA key is %s; remove the key file", n.key, signerName(signer))
	case signer != nil:
		n.key = signerName(signer)
	case len(keyData) == 0:
		return nil, fmt.Errorf("keystore: %s: %w", n.key, errMissing)
	default:
		if key, err = parseKey(keyData); err != nil {
			return nil, fmt.Errorf("keystore: %s: %w", n.key, err)
		}
	}
	// Candidates for the intermediates: whatever follows the CA cert in its
	// own file, then the chain file. Either may repeat the CA cert or hold
	// the root; path building below keeps only the real intermediates.
	candidates := certList[1:]
	if l.chain != "" && len(files[l.chain]) > 0 {
		chain, err := certs.ParseCertificates(files[l.chain])
		if err != nil {
			return nil, fmt.Errorf("keystore: %s: %w", n.chain, err)
		}
		candidates = append(candidates, chain...)
	}
	var roots []*x509.Certificate
	if data := files[l.roots]; len(data) > 0 {
		roots, err = certs.ParseCertificates(data)
		if err != nil {
			return nil, fmt.Errorf("keystore: %s: %w", n.roots, err)
		}
	}
	b := &Bundle{Cert: certList[0], Key: key}
	if len(roots) == 0 {
		// No root file: the roots are the self-signed certificates given,
		// as in a self-signed istio-ca-secret.
		for _, c := range certList {
			if selfSigned(c) && !containsCert(roots, c) {
				roots = append(roots, c)
			}
		}
		for _, c := range candidates {
			if selfSigned(c) && !containsCert(roots, c) {
				roots = append(roots, c)
			}
		}
		if len(roots) == 0 {
			return nil, fmt.Errorf("keystore: %s: %w (needed because %s is not self-signed)", n.roots, errMissing, n.cert)
		}
	}
	b.Roots = roots
	for _, c := range candidates {
		if c.Equal(b.Cert) || containsCert(roots, c) || containsCert(b.Intermediates, c) {
			continue
		}
		b.Intermediates = append(b.Intermediates, c)
	}
	if n.chain == "" {
		n.chain = n.cert // TLS layout: the chain follows the cert in tls.crt
	}
	ordered, err := b.check(now, n, false)
	if err != nil {
		return nil, err
	}
	b.Intermediates = ordered
	return b, nil
}

// signerName names a key held outside the files, for errors.
func signerName(k crypto.Signer) string {
	if s, ok := k.(fmt.Stringer); ok {
		return s.String()
	}
	return "an external signing key"
}

// parseKey parses a PEM private key with certs.ParsePrivateKey (PKCS#8,
// PKCS#1 or SEC1, after any EC PARAMETERS block). Errors never include key
// bytes.
func parseKey(data []byte) (crypto.Signer, error) {
	if !bytes.Contains(data, []byte("-----BEGIN")) {
		return nil, errors.New("no PEM private key found")
	}
	key, err := certs.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("cannot parse the private key (want an unencrypted PKCS#8, PKCS#1 or SEC1 PEM key): %w", err)
	}
	return key, nil
}
