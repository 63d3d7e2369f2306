package caserver

import (
	"context"
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
	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/logs"
)

// nextDir is the subdirectory of the state directory that holds a prepared
// self-signed root until it is activated.
const nextDir = "next"

// newRotation builds the rotation of the CA material b, which the authority
// signs with: every trigger (a changed --ca-dir, a Secret, a root nearing
// expiry, the admin socket) offers new CAs to it, never to the authority.
// It restores the state saved before a restart: from the state Secret
// when the CA is kept in a Secret, else from <state-dir>/rotation.json.
func (s *Server) newRotation(ctx context.Context, b, next *keystore.Bundle) (*rotation.Manager, error) {
	cfg := s.cfg
	t := &rotationTarget{authority: s.authority, log: s.log}
	var kubeState *kubeRotationState
	if cfg.KubeCASecret && s.kube != nil {
		t.publish = s.kube.ctrl.PublishRoots
		kubeState = s.kube.rotationState(cfg, s.kc.controllers)
	}
	var retiring []*x509.Certificate
	if s.selfSigned() {
		// root-cert.pem holds the trust bundle, the union during a
		// rotation: the roots besides this self-signed root are old ones,
		// retiring (at their saved time, or a whole RetireAfter from now).
		b, retiring = splitSelfSigned(b)
	}
	file := rotationFile{path: filepath.Join(cfg.StateDir, rotationStateFile), log: s.log}
	rcfg := rotation.Config{
		Current:               b,
		Retiring:              retiring,
		Store:                 file,
		Target:                t,
		Check:                 s.authority.Check,
		Propagation:           cfg.Rotation.Propagation,
		RetireAfter:           cfg.Issuance.MaxTTL + ca.DefaultClockSkew,
		RootRotationThreshold: cfg.Rotation.RootThreshold,
		Clock:                 cfg.Clock,
		Logger:                cfg.Logger,
		Registerer:            cfg.Registerer,
	}
	if s.selfSigned() {
		t.stateDir, t.home = cfg.StateDir, cfg.StateDir
		rcfg.NewRoot = s.newRoot
	}
	if cfg.Upstream.URL != nil {
		t.stateDir = cfg.StateDir // root-cert.pem: the upstream's roots
		t.home = filepath.Join(cfg.StateDir, upstreamDir)
	}
	if kubeState != nil {
		rcfg.Store = kubeState
	}
	r, err := rotation.New(rcfg)
	if err != nil {
		return nil, err
	}
	if next != nil {
		// A restart while a new root was prepared prepares it again; the
		// saved state gives it back its propagation clock.
		if err := r.SetBundle(next); err != nil {
			s.log.Error("the prepared root in the state directory is refused", logs.KeyDir, filepath.Join(cfg.StateDir, nextDir), logs.KeyError, err)
		}
	}
	if kubeState != nil {
		kubeState.restore(ctx, r)
		// Published once restored: a restarted leader never publishes
		// the Secret's roots alone while old ones are still trusted.
		t.publish(s.authority.Bundle().Roots)
	} else {
		file.restore(r)
	}
	return r, nil
}

// splitSelfSigned returns b trusting its own root only, and the other
// roots b trusts.
func splitSelfSigned(b *keystore.Bundle) (*keystore.Bundle, []*x509.Certificate) {
	own := rotation.SigningRoot(b)
	var others []*x509.Certificate
	for _, r := range b.Roots {
		if !r.Equal(own) {
			others = append(others, r)
		}
	}
	if len(others) == 0 {
		return b, nil
	}
	cur := *b
	cur.Roots = []*x509.Certificate{own}
	return &cur, others
}

// rotationStateFile is the rotation's record in the state directory.
const rotationStateFile = "rotation.json"

// rotationFile is the rotation's Store in the state directory: written
// atomically with mode 0600 (the directory is 0700).
type rotationFile struct {
	path string
	log  *slog.Logger
}

