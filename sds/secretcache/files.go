package secretcache

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fsnotify/fsnotify"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/logs"
)

// fileKey identifies a file secret by its clean paths, so that names that
// spell one file differently ("file-root:/etc/certs/./a.pem",
// "file-root:/etc/certs//a.pem") share one entry and one read.
type fileKey struct {
	kind      resourceKind
	cert, key string
}

// fileEntry is a file-mounted secret. Its content is replaced only by a
// complete, consistent read: a half-written file or a key that does not
// match the certificate leaves the last good content in place.
type fileEntry struct {
	key  fileKey
	pn   parsedName
	cur  atomic.Pointer[Secret] // the content; Name is that of the first load
	load sync.Mutex             // serialises reloads

	// Guarded by Manager.mu.
	names    map[string]int // watched names spelling this file, with their watch counts
	resolved []string       // the files' paths with symbolic links resolved, at the last load
}

func keyOf(pn parsedName) fileKey { return fileKey{kind: pn.kind, cert: pn.certPath, key: pn.keyPath} }

// named returns s under name: entries are shared by the names that spell
// one file, and a Secret carries the name it was asked for.
func named(s *Secret, name string) *Secret {
	if s == nil || s.Name == name {
		return s
	}
	c := *s
	c.Name = name
	return &c
}

// trackFile counts a watch of name on its file entry, creating the entry
// and watching its directories (once Run runs) for the first one. The
// returned function drops the watch; the last one frees the entry and
// stops watching directories no other entry needs.
func (m *Manager) trackFile(name string, pn parsedName) (untrack func()) {
	k := keyOf(pn)
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.files[k]
	if e == nil {
		e = &fileEntry{key: k, pn: pn, names: map[string]int{}}
		m.files[k] = e
		for _, dir := range e.dirs() {
			if m.byDir[dir] == nil {
				m.byDir[dir] = map[*fileEntry]struct{}{}
			}
			m.byDir[dir][e] = struct{}{}
			m.watchDirLocked(dir)
		}
		if m.watcher == nil {
			select { // Run creates the watcher, which watches every known directory
			case m.wantFiles <- struct{}{}:
			default:
			}
		}
	}
	e.names[name]++
	return func() { m.untrackFile(e, name) }
}

func (m *Manager) untrackFile(e *fileEntry, name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.names[name]--; e.names[name] <= 0 {
		delete(e.names, name)
	}
	if len(e.names) > 0 || m.files[e.key] != e {
		return
	}
	delete(m.files, e.key)
	for _, dir := range e.dirs() {
		delete(m.byDir[dir], e)
		if len(m.byDir[dir]) > 0 {
			continue
		}
		delete(m.byDir, dir)
		if m.watcher != nil && m.watched[dir] {
			// The directory may be gone already; nothing to undo then.
			_ = m.watcher.Remove(dir)
		}
		delete(m.watched, dir)
	}
}

// fileEntryOf returns the entry of a watched file, or nil.
func (m *Manager) fileEntryOf(pn parsedName) *fileEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.files[keyOf(pn)]
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

// affectedBy reports whether an event on path may change the entry: path
// is one of its files, or one of their resolved targets, or a Kubernetes
// atomic-writer entry ("..data", "..<timestamp>"), whose swap changes every
// file of the directory at once. Called with Manager.mu held.
func (e *fileEntry) affectedBy(path string) bool {
	if path == e.pn.certPath || (e.pn.kind == kindFileCert && path == e.pn.keyPath) {
		return true
	}
	if strings.HasPrefix(filepath.Base(path), "..") {
		return true
	}
	for _, r := range e.resolved {
		if path == r {
			return true
		}
	}
	return false
}

// watchDirLocked adds dir to the fsnotify watcher if Run is running; Run
// adds every known directory when it starts.
func (m *Manager) watchDirLocked(dir string) {
	if m.watcher == nil || m.watched[dir] {
		return
	}
	if err := m.watcher.Add(dir); err != nil {
		m.metrics.fileFailures.Inc()
		// A directory that does not exist is what any client can name
		// (file-root:/etc/certs/no-such/x.pem): not worth a warning per
		// name, which would let it flood the log.
		level := slog.LevelWarn
		if errors.Is(err, fs.ErrNotExist) {
			level = slog.LevelDebug
		}
		m.log.Log(context.Background(), level, "cannot watch directory; changes to its files will not be pushed", logs.KeyDir, dir, logs.KeyError, err)
		return
	}
	m.watched[dir] = true
	m.log.Debug("watching directory", logs.KeyDir, dir)
}

// fileSecret serves a file-mounted secret. A watched file is loaded once
// and kept current by the watcher; any other is read for this call only,
// so that names nobody watches hold no memory.
func (m *Manager) fileSecret(name string, pn parsedName) (*Secret, error) {
	if !m.allowed(pn) {
		return nil, fileNotFound(name)
	}
	e := m.fileEntryOf(pn)
	if e == nil {
		s, err := m.readFile(name, pn)
		if err != nil {
			return nil, m.fileError(name, err)
		}
		return s, nil
	}
	if s := e.cur.Load(); s != nil {
		return named(s, name), nil
	}
	if err := m.reload(e, true); err != nil {
		return nil, m.fileError(name, err)
	}
	if s := e.cur.Load(); s != nil {
		return named(s, name), nil
	}
	return nil, fileNotFound(name)
}

