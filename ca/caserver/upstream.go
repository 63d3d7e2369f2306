package caserver

import (
	"context"
	"crypto"
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
// intermediate the upstream minted last (key mode 0600, or the module
// key's id in upstream.KeyIDFile with --ca-key), for a restart.
const upstreamDir = "upstream"

// checkUpstream refuses an upstream with another source of CA material.
func (cfg Config) checkUpstream() error {
	if cfg.Upstream.URL == nil {
		return nil
	}
	if cfg.Bundle != nil || cfg.CADir != "" {
		return errors.New("caserver: --upstream mints the CA's intermediate: it excludes --ca-dir")
	}
	if cfg.CAKey != nil && cfg.KubeCASecret {
		return errors.New("caserver: --upstream with --ca-key and --kube-ca-secret is not supported yet: the replicas sharing the intermediate would need its key in one module")
	}
	if cfg.CAKey != nil && (cfg.CAKey.Object == "" || len(cfg.CAKey.ID) > 0) {
		return errors.New("caserver: with --upstream, --ca-key names where each intermediate's key is created: give the label (object=) and no id= (each key gets a new one)")
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
	var keys upstream.KeySource // nil: software keys
	if cfg.CAKey != nil {
		if s.upstreamKeys, err = upstream.NewModuleKeys(upstream.ModuleKeysConfig{URI: cfg.CAKey, Logger: cfg.Logger}); err != nil {
			return nil, fmt.Errorf("caserver: %w", err)
		}
		keys = s.upstreamKeys
	}
	s.upstream, err = upstream.NewRenewer(upstream.RenewerConfig{
		Upstream:    ua,
		Name:        cfg.Upstream.URL.String(),
		TrustDomain: cfg.TrustDomain,
		KeyType:     cfg.RootKeyType,
		Keys:        keys,
		Lifetime:    cfg.Upstream.Lifetime,
		RenewAt:     cfg.Upstream.RenewAt,
		Save: func(b *keystore.Bundle) error {
			err := s.saveUpstream(s.upstreamSaveDir(dir, b), b)
			s.collectUpstreamKeys() // the key b replaces, once the state no longer names it
			return err
		},
		Clock:      cfg.Clock,
		Logger:     cfg.Logger,
		Registerer: cfg.Registerer,
	})
	if err != nil {
		return nil, err
	}
	b, err := s.loadUpstream(dir)
	switch {
	case err == nil:
		s.log.Info("intermediate of the upstream CA loaded from the state directory",
			logs.KeyDir, dir, logs.KeyNotAfter, b.Cert.NotAfter, logs.KeyRenewAt, s.upstream.RenewAt(b, time.Time{}))
	case errors.Is(err, errModuleKeyState):
		s.closeUpstreamKeys()
		return nil, err
	case errors.Is(err, fs.ErrNotExist):
	default:
		s.log.Warn("the saved intermediate is not valid: minting a new one", logs.KeyDir, dir, logs.KeyError, err)
	}
	if err != nil {
		if b, err = s.upstream.Mint(context.Background()); err != nil {
			s.closeUpstreamKeys()
			return nil, fmt.Errorf("caserver: no valid intermediate, and the upstream CA %s did not mint one: %w", cfg.Upstream.URL, err)
		}
		if err := s.saveUpstream(dir, b); err != nil {
			if d, ok := b.Key.(upstream.Destroyer); ok {
				_ = d.Destroy() // no state names it
			}
			s.closeUpstreamKeys()
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
		s.collectUpstreamKeys() // an expired intermediate's key loaded from the state
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
// files), the key last: ca-key.pem mode 0600, or, for a key in the module,
// upstream.KeyIDFile naming it (never a private key nor the PIN), and the
// other form removed.
func (s *Server) saveUpstream(dir string, b *keystore.Bundle) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("caserver: %w", err)
	}
	keyFile, stale := keystore.CAKeyFile, upstream.KeyIDFile
	var key []byte
	if id, ok := s.upstreamKeys.ID(b.Key); ok && s.upstreamKeys != nil {
		keyFile, stale, key = upstream.KeyIDFile, keystore.CAKeyFile, upstream.EncodeKeyID(id)
	} else {
		var err error
		if key, err = certs.EncodePrivateKey(b.Key); err != nil {
			return fmt.Errorf("caserver: %w", err)
		}
	}
	files := []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{keystore.CACertFile, certs.EncodeCertificates(b.Cert), 0o644},
		{keystore.CertChainFile, certs.EncodeCertificates(b.Intermediates...), 0o644},
		{keystore.RootCertFile, certs.EncodeCertificates(b.Roots...), 0o644},
		{keyFile, key, 0o600},
	}
	for _, f := range files {
		if err := certs.WriteFileAtomic(filepath.Join(dir, f.name), f.data, f.perm); err != nil {
			return fmt.Errorf("caserver: %w", err)
		}
	}
	if err := os.Remove(filepath.Join(dir, stale)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("caserver: %w", err)
	}
	return nil
}

// errModuleKeyState marks a saved intermediate whose module key cannot be
// trusted (a bad upstream.KeyIDFile, a key the module does not hold, or
// not the certificate's): the CA refuses to start rather than mint over
// it, and changes nothing.
var errModuleKeyState = errors.New("caserver: the saved intermediate's module key is refused")

// loadUpstream loads the intermediate kept in dir: with its ca-key.pem,
// or, with --ca-key, with the module key its upstream.KeyIDFile names.
// An error wrapping fs.ErrNotExist means none is kept; one wrapping
// errModuleKeyState must stop the start; any other (an expired
// intermediate) lets the CA mint a new one.
func (s *Server) loadUpstream(dir string) (*keystore.Bundle, error) {
	now := s.cfg.Clock.Now()
	idFile := filepath.Join(dir, upstream.KeyIDFile)
	_, err := os.Lstat(idFile)
	hasID := err == nil
	if s.upstreamKeys == nil {
		if hasID {
			return nil, fmt.Errorf("%w: %s names a key in a PKCS#11 module: start with --ca-key pkcs11:… naming its token and label (or remove %s to mint with a key in memory)", errModuleKeyState, idFile, dir)
		}
		return keystore.LoadDir(dir, now)
	}
	if !hasID {
		if _, err := os.Stat(filepath.Join(dir, keystore.CAKeyFile)); err == nil {
			return nil, fmt.Errorf("%s holds a key in a file, and --ca-key puts the intermediate's key in a module: minting one there", dir)
		}
		return nil, fmt.Errorf("caserver: %s: %w", idFile, fs.ErrNotExist)
	}
	id, err := upstream.ReadKeyID(idFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errModuleKeyState, err)
	}
	key, err := s.upstreamKeys.Load(id)
	if err != nil {
		return nil, fmt.Errorf("%w: %s names key id=%x, which the module does not give: %w", errModuleKeyState, idFile, id, err)
	}
	cs, err := upstream.ReadPEMCerts(filepath.Join(dir, keystore.CACertFile))
	if err != nil {
		return nil, fmt.Errorf("caserver: %s: %w", filepath.Join(dir, keystore.CACertFile), err)
	}
	if !certs.KeyMatches(cs[0].PublicKey, key) {
		return nil, fmt.Errorf("%w: %s names key id=%x, whose public key is not the one of %s", errModuleKeyState, idFile, id, filepath.Join(dir, keystore.CACertFile))
	}
	return keystore.LoadDirSigner(dir, key, now)
}

// loadUpstreamNext is loadNext for upstream/: with --ca-key, the prepared
// intermediate of upstream/next signs with the module key it names.
func (s *Server) loadUpstreamNext(current *keystore.Bundle) (*keystore.Bundle, *keystore.Bundle, error) {
	home := filepath.Join(s.cfg.StateDir, upstreamDir)
	if s.upstreamKeys == nil {
		return loadNext(s.cfg, home, current)
	}
	next, err := s.loadUpstream(filepath.Join(home, nextDir))
	if errors.Is(err, fs.ErrNotExist) {
		return current, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("caserver: prepared intermediate: %w", err)
	}
	cur := *current
	cur.Roots = nil
	for _, r := range current.Roots {
		if !r.Equal(next.Cert) {
			cur.Roots = append(cur.Roots, r)
		}
	}
	return &cur, next, nil
}

// collectUpstreamKeys destroys from the module the keys of intermediates
// that no longer sign and are not prepared, and that the state directory
// no longer names (a crash never leaves it naming a destroyed key). A
// state file it cannot read stops it: nothing is destroyed.
func (s *Server) collectUpstreamKeys() {
	authority, rot := s.Authority(), s.Rotation()
	if s.upstreamKeys == nil || authority == nil || rot == nil {
		return
	}
	var named [][]byte
	home := filepath.Join(s.cfg.StateDir, upstreamDir)
	for _, dir := range []string{home, filepath.Join(home, nextDir)} {
		id, err := upstream.ReadKeyID(filepath.Join(dir, upstream.KeyIDFile))
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			s.log.Error("old intermediate keys are kept in the module: the state names a key it cannot read", logs.KeyDir, dir, logs.KeyError, err)
			return
		default:
			named = append(named, id)
		}
	}
	inUse := []crypto.PublicKey{authority.Bundle().Cert.PublicKey}
	if p := rot.Status().Prepared; p != nil {
		inUse = append(inUse, p.PublicKey)
	}
	s.upstreamKeys.Collect(inUse, named)
}

// runUpstream renews the intermediate and, with module keys, destroys
// each old key once the rotation lets go of it (its activation of the
// next intermediate, a refused one).
func (s *Server) runUpstream(ctx context.Context) error {
	if s.upstreamKeys == nil {
		return s.upstream.Run(ctx)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			changed := s.Rotation().Changed()
			s.collectUpstreamKeys()
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	err := s.upstream.Run(ctx)
	<-done
	return err
}

// closeUpstreamKeys closes the module keys of the intermediates (they stay
// in the module).
func (s *Server) closeUpstreamKeys() {
	if s.upstreamKeys != nil {
		if err := s.upstreamKeys.Close(); err != nil {
			s.log.Warn("closing the intermediate keys' module", logs.KeyError, err)
		}
	}
}
