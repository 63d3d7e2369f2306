package secretcache

import (
	"context"
	"crypto/x509"
	"slices"
	"time"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/sds/rootfile"
)

// DefaultRootRefresh is how often the Manager re-reads Config.RootFile (the
// agent's --ca-root, in a cluster the mounted istio-ca-root-cert ConfigMap).
// The CA waits twice this long (ca/rotation.DefaultPropagation) between
// adding a new root to its bundle and signing with it, so that every agent
// has pushed the new root as ROOTCA first.
const DefaultRootRefresh = 5 * time.Minute

// trustedRootsLocked is the ROOTCA bundle: the roots of the last CA answer,
// then those of RootFile that the answer lacks. During a CA rotation it
// holds the old and the new roots, from whichever source has them first.
func (m *Manager) trustedRootsLocked() []*x509.Certificate {
	out := slices.Clone(m.answerRoots)
	for _, c := range m.fileRoots {
		if !slices.ContainsFunc(out, c.Equal) {
			out = append(out, c)
		}
	}
	return out
}

// setRootsLocked makes the union the ROOTCA secret when it changed, and
// reports whether it did.
func (m *Manager) setRootsLocked() ([]*x509.Certificate, bool) {
	union := m.trustedRootsLocked()
	if len(union) == 0 {
		return nil, false
	}
	s := newRootSecret(RootName, union, m.id.TrustDomain())
	if r := m.roots.Load(); r != nil && r.Version == s.Version {
		return nil, false
	}
	m.roots.Store(s)
	return union, true
}

// rootsChanged tells the trust hook (the CA client verifying the CA) and
// the ROOTCA watchers about a new bundle.
func (m *Manager) rootsChanged(union []*x509.Certificate) {
	if m.onRoots != nil {
		m.onRoots(union)
	}
	m.publish(RootName)
	m.rebuildFederated()
}

// refreshRoots reads RootFile at once, then again every rootRefresh until
// ctx is done. The first read is not delayed by a refresh interval: an
// agent started during a CA rotation must push the new root the file
// already holds before the CA signs with it (the CA waits two refresh
// intervals after publishing it, counted from before this agent started).
func (m *Manager) refreshRoots(ctx context.Context) {
	m.readRootFile()
	clock.Loop(ctx, m.clock, m.rootRefresh, nil, func(context.Context) time.Duration {
		m.readRootFile()
		return m.rootRefresh
	})
}

// readRootFile loads RootFile into the bundle. A file that cannot be read,
// holds no certificate (half written) or is refused by rootfile.Read (a
// system CA bundle, too many roots) leaves the previous roots.
func (m *Manager) readRootFile() {
	roots, err := rootfile.Read(m.rootFile, m.maxRoots)
	if err != nil {
		m.log.Warn("cannot re-read the CA roots; keeping the previous ones", logs.KeyFile, m.rootFile, logs.KeyError, err)
		return
	}
	m.mu.Lock()
	m.fileRoots = roots
	union, changed := m.setRootsLocked()
	m.mu.Unlock()
	if changed {
		m.log.Info("trust bundle changed", logs.KeyFile, m.rootFile, logs.KeyRoots, len(union))
		m.rootsChanged(union)
	}
}
