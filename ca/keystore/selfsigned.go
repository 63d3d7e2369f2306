package keystore

import (
	"cmp"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// DefaultRootTTL is the lifetime of a self-signed root: 10 years.
const DefaultRootTTL = 10 * 365 * 24 * time.Hour

// RootCommonName is the CN of a self-signed root; its O is the trust domain.
const RootCommonName = "meshid root CA"

// rootBackdate moves a new root's NotBefore into the past so that clients
// whose clocks run a little behind accept it at once.
const rootBackdate = 5 * time.Minute

// LockFile is the file in a state directory that LoadOrCreateSelfSigned
// locks (flock, exclusive) while it reads or creates the root.
const LockFile = ".lock"

// SelfSignedConfig configures a self-signed root.
type SelfSignedConfig struct {
	Dir         string        // state directory (LoadOrCreateSelfSigned only)
	TrustDomain string        // the root's O
	KeyType     certs.KeyType // "" = ec-p256
	TTL         time.Duration // 0 = DefaultRootTTL
	Clock       clock.Clock   // nil = real clock
	// Key, when set, is the root's key held outside the process (a PKCS#11
	// module): the root is made for it, KeyType is ignored, and no
	// ca-key.pem is ever written; the state directory then keeps only
	// certificates.
	Key crypto.Signer
}

func (cfg SelfSignedConfig) withDefaults() (SelfSignedConfig, error) {
	if cfg.TrustDomain == "" {
		return cfg, errors.New("keystore: self-signed root: trust domain is required")
	}
	cfg.KeyType = cmp.Or(cfg.KeyType, certs.ECP256)
	if _, err := certs.ParseCAKeyType(string(cfg.KeyType)); err != nil {
		return cfg, fmt.Errorf("keystore: root key type %q not supported (want one of %s)", cfg.KeyType, certs.KeyTypeNames(certs.CAKeyTypes))
	}
	cfg.TTL = cmp.Or(cfg.TTL, DefaultRootTTL)
	if cfg.TTL < 0 {
		return cfg, fmt.Errorf("keystore: root TTL %v must be positive", cfg.TTL)
	}
	cfg.Clock = clock.OrReal(cfg.Clock)
	return cfg, nil
}

// NewSelfSignedRoot creates a self-signed root in memory. It returns the
// bundle (the root signs leaves itself) and its files in Istio's cacerts
// layout (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem) for
// persistence; ca-key.pem must be stored with mode 0600.
func NewSelfSignedRoot(cfg SelfSignedConfig) (*Bundle, map[string][]byte, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, nil, err
	}
	key := cfg.Key
	if key == nil {
		if key, err = certs.GenerateKey(cfg.KeyType); err != nil {
			return nil, nil, fmt.Errorf("keystore: self-signed root: %w", err)
		}
	}
	now := cfg.Clock.Now()
	root, err := certs.NewRootCA(certs.CASpec{
		Subject:    pkix.Name{Organization: []string{cfg.TrustDomain}, CommonName: RootCommonName},
		Key:        key,
		NotBefore:  now.Add(-rootBackdate),
		TTL:        cfg.TTL,
		MaxPathLen: -1,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("keystore: self-signed root: %w", err)
	}
	b := &Bundle{Cert: root, Key: key, Roots: []*x509.Certificate{root}}
	if err := b.Validate(now); err != nil {
		return nil, nil, err
	}
	certPEM := certs.EncodeCertificates(root)
	files := map[string][]byte{
		CACertFile:    certPEM,
		CertChainFile: certPEM,
		RootCertFile:  certPEM,
	}
	if cfg.Key == nil {
		keyPEM, err := certs.EncodePrivateKey(key)
		if err != nil {
			return nil, nil, fmt.Errorf("keystore: self-signed root: %w", err)
		}
		files[CAKeyFile] = keyPEM
	}
	return b, files, nil
}

// LoadOrCreateSelfSigned reuses the root kept in cfg.Dir, or creates one
// there on first start. The key is written with mode 0600 and every file
// atomically; ca-key.pem is written last, so a start interrupted half way
// leaves no key and the next start creates a fresh root. An existing root
// is never replaced: if it cannot be loaded (or its key is readable by
// others) that is an error. <Dir>/root-cert.pem is always rewritten for
// clients. A KeyType that differs from the existing root's is ignored.
//
// Processes sharing cfg.Dir are serialised by an exclusive flock on
// <Dir>/.lock: a second meshid starting at the same moment waits for the
// first to finish creating the root, then loads that same root, so the key
// and certificates on disk always come from one root.
func LoadOrCreateSelfSigned(cfg SelfSignedConfig) (*Bundle, error) {
	if cfg.Dir == "" {
		return nil, errors.New("keystore: self-signed root: state directory is required")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("keystore: state directory: %w", err)
	}
	unlock, err := lockDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// The file written last marks a complete root: ca-key.pem, or
	// ca-cert.pem when the key is held outside.
	markPath := filepath.Join(cfg.Dir, CAKeyFile)
	if cfg.Key != nil {
		markPath = filepath.Join(cfg.Dir, CACertFile)
	}
	var b *Bundle
	switch st, err := os.Stat(markPath); {
	case err == nil:
		if perm := st.Mode().Perm(); cfg.Key == nil && perm&0o077 != 0 {
			return nil, fmt.Errorf("keystore: %s: mode %#o lets others read the CA key; want 0600", markPath, perm)
		}
		if b, err = loadDir(cfg.Dir, cfg.Key, cfg.Clock.Now()); err != nil {
			return nil, err
		}
	case errors.Is(err, fs.ErrNotExist):
		var files map[string][]byte
		if b, files, err = NewSelfSignedRoot(cfg); err != nil {
			return nil, err
		}
		order := []string{CACertFile, CertChainFile, CAKeyFile}
		if cfg.Key != nil {
			order = []string{CertChainFile, CACertFile}
		}
		for _, name := range order {
			perm := os.FileMode(0o644)
			if name == CAKeyFile {
				perm = 0o600
			}
			if err := certs.WriteFileAtomic(filepath.Join(cfg.Dir, name), files[name], perm); err != nil {
				return nil, fmt.Errorf("keystore: %w", err)
			}
		}
	default:
		return nil, fmt.Errorf("keystore: %w", err)
	}
	if err := certs.WriteFileAtomic(filepath.Join(cfg.Dir, RootCertFile), certs.EncodeCertificates(b.Roots...), 0o644); err != nil {
		return nil, fmt.Errorf("keystore: %w", err)
	}
	return b, nil
}