// Save writes the record.
func (f rotationFile) Save(_ context.Context, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(f.path), 0o700); err != nil {
		return fmt.Errorf("caserver: rotation state: %w", err)
	}
	return certs.WriteFileAtomic(f.path, data, 0o600)
}

// restore hands the saved record, if any, to r. A file that is not a
// regular file, that others may write, or that r refuses is moved aside
// (rotation.json.refused, for the operator to look at) and not used.
func (f rotationFile) restore(r *rotation.Manager) {
	data, err := f.read()
	if err == nil && data == nil {
		return // no saved state: a first start
	}
	if err == nil {
		err = r.Restore(data) // logged by r
	} else {
		r.RefuseState(err)
	}
	if err != nil {
		if err := os.Rename(f.path, f.path+".refused"); err != nil {
			f.log.Error("the refused rotation state could not be moved aside", logs.KeyFile, f.path, logs.KeyError, err)
		}
	}
}

// read returns the file's contents, nil when it does not exist.
func (f rotationFile) read() ([]byte, error) {
	st, err := os.Lstat(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file (%s)", rotation.ErrRecordRefused, f.path, st.Mode().Type())
	}
	if perm := st.Mode().Perm(); perm&0o022 != 0 {
		return nil, fmt.Errorf("%w: %s: mode %#o lets others write it; want 0600", rotation.ErrRecordRefused, f.path, perm)
	}
	if st.Size() > rotation.MaxRecordSize {
		return nil, fmt.Errorf("%w: %s: %d bytes, more than the %d allowed", rotation.ErrRecordRefused, f.path, st.Size(), rotation.MaxRecordSize)
	}
	data, err := os.ReadFile(f.path)
	if err == nil && data == nil {
		data = []byte{} // an empty file is a record to refuse, not an absent one
	}
	return data, err
}

// selfSigned reports whether the CA is the self-signed root of StateDir,
// whose key lives in the process (a module key is not rotated here).
func (s *Server) selfSigned() bool {
	cfg := s.cfg
	return cfg.Bundle == nil && cfg.CADir == "" && !cfg.KubeCASecret && cfg.CAKey == nil && cfg.Upstream.URL == nil
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

// loadNext returns the prepared CA kept in home/next (nil if none) and
// current without it among its roots (a copy), so that a self-signed root
// is prepared again rather than taken as trusted already. home is the
// state directory (self-signed) or its upstream/.
func loadNext(cfg Config, home string, current *keystore.Bundle) (*keystore.Bundle, *keystore.Bundle, error) {
	dir := filepath.Join(home, nextDir)
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
	// home is the directory of the CA's files, whose next/ holds a
	// prepared CA until it signs: the state directory for the self-signed
	// root, its upstream/ for an upstream's intermediate.
	home string
	log  *slog.Logger
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
		t.log.Error("the state directory does not follow the CA rotation", logs.KeyDir, t.stateDir, logs.KeyError, err)
	}
	return nil
}

// promote moves the prepared root in next/ into the state directory when
// it is the one that now signs.
func (t *rotationTarget) promote(signing *x509.Certificate) error {
	dir := filepath.Join(t.home, nextDir)
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
	// The key last: a complete set is marked by it. root-cert.pem too
	// (upstream/ keeps the upstream's roots; the state directory's is
	// written with the trust bundle right after).
	// The key is ca-key.pem or, in a module, the file naming it: the
	// other form left in home is removed.
	for _, name := range []string{keystore.CACertFile, keystore.CertChainFile, keystore.RootCertFile, keystore.CAKeyFile, upstream.KeyIDFile} {
		err := os.Rename(filepath.Join(dir, name), filepath.Join(t.home, name))
		if errors.Is(err, fs.ErrNotExist) && (name == keystore.CAKeyFile || name == upstream.KeyIDFile) {
			err = os.Remove(filepath.Join(t.home, name))
			if errors.Is(err, fs.ErrNotExist) {
				err = nil
			}
		}
		if err != nil {
			return fmt.Errorf("caserver: activating the new root: %w", err)
		}
	}
	return os.RemoveAll(dir)
}
