package caserver

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/certs"
)

// nextDir is the subdirectory of the state directory that holds a prepared
// self-signed root until it is activated.
const nextDir = "next"

// newRotation builds the rotation of the CA material b, which the authority
// signs with: every trigger (a changed --ca-dir, a Secret, a root nearing
// expiry, the admin socket) offers new CAs to it, never to the authority.
func (s *Server) newRotation(b, next *keystore.Bundle) (*rotation.Rotation, error) {
	cfg := s.cfg
	t := &rotationTarget{authority: s.authority, log: s.log}
	if cfg.KubeCASecret && s.kube != nil {
		t.publish = s.kube.ctrl.PublishRoots
		t.publish(b.Roots)
	}
	rcfg := rotation.Config{
		Current:               b,
		Target:                t,
		Check:                 s.authority.Check,
		Propagation:           cfg.RotationPropagation,
		RetireAfter:           cfg.MaxTTL + ca.DefaultClockSkew,
		RootRotationThreshold: cfg.RootRotationThreshold,
		Clock:                 cfg.Clock,
		Logger:                cfg.Logger,
		Registerer:            cfg.Registerer,
	}
	if s.selfSigned() {
		t.stateDir = cfg.StateDir
		rcfg.NewRoot = s.newRoot
	}
	r, err := rotation.New(rcfg)
	if err != nil {
		return nil, err
	}
	if next != nil {
		// A restart while a new root was prepared prepares it again: its
		// propagation starts over.
		if err := r.SetBundle(next); err != nil {
			s.log.Error("the prepared root in the state directory is refused", "dir", filepath.Join(cfg.StateDir, nextDir), "error", err)
		}
	}
	return r, nil
}

// selfSigned reports whether the CA is the self-signed root of StateDir,
// whose key lives in the process (a module key is not rotated here).
func (s *Server) selfSigned() bool {
	cfg := s.cfg
	return cfg.Bundle == nil && cfg.CADir == "" && !cfg.KubeCASecret && cfg.CAKey == nil
}

// newRoot makes a new self-signed root and keeps it in <state-dir>/next
// (key mode 0600) until it is activated.
func (s *Server) newRoot() (*keystore.Bundle, error) {
	cfg := s.cfg
	b, files, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{
		TrustDomain: cfg.TrustDomain.Name(), KeyType: cfg.RootKeyType, Clock: cfg.Clock,
	})
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cfg.StateDir, nextDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("caserver: %w", err)
	}
	// The key last: a complete set is marked by it, as in the state dir.
	for _, name := range []string{keystore.CACertFile, keystore.CertChainFile, keystore.RootCertFile, keystore.CAKeyFile} {
		perm := os.FileMode(0o644)
		if name == keystore.CAKeyFile {
			perm = 0o600
		}
		if err := certs.WriteFileAtomic(filepath.Join(dir, name), files[name], perm); err != nil {
			return nil, fmt.Errorf("caserver: %w", err)
		}
	}
	return b, nil
}

// loadNext returns the prepared root kept in <state-dir>/next (nil if
// none) and current without it among its roots (a copy), so that the root
// is prepared again rather than taken as trusted already.
func loadNext(cfg Config, current *keystore.Bundle) (*keystore.Bundle, *keystore.Bundle, error) {
	dir := filepath.Join(cfg.StateDir, nextDir)
	if _, err := os.Stat(filepath.Join(dir, keystore.CAKeyFile)); errors.Is(err, fs.ErrNotExist) {
		return current, nil, nil
	}
	next, err := keystore.LoadDir(dir, cfg.Clock.Now())
	if err != nil {
		return nil, nil, fmt.Errorf("caserver: prepared root: %w", err)
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

// rotationTarget is the authority as the rotation's Target. For the
// self-signed CA (stateDir set) it also keeps the state directory in step:
// root-cert.pem holds the trust bundle (the union during a rotation), and
// an activated root moves from next/ into place.
type rotationTarget struct {
	authority *ca.Authority
	stateDir  string
	log       *slog.Logger
	// publish, when set, publishes the trust bundle (the root ConfigMap
	// of a CA kept in a Kubernetes Secret, which otherwise carries the
	// Secret's roots only).
	publish func([]*x509.Certificate)
}

// SetBundle switches the authority; a state directory that cannot follow
// is logged, not an error: the authority signs with b already.
func (t *rotationTarget) SetBundle(b *keystore.Bundle) error {
	if err := t.authority.SetBundle(b); err != nil {
		return err
	}
	if t.publish != nil {
		t.publish(b.Roots)
	}
	if t.stateDir == "" {
		return nil
	}
	err := t.promote(b.Cert)
	if err == nil {
		err = certs.WriteFileAtomic(filepath.Join(t.stateDir, keystore.RootCertFile), certs.EncodeCertificates(b.Roots...), 0o644)
	}
	if err != nil {
		t.log.Error("the state directory does not follow the CA rotation", "dir", t.stateDir, "error", err)
	}
	return nil
}

// promote moves the prepared root in next/ into the state directory when
// it is the one that now signs.
func (t *rotationTarget) promote(signing *x509.Certificate) error {
	dir := filepath.Join(t.stateDir, nextDir)
	data, err := os.ReadFile(filepath.Join(dir, keystore.CACertFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("caserver: %w", err)
	}
	cs, err := certs.ParseCertificates(data)
	if err != nil || len(cs) == 0 || !cs[0].Equal(signing) {
		return nil // not the signing CA (yet)
	}
	for _, name := range []string{keystore.CACertFile, keystore.CertChainFile, keystore.CAKeyFile} {
		if err := os.Rename(filepath.Join(dir, name), filepath.Join(t.stateDir, name)); err != nil {
			return fmt.Errorf("caserver: activating the new root: %w", err)
		}
	}
	return os.RemoveAll(dir)
}
