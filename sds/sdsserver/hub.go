package sdsserver

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/sds/secretcache"
)

// hub is what streams share: the encoded-resource cache. Subscriptions are
// the Source's (Manager.Watch is the one subscription point, for SDS streams
// and any other consumer); each stream keeps its own in subs.
//
// No lock is shared by all streams on their paths: every proxy subscribes
// to the same two names (default, ROOTCA), so a lock per name would be as
// global as one lock. Reference counts are atomic under the map's read
// lock, and the write lock is taken only to add a name or to drop it when
// its last subscription goes: 10,000 streams that open or close at once
// contend on nothing (the mutex profile in docs/benchmarks.md). Each name's
// entry has its own lock.
type hub struct {
	src Source

	mu    sync.RWMutex
	cache map[string]*cached // by name, while a stream subscribes to it
}

// cached is the latest entry of a subscribed name and how many stream
// subscriptions hold it.
type cached struct {
	refs atomic.Int64 // 0: being dropped (only the map's write lock revives it)
	mu   sync.Mutex   // guards e
	e    *entry
}

func newHub(src Source) *hub { return &hub{src: src, cache: map[string]*cached{}} }

// lookup returns the cache record of name, or nil.
func (h *hub) lookup(name string) *cached {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.cache[name]
}

// ref counts a subscription to name, so that entries built for it are kept.
func (h *hub) ref(name string) {
	h.mu.RLock()
	if c := h.cache[name]; c != nil {
		for n := c.refs.Load(); n > 0; n = c.refs.Load() {
			if c.refs.CompareAndSwap(n, n+1) {
				h.mu.RUnlock()
				return
			}
		}
	}
	h.mu.RUnlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.cache[name]
	if c == nil {
		c = &cached{}
		h.cache[name] = c
	}
	c.refs.Add(1) // revives a record whose last unref waits for the lock
}

// unref drops a subscription; the last one frees the name's entry.
func (h *hub) unref(name string) {
	c := h.lookup(name)
	if c == nil || c.refs.Add(-1) > 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cache[name] == c && c.refs.Load() <= 0 {
		delete(h.cache, name)
	}
}

// entry returns the Envoy resources of sec, built once per version however
// many streams send it (the private key's PEM exists nowhere else). An
// entry for a name no stream subscribes to (FetchSecrets) is built for the
// caller only.
func (h *hub) entry(sec *secretcache.Secret) (*entry, error) {
	if sec == nil {
		return nil, errors.New("sds: nil secret")
	}
	c := h.lookup(sec.Name)
	if c == nil {
		return newEntry(sec)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.e != nil && c.e.version == sec.Version {
		return c.e, nil
	}
	e, err := newEntry(sec)
	if err != nil {
		return nil, err
	}
	c.e = e
	return e, nil
}

// size returns how many names the cache holds, for tests.
func (h *hub) size() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.cache)
}

// sub is one stream's subscription to one name: the stream's own Watch on
// the Source, the latest entry it reported, and what the stream sent.
type sub struct {
	name   string
	st     *stream
	cur    atomic.Pointer[entry] // nil until the secret exists
	cancel func()                // the Watch

	// Guarded by the stream's mu.
	sent     string // the version the client holds ("" = none)
	reported bool   // the name was reported unknown (logged; delta: removed)
}

// notify is the Source's Watch callback: it installs the new version and
// marks the stream. It runs on the Source's goroutine and must not block.
func (sb *sub) notify(sec *secretcache.Secret) {
	e := unknown
	if sec != nil {
		var err error
		if e, err = sb.st.srv.hub.entry(sec); err != nil {
			sb.st.srv.log.Error("cannot build SDS resource", logs.KeyResource, sb.name, logs.KeyError, err)
			return
		}
	}
	sb.cur.Store(e)
	sb.st.kick()
}

// fetch asks the Source for the current secret, after the Watch, so that a
// change in between is not lost; it runs on the stream's handler goroutine
// with the stream's context. A secret that does not exist yet arrives later
// through notify. It reports whether there is something to send.
func (sb *sub) fetch(ctx context.Context) bool {
	s := sb.st
	sec, err := s.srv.src.Secret(ctx, sb.name)
	var e *entry
	switch {
	case err == nil:
		if e, err = s.srv.hub.entry(sec); err != nil {
			s.srv.log.Error("cannot build SDS resource", logs.KeyResource, sb.name, logs.KeyError, err)
			return false
		}
	case errors.Is(err, secretcache.ErrUnknownResource):
		e = unknown
	case ctx.Err() != nil:
		return false
	default:
		if s.srv.debug() {
			s.srv.log.Debug("SDS resource not ready yet; it is sent when it becomes available", s.logAttrs("resource", sb.name, "error", err)...)
		}
		return false
	}
	// A notify that arrived meanwhile carries a newer version.
	return sb.cur.CompareAndSwap(nil, e)
}