// fileError classifies a failed read: a missing or refused file is
// "unknown" (the same error whatever the reason), invalid content is "not
// ready" (the last good content, if any, stays served).
func (m *Manager) fileError(name string, err error) error {
	if errors.Is(err, errNoFile) {
		return fileNotFound(name)
	}
	return fmt.Errorf("%w: %w", ErrNotReady, err)
}

// reload reads the entry's files and, when they hold valid content that
// differs from what is served, swaps it in and pushes it to every name
// watching the entry. With ifEmpty it only loads an entry that has no
// content yet, so that many first requests read the files once.
func (m *Manager) reload(e *fileEntry, ifEmpty bool) error {
	e.load.Lock()
	if ifEmpty && e.cur.Load() != nil {
		e.load.Unlock()
		return nil
	}
	m.mu.Lock()
	var first string
	for n := range e.names {
		first = n
		break
	}
	m.mu.Unlock()
	s, err := m.readFile(first, e.pn)
	changed := false
	if err == nil {
		if old := e.cur.Load(); old == nil || old.Version != s.Version {
			e.cur.Store(s)
			changed = true
		}
	}
	resolved := resolve(e.pn)
	m.mu.Lock()
	e.resolved = resolved
	names := make([]string, 0, len(e.names))
	for n := range e.names {
		names = append(names, n)
	}
	m.mu.Unlock()
	e.load.Unlock()
	if err != nil {
		return err
	}
	if changed {
		m.log.Info("file secret loaded", logs.KeyName, s.Name, logs.KeyVersion, s.Version, logs.KeyNotAfter, s.NotAfter.UTC())
		for _, n := range names {
			m.publish(n)
		}
	}
	return nil
}

// resolve returns the entry's paths with symbolic links resolved, for
// affectedBy; paths that do not resolve are left out.
func resolve(pn parsedName) []string {
	var out []string
	paths := []string{pn.certPath}
	if pn.kind == kindFileCert {
		paths = append(paths, pn.keyPath)
	}
	for _, p := range paths {
		if r, err := filepath.EvalSymlinks(p); err == nil && r != p {
			out = append(out, r)
		}
	}
	return out
}

// readFile parses the files of pn into a Secret named name.
func (m *Manager) readFile(name string, pn parsedName) (*Secret, error) {
	certPEM, err := m.readSecretFile(pn.certPath)
	if err != nil {
		return nil, fmt.Errorf("secretcache: %s: %w", name, err)
	}
	cs, err := certs.ParseCertificates(certPEM)
	if err != nil {
		return nil, fmt.Errorf("secretcache: %s: %s: %w", name, pn.certPath, err)
	}
	if pn.kind == kindFileRoot {
		return newRootSecret(name, cs, m.id.TrustDomain()), nil
	}
	keyPEM, err := m.readSecretFile(pn.keyPath)
	if err != nil {
		return nil, fmt.Errorf("secretcache: %s: %w", name, err)
	}
	key, err := certs.ParsePrivateKey(keyPEM)
	if err != nil {
		// ParsePrivateKey never puts key bytes into its errors.
		return nil, fmt.Errorf("secretcache: %s: %s: %w", name, pn.keyPath, err)
	}
	if !certs.KeyMatches(cs[0].PublicKey, key) {
		return nil, fmt.Errorf("secretcache: %s: the key in %s does not match the certificate in %s", name, pn.keyPath, pn.certPath)
	}
	td := m.id.TrustDomain()
	if id, err := x509svid.IDFromCert(cs[0]); err == nil {
		td = id.TrustDomain()
	}
	return newCertSecret(name, cs, key, td), nil
}

// watchFiles reloads the entries affected by each event in a watched
// directory, until ctx is done. A burst of events (a ..data swap makes
// several) costs a few cheap re-reads; the version check pushes only real
// changes.
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
			m.log.Warn("file watch error", logs.KeyError, err)
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			// Only the entries the event may change are read again, so
			// that an event costs one read per affected file, not one
			// per name in the directory.
			var entries []*fileEntry
			m.mu.Lock()
			for e := range m.byDir[filepath.Dir(ev.Name)] {
				if e.affectedBy(ev.Name) {
					entries = append(entries, e)
				}
			}
			m.mu.Unlock()
			for _, e := range entries {
				if err := m.reload(e, false); err != nil {
					m.metrics.fileFailures.Inc()
					m.log.Warn("file secret not reloaded; keeping the last good content", logs.KeyFile, e.pn.certPath, logs.KeyError, err)
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
		m.log.Debug("closing file watcher", logs.KeyError, err)
	}
}
