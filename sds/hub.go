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
	ctx    context.Context // fetches run under it; set by Server.Run
	topics map[string]*topic
	wg     sync.WaitGroup // fetch goroutines
}

// topic is one resource name with its subscribers. It watches the Source
// once, fetches the current secret once, and keeps the latest entry.
type topic struct {
	name string
	h    *hub
	cur  atomic.Pointer[entry] // nil until the secret exists

	mu   sync.Mutex
	subs map[subscriber]struct{}

	cancelWatch func()
	cancelFetch context.CancelFunc
}

func newHub(src Source, log *slog.Logger) *hub {
	return &hub{src: src, log: log, ctx: context.Background(), topics: map[string]*topic{}}
}

func (h *hub) setContext(ctx context.Context) {
	h.mu.Lock()
	h.ctx = ctx
	h.mu.Unlock()
}

// subscribe adds s to the topic of name, creating the topic (one Watch and
// one fetch) for its first subscriber.
func (h *hub) subscribe(name string, s subscriber) *topic {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.topics[name]
	if t == nil {
		t = &topic{name: name, h: h, subs: map[subscriber]struct{}{}}
		h.topics[name] = t
		// Watch before fetching, so that a change in between is not lost.
		// The Manager calls notify without holding locks of ours, and
		// notify takes only t.mu and the subscribers' locks, never h.mu.
		t.cancelWatch = h.src.Watch(name, t.notify)
		ctx, cancel := context.WithCancel(h.ctx)
		t.cancelFetch = cancel
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			t.fetch(ctx)
		}()
	}
	t.mu.Lock()
	t.subs[s] = struct{}{}
	t.mu.Unlock()
	return t
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
	t.cancelFetch()
	t.cancelWatch()
}

// fetch asks the Source for the current secret once. A secret that does not
// exist yet arrives later through notify.
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
