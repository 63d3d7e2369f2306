package secretcache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/fsnotify/fsnotify"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/meshid/meshid/certs"
)

// fileEntry is a file-mounted secret. Its content is replaced only by a
// complete, consistent read: a half-written file or a key that does not
// match the certificate leaves the last good content in place.
type fileEntry struct {
	name string
	pn   parsedName
	cur  atomic.Pointer[Secret]
	load sync.Mutex // serialises reloads
}

// trackFile returns the entry for a file name, creating it and watching
// its directories (once Run runs) on first use.
func (m *Manager) trackFile(name string, pn parsedName) *fileEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.files[name]; e != nil {
		return e
	}
	e := &fileEntry{name: name, pn: pn}
	m.files[name] = e
	for _, dir := range e.dirs() {
		m.byDir[dir] = append(m.byDir[dir], e)
		m.watchDirLocked(dir)
	}
	if m.watcher == nil {
		select { // Run creates the watcher, which watches every known directory
		case m.wantFiles <- struct{}{}:
		default:
		}
	}
	return e
}

// dirs returns the directories whose changes may change the entry. Watching
// the directory, not the file, is what makes Kubernetes' atomic ..data
// symlink swaps visible: the file's own inode never changes then.
func (e *fileEntry) dirs() []string {
	d := filepath.Dir(e.pn.certPath)
	if e.pn.kind == kindFileCert {
		if kd := filepath.Dir(e.pn.keyPath); kd != d {
			return []string{d, kd}
		}
	}
	return []string{d}
}

// watchDirLocked adds dir to the fsnotify watcher if Run is running; Run
// adds every known directory when it starts.
func (m *Manager) watchDirLocked(dir string) {
	if m.watcher == nil || m.watched[dir] {
		return
	}
	if err := m.watcher.Add(dir); err != nil {
		m.metrics.fileFailures.Inc()
		m.log.Warn("cannot watch directory; changes to its files will not be pushed", "dir", dir, "error", err)
		return
	}
	m.watched[dir] = true
	m.log.Debug("watching directory", "dir", dir)
}

// fileSecret serves a file-mounted secret, loading it on first use.
func (m *Manager) fileSecret(name string, pn parsedName) (*Secret, error) {
	e := m.trackFile(name, pn)
	if s := e.cur.Load(); s != nil {
		return s, nil
	}
	if err := m.reload(e, true); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotReady, err)
	}
	if s := e.cur.Load(); s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("%w: %s", ErrNotReady, name)
}

// reload reads the entry's files and, when they hold valid content that
// differs from what is served, swaps it in and pushes it. With ifEmpty it
// only loads an entry that has no content yet, so that many first requests
// read the files once.
func (m *Manager) reload(e *fileEntry, ifEmpty bool) error {
	e.load.Lock()
	if ifEmpty && e.cur.Load() != nil {
		e.load.Unlock()
		return nil
	}
	s, err := m.readFile(e)
	changed := false
	if err == nil {
		if old := e.cur.Load(); old == nil || old.Version != s.Version {
			e.cur.Store(s)
			changed = true
		}
	}
	e.load.Unlock()
	if err != nil {
		return err
	}
	if changed {
		m.log.Info("file secret loaded", "name", e.name, "version", s.Version, "not_after", s.NotAfter.UTC())
		m.publish(e.name)
	}
	return nil
}

// readFile parses the entry's files into a Secret.
func (m *Manager) readFile(e *fileEntry) (*Secret, error) {
	certPEM, err := os.ReadFile(e.pn.certPath)
	if err != nil {
		return nil, fmt.Errorf("secretcache: %s: %w", e.name, err)
	}
	cs, err := certs.ParseCertificates(certPEM)
	if err != nil {
		return nil, fmt.Errorf("secretcache: %s: %s: %w", e.name, e.pn.certPath, err)
	}
	if e.pn.kind == kindFileRoot {
		return newRootSecret(e.name, cs, m.id.TrustDomain()), nil
	}
	keyPEM, err := os.ReadFile(e.pn.keyPath)
	if err != nil {
		return nil, fmt.Errorf("secretcache: %s: %w", e.name, err)
	}
	key, err := certs.ParsePrivateKey(keyPEM)
	if err != nil {
		// ParsePrivateKey never puts key bytes into its errors.
		return nil, fmt.Errorf("secretcache: %s: %s: %w", e.name, e.pn.keyPath, err)
	}
	if !certs.KeyMatches(cs[0].PublicKey, key) {
		return nil, fmt.Errorf("secretcache: %s: the key in %s does not match the certificate in %s", e.name, e.pn.keyPath, e.pn.certPath)
	}
	td := m.id.TrustDomain()
	if id, err := x509svid.IDFromCert(cs[0]); err == nil {
		td = id.TrustDomain()
	}
	return newCertSecret(e.name, cs, key, td), nil
}

// watchFiles reloads the entries of a directory on every event in it, until
// ctx is done. A burst of events (a ..data swap makes several) costs a few
// cheap re-reads; the version check pushes only real changes.
func (m *Manager) watchFiles(ctx context.Context, w *fsnotify.Watcher) {
	for {
		select {
		case <-ctx.Done():
			return
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			m.metrics.fileFailures.Inc()
			m.log.Warn("file watch error", "error", err)
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			m.mu.Lock()
			entries := append([]*fileEntry(nil), m.byDir[filepath.Dir(ev.Name)]...)
			m.mu.Unlock()
			for _, e := range entries {
				if err := m.reload(e, false); err != nil {
					m.metrics.fileFailures.Inc()
					m.log.Warn("file secret not reloaded; keeping the last good content", "name", e.name, "error", err)
				}
			}
		}
	}
}

// startWatcher creates the fsnotify watcher and watches every directory known
// so far.
func (m *Manager) startWatcher() (*fsnotify.Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("secretcache: file watcher: %w", err)
	}
	m.mu.Lock()
	m.watcher = w
	for dir := range m.byDir {
		m.watchDirLocked(dir)
	}
	m.mu.Unlock()
	return w, nil
}

func (m *Manager) stopWatcher(w *fsnotify.Watcher) {
	m.mu.Lock()
	m.watcher = nil
	clear(m.watched)
	m.mu.Unlock()
	if err := w.Close(); err != nil && !errors.Is(err, fsnotify.ErrClosed) {
		m.log.Debug("closing file watcher", "error", err)
	}
}
