package sds

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/meshid/meshid/sds/secretcache"
)

// subscriber is a stream subscribed to topics. kick must not block: it marks
// the stream as having something to send.
type subscriber interface{ kick() }

// hub holds one topic per subscribed resource name.
type hub struct {
	src  Source
	log  *slog.Logger
	memo memo

	mu     sync.Mutex
	topics map[string]*topic
}

// topic is one resource name with its subscribers. It watches the Source
// once, is fetched once (by its first subscriber), and keeps the latest
// entry.
type topic struct {
	name string
	h    *hub
	cur  atomic.Pointer[entry] // nil until the secret exists

	mu   sync.Mutex
	subs map[subscriber]struct{}

	cancelWatch func()
}

func newHub(src Source, log *slog.Logger) *hub {
	return &hub{src: src, log: log, topics: map[string]*topic{}}
}

// subscribe adds s to the topic of name. For a new topic it registers the
// one Watch and reports created: the caller must then fetch it (after the
// Watch, so that a change in between is not lost).
func (h *hub) subscribe(name string, s subscriber) (t *topic, created bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t = h.topics[name]
	if t == nil {
		t = &topic{name: name, h: h, subs: map[subscriber]struct{}{}}
		h.topics[name] = t
		// The Manager calls notify without holding locks of ours, and
		// notify takes only t.mu and the subscribers' locks, never h.mu.
		t.cancelWatch = h.src.Watch(name, t.notify)
		created = true
	}
	t.mu.Lock()
	t.subs[s] = struct{}{}
	t.mu.Unlock()
	return t, created
}

// unsubscribe removes s from t and drops the topic after its last
// subscriber.
func (h *hub) unsubscribe(t *topic, s subscriber) {
	h.mu.Lock()
	t.mu.Lock()
	delete(t.subs, s)
	empty := len(t.subs) == 0
	t.mu.Unlock()
	if !empty || h.topics[t.name] != t {
		h.mu.Unlock()
		return
	}
	delete(h.topics, t.name)
	h.mu.Unlock()
	t.cancelWatch()
}

// fetch asks the Source for the current secret; the first subscriber calls
// it, on its own goroutine and with its stream's context, so that a cached
// secret reaches a new stream without a goroutine hand-off. A secret that
// does not exist yet, or whose generation outlives that stream, arrives
// later through notify (the Source reports every new secret).
func (t *topic) fetch(ctx context.Context) {
	sec, err := t.h.src.Secret(ctx, t.name)
	switch {
	case err == nil:
		e, err := t.h.memo.get(sec)
		if err != nil {
			t.h.log.Error("cannot build SDS resource", "resource", t.name, "error", err)
			return
		}
		// A notify that arrived meanwhile carries a newer version.
		if t.cur.CompareAndSwap(nil, e) {
			t.kickAll()
		}
	case errors.Is(err, secretcache.ErrUnknownResource):
		if t.cur.CompareAndSwap(nil, unknownEntry(t.name)) {
			t.kickAll()
		}
	case ctx.Err() != nil:
	default:
		t.h.log.Info("SDS resource not ready yet; it is sent when it becomes available",
			"resource", t.name, "error", err)
	}
}

// notify is the Source's Watch callback: it installs the new version and
// marks every subscriber.
func (t *topic) notify(sec *secretcache.Secret) {
	var e *entry
	if sec == nil {
		e = unknownEntry(t.name)
	} else {
		var err error
		if e, err = t.h.memo.get(sec); err != nil {
			t.h.log.Error("cannot build SDS resource", "resource", t.name, "error", err)
			return
		}
	}
	t.cur.Store(e)
	t.kickAll()
}

func (t *topic) kickAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for s := range t.subs {
		s.kick()
	}
}
