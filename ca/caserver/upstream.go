package caserver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/ca/upstream/cfssl"
	"github.com/meshid/meshid/ca/upstream/step"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/logs"
)

// UpstreamConfig has the organisation's CA mint and renew the CA's
// intermediate (docs/upstream.md). The zero value is no upstream.
type UpstreamConfig struct {
	// URL selects the backend (--upstream): cfssl+https://HOST:PORT?profile=NAME&ca=PATH
	// or step+https://HOST:PORT?provisioner=NAME&ca=PATH.
	URL *upstream.URL
	// CredentialsFile holds the backend's credentials (--upstream-credentials).
	CredentialsFile string
	// Lifetime asked for each intermediate; 0 is upstream.DefaultLifetime.
	Lifetime time.Duration
	// RenewAt is the fraction of an intermediate's life at which it is
	// renewed; 0 is upstream.DefaultRenewAt (half).
	RenewAt float64
}

// upstreamDir is the subdirectory of the state directory that keeps the
// intermediate the upstream minted last (key mode 0600), for a restart.
const upstreamDir = "upstream"

// checkUpstream refuses an upstream with another source of CA material.
func (cfg Config) checkUpstream() error {
	if cfg.Upstream.URL == nil {
		return nil
	}
	if cfg.Bundle != nil || cfg.CADir != "" || cfg.CAKey != nil {
		return errors.New("caserver: --upstream mints the CA's intermediate: it excludes --ca-dir and --ca-key")
	}
	return nil
}

// newUpstreamAuthority returns the backend of u.
func newUpstreamAuthority(u UpstreamConfig) (upstream.Authority, error) {
	switch u.URL.Scheme {
	case cfssl.Scheme:
		return cfssl.New(cfssl.Config{URL: u.URL, CredentialsFile: u.CredentialsFile})
	case step.Scheme:
		return step.New(step.Config{URL: u.URL, CredentialsFile: u.CredentialsFile})
	}
	return nil, fmt.Errorf("caserver: --upstream: unknown scheme %q (want %s or %s)", u.URL.Scheme, cfssl.Scheme, step.Scheme)
}

// upstreamBundle returns the intermediate the upstream minted: the one
// kept in the state directory while it is valid, else a new one. There is
// no fallback: without a valid intermediate the CA does not start.
func (s *Server) upstreamBundle() (*keystore.Bundle, error) {
	cfg := s.cfg
	ua, err := newUpstreamAuthority(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cfg.StateDir, upstreamDir)
	s.upstream, err = upstream.NewRenewer(upstream.RenewerConfig{
		Upstream:    ua,
		Name:        cfg.Upstream.URL.String(),
		TrustDomain: cfg.TrustDomain,
		KeyType:     cfg.RootKeyType,
		Lifetime:    cfg.Upstream.Lifetime,
		RenewAt:     cfg.Upstream.RenewAt,
		Save:        func(b *keystore.Bundle) error { return saveUpstream(s.upstreamSaveDir(dir, b), b) },
		Clock:       cfg.Clock,
		Logger:      cfg.Logger,
		Registerer:  cfg.Registerer,
	})
	if err != nil {
		return nil, err
	}
	b, err := keystore.LoadDir(dir, cfg.Clock.Now())
	switch {
	case err == nil:
		s.log.Info("intermediate of the upstream CA loaded from the state directory",
			logs.KeyDir, dir, logs.KeyNotAfter, b.Cert.NotAfter, logs.KeyRenewAt, s.upstream.RenewAt(b, time.Time{}))
	case errors.Is(err, fs.ErrNotExist):
	default:
		s.log.Warn("the saved intermediate is not valid: minting a new one", logs.KeyDir, dir, logs.KeyError, err)
	}
	if err != nil {
		if b, err = s.upstream.Mint(context.Background()); err != nil {
			return nil, fmt.Errorf("caserver: no valid intermediate, and the upstream CA %s did not mint one: %w", cfg.Upstream.URL, err)
		}
		if err := saveUpstream(dir, b); err != nil {
			return nil, err
		}
		s.upstreamMinted = cfg.Clock.Now()
		s.log.Info("intermediate minted by the upstream CA", logs.KeySubject, b.Cert.Subject.String(),
			logs.KeySerial, b.Cert.SerialNumber.Text(16), logs.KeyNotAfter, b.Cert.NotAfter, logs.KeyRenewAt, s.upstream.RenewAt(b, s.upstreamMinted))
	}
	// The trust bundle is the upstream's roots; the rotation keeps the
	// file in step from now on.
	if err := certs.WriteFileAtomic(filepath.Join(cfg.StateDir, keystore.RootCertFile), certs.EncodeCertificates(b.Roots...), 0o644); err != nil {
		return nil, fmt.Errorf("caserver: %w", err)
	}
	return b, nil
}

// upstreamSaveDir is where b is kept: dir's next/ while the rotation has
// it prepared (under a new upstream root, it does not sign yet: a restart
// prepares it again, and the rotation moves it into dir once it signs),
// else dir.
func (s *Server) upstreamSaveDir(dir string, b *keystore.Bundle) string {
	if st := s.rotation.Status(); st.Prepared != nil && st.Prepared.Equal(b.Cert) {
		return filepath.Join(dir, nextDir)
	}
	return dir
}

// startUpstream hands the renewer the newest CA (the one in use, or the
// one prepared before a restart) and the rotation that takes the next
// ones; Run then renews.
func (s *Server) startUpstream(b *keystore.Bundle) {
	if s.upstream != nil {
		s.upstream.Start(b, s.upstreamMinted, s.rotation)
	}
}

// UpstreamStatus is the upstream CA's renewal state; false without
// --upstream (or before the CA started).
func (s *Server) UpstreamStatus() (upstream.Status, bool) {
	if s.upstream == nil {
		return upstream.Status{}, false
	}
	return s.upstream.Status()
}

// saveUpstream writes b into dir as a CA directory (keystore.LoadDir's
// files), the key last, mode 0600.
func saveUpstream(dir string, b *keystore.Bundle) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("caserver: %w", err)
	}
	key, err := certs.EncodePrivateKey(b.Key)
	if err != nil {
		return fmt.Errorf("caserver: %w", err)
	}
	files := []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{keystore.CACertFile, certs.EncodeCertificates(b.Cert), 0o644},
		{keystore.CertChainFile, certs.EncodeCertificates(b.Intermediates...), 0o644},
		{keystore.RootCertFile, certs.EncodeCertificates(b.Roots...), 0o644},
		{keystore.CAKeyFile, key, 0o600},
	}
	for _, f := range files {
		if err := certs.WriteFileAtomic(filepath.Join(dir, f.name), f.data, f.perm); err != nil {
			return fmt.Errorf("caserver: %w", err)
		}
	}
	return nil
}
