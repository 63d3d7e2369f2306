package secretcache

import (
	"sync"
	"sync/atomic"
)

// topic holds the watchers of one resource name. Watchers live in a map so
// that adding and cancelling cost O(1) with 10,000 of them; a push iterates a
// snapshot slice that is rebuilt only after the set changed.
type topic struct {
	mu     sync.Mutex
	nextID uint64
	subs   map[uint64]*watcher
	snap   []*watcher // nil when stale

	pushMu      sync.Mutex // serialises pushes, so versions arrive in order
	lastVersion string     // the version last pushed
}

type watcher struct {
	fn  func(*Secret)
	off atomic.Bool
}

// Watch registers notify to be called each time name's secret changes or
// first becomes available. It does not call notify for the secret current at
// registration: call Secret after Watch to get it (a secret that changes in
// between is reported to notify). notify must not block, must not call back
// into the Manager synchronously, and may be called from any goroutine; calls
// for one name never overlap and arrive in version order. cancel stops the
// notifications; a call already in progress may still complete.
//
// Watching a file-cert: or file-root: name in the allowed directories
// starts watching its files. Watching a name the Manager cannot serve (or a
// file outside the allowed directories) is a no-op. The last cancel of a
// name frees everything the Manager kept for it.
func (m *Manager) Watch(name string, notify func(*Secret)) (cancel func()) {
	pn, err := parseName(name)
	if err != nil || notify == nil {
		return func() {}
	}
	untrack := func() {}
	if pn.kind == kindFileCert || pn.kind == kindFileRoot {
		if !m.allowed(pn) {
			return func() {}
		}
		untrack = m.trackFile(name, pn)
	}
	w := &watcher{fn: notify}
	t, id := m.subscribe(name, w)
	var once sync.Once
	return func() {
		once.Do(func() {
			w.off.Store(true)
			m.unsubscribe(name, t, id)
			untrack()
		})
	}
}

// subscribe adds w to name's topic. Every proxy watches the same names, so
// the map's lock is taken for writing only to add a topic: the usual path
// holds it for reading, which keeps a topic it finds in the map (removal
// needs the write lock), and takes only the topic's own lock.
func (m *Manager) subscribe(name string, w *watcher) (*topic, uint64) {
	m.topicsMu.RLock()
	if t := m.topics[name]; t != nil {
		id := t.add(w)
		m.topicsMu.RUnlock()
		return t, id
	}
	m.topicsMu.RUnlock()
	m.topicsMu.Lock()
	defer m.topicsMu.Unlock()
	t := m.topics[name]
	if t == nil {
		t = &topic{subs: map[uint64]*watcher{}}
		m.topics[name] = t
	}
	return t, t.add(w)
}

// unsubscribe removes watcher id from t, and t from the map when it was the
// last one: only that last cancel takes the map's write lock, so 10,000
// streams closing at once do not queue on one lock.
func (m *Manager) unsubscribe(name string, t *topic, id uint64) {
	t.mu.Lock()
	delete(t.subs, id)
	t.snap = nil
	empty := len(t.subs) == 0
	t.mu.Unlock()
	if !empty {
		return
	}
	m.topicsMu.Lock()
	defer m.topicsMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.subs) == 0 && m.topics[name] == t { // a Watch may have come in between
		delete(m.topics, name)
	}
}

func (t *topic) add(w *watcher) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	id := t.nextID
	t.nextID++
	t.subs[id] = w
	t.snap = nil
	return id
}

// Watchers returns how many watchers name has.
func (m *Manager) Watchers(name string) int {
	m.topicsMu.RLock()
	t := m.topics[name]
	m.topicsMu.RUnlock()
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.subs)
}

// Held reports what the Manager keeps for watched names: topics (names
// with watchers) and file entries (distinct watched files). Both drop to
// what default and ROOTCA need once the last watch of the others ends.
func (m *Manager) Held() (topics, files int) {
	m.topicsMu.Lock()
	topics = len(m.topics)
	m.topicsMu.Unlock()
	m.mu.Lock()
	files = len(m.files)
	m.mu.Unlock()
	return topics, files
}

// publish calls the watchers of name with its current secret, unless that
// version was already pushed. Reading the current secret under pushMu (rather
// than taking it as an argument) keeps a late push from delivering an older
// version after a newer one.
func (m *Manager) publish(name string) {
	m.topicsMu.RLock()
	t := m.topics[name]
	m.topicsMu.RUnlock()
	if t == nil {
		return
	}
	t.pushMu.Lock()
	defer t.pushMu.Unlock()
	s := m.current(name)
	if s == nil || s.Version == t.lastVersion {
		return
	}
	t.lastVersion = s.Version
	t.mu.Lock()
	if t.snap == nil {
		t.snap = make([]*watcher, 0, len(t.subs))
		for _, w := range t.subs {
			t.snap = append(t.snap, w)
		}
	}
	snap := t.snap
	t.mu.Unlock()
	for _, w := range snap {
		if !w.off.Load() {
			w.fn(s)
		}
	}
	m.metrics.pushes.Add(float64(len(snap)))
}

// current returns the secret held for name, without producing it.
func (m *Manager) current(name string) *Secret {
	switch name {
	case DefaultName:
		return m.cert.Load()
	case RootName:
		return m.roots.Load()
	case FederatedRootName:
		return m.fed.secret.Load()
	}
	pn, err := parseName(name)
	if err != nil {
		return nil
	}
	e := m.fileEntryOf(pn)
	if e == nil {
		return nil
	}
	return named(e.cur.Load(), name)
}
