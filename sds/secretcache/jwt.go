package secretcache

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// JWTSigner obtains JWT-SVIDs and the JWT bundle from the CA;
// caclient.Client implements it. MintJWTSVID returns the token for id and
// audience (the Manager checks it against the bundle); FetchJWTBundles the
// RFC 7517 key sets keyed by trust domain SPIFFE ID. Both must return within
// a bounded time; caclient applies its Timeout.
type JWTSigner interface {
	MintJWTSVID(ctx context.Context, id spiffeid.ID, audience []string) (string, error)
	FetchJWTBundles(ctx context.Context) (map[string][]byte, error)
}

// Defaults and limits of the JWT-SVID cache.
const (
	// DefaultMaxJWTSVIDs bounds the JWT-SVIDs cached, one per audience
	// set; the least recently used is dropped beyond it.
	DefaultMaxJWTSVIDs = 1000
	// DefaultJWTBundleRefresh is how often the JWT bundle is fetched again
	// once in use. The CA publishes a signing key a day before it signs,
	// so any interval well under a day sees every key in time.
	DefaultJWTBundleRefresh = 5 * time.Minute
	// MaxJWTAudiences and MaxJWTAudienceLength bound a JWT-SVID request's
	// audiences: the CA's own limits (ca/jwtissuer), checked here so that a
	// bad request costs no CA round trip.
	MaxJWTAudiences      = 16
	MaxJWTAudienceLength = 256
	// MaxJWTSize bounds a token given to ValidateJWTSVID, in bytes.
	MaxJWTSize = 16 << 10
	// DefaultMaxJWTFlights bounds the JWT-SVID requests in progress at
	// once, one per audience set whatever the number of callers waiting
	// for it; a request for one more audience set is refused with
	// ErrTooManyJWTRequests (issue 28: without a bound, 150,000 calls with
	// distinct audiences queued 1 GB and 120,000 CA requests).
	DefaultMaxJWTFlights = 64
	// maxJWTMints bounds the JWT-SVID requests to the CA in flight at
	// once; the other flights wait for a slot (and leave the queue when
	// their last caller leaves).
	maxJWTMints = 16
	// minJWTBundleRefetch spaces the bundle fetches triggered by a token
	// signed with an unknown key, so that forged tokens with random key
	// IDs cannot make the agent hammer the CA.
	minJWTBundleRefetch = 30 * time.Second
)

var (
	// ErrJWTUnavailable is returned by the JWT methods of a Manager
	// without a JWTSigner.
	ErrJWTUnavailable = errors.New("secretcache: JWT-SVIDs are not available (no JWT signer)")
	// ErrInvalidAudience is wrapped by errors about a request's audiences.
	ErrInvalidAudience = errors.New("secretcache: invalid audience")
	// ErrInvalidJWT is wrapped by every refusal of a token.
	ErrInvalidJWT = errors.New("secretcache: invalid JWT-SVID")
	// ErrTooManyJWTRequests is returned for a JWT-SVID of a new audience
	// set while Config.MaxJWTFlights requests are in progress.
	ErrTooManyJWTRequests = errors.New("secretcache: too many JWT-SVID requests in progress")
)

// JWTSVID is a JWT-SVID: minted for this workload, or validated.
type JWTSVID struct {
	Token    string
	ID       spiffeid.ID
	Audience []string
	Expiry   time.Time
	// Claims are all the token's claims, as decoded from JSON.
	Claims map[string]any
}

// JWTBundle is the JWT bundle of the CA. It is immutable; a change
// produces a new *JWTBundle with a new Version.
type JWTBundle struct {
	Version string
	// Raw holds each trust domain's JWKS as the CA served it, keyed by
	// the trust domain's SPIFFE ID ("spiffe://<td>").
	Raw map[string][]byte
	Set *jwtbundle.Set
}

// jwtCache holds the JWT-SVIDs (least recently used first out) and the JWT
// bundle of a Manager.
type jwtCache struct {
	signer     JWTSigner
	id         spiffeid.ID
	clock      clock.Clock
	log        *slog.Logger
	warns      *logs.Throttle // of the CA failures callers cause
	max        int
	maxFlights int
	refused    prometheus.Counter // requests refused by maxFlights; nil: none
	refresh    time.Duration
	mints      chan struct{} // a token per CA request in flight

	mu      sync.Mutex
	lru     *list.List // of *jwtEntry, most recently used first
	entries map[string]*list.Element
	flights map[string]*jwtFlight
	stopped bool           // Run has ended: no new flight
	running sync.WaitGroup // the flights' goroutines

	bundle    atomic.Pointer[JWTBundle]
	wanted    chan struct{} // closed once the bundle was asked for: keep it fresh
	wantOnce  sync.Once
	fetching  chan struct{} // a token held by the bundle fetch in progress
	lastFetch time.Time     // of the last fetch, under fetching

	watchMu  sync.Mutex
	watchID  uint64
	watchers map[uint64]func(*JWTBundle)
}

type jwtEntry struct {
	key     string
	svid    *JWTSVID
	renewAt time.Time
}

// jwtFlight is one JWT-SVID request, shared by the callers that want the
// same audience set. It is cancelled when its last caller leaves, so that a
// caller that gives up costs no CA request, and when Run ends.
type jwtFlight struct {
	done    chan struct{}
	svid    *JWTSVID
	err     error
	waiters int // callers waiting, under jwtCache.mu
	cancel  context.CancelFunc
}

func newJWTCache(signer JWTSigner, id spiffeid.ID, max, maxFlights int, refresh time.Duration, clk clock.Clock, log *slog.Logger) *jwtCache {
	return &jwtCache{
		signer: signer, id: id, clock: clk, log: log, max: max, maxFlights: maxFlights, refresh: refresh,
		warns:    logs.NewThrottle(),
		mints:    make(chan struct{}, maxJWTMints),
		fetching: make(chan struct{}, 1),
		wanted:   make(chan struct{}),
		lru:      list.New(),
		entries:  map[string]*list.Element{},
		flights:  map[string]*jwtFlight{},
		watchers: map[uint64]func(*JWTBundle){},
	}
}

// JWTSVID returns a JWT-SVID of the workload for audience: the cached one
// while less than half its life has passed, else a new one from the CA
// (one request however many callers ask for the same audience set). The
// token is checked against the JWT bundle (signature, subject, audience,
// expiry) before it is cached or returned. A new audience set while
// Config.MaxJWTFlights requests are in progress is refused at once with
// ErrTooManyJWTRequests; a request whose callers have all left is
// cancelled and never reaches the CA. Errors: ErrInvalidAudience,
// ErrJWTUnavailable, ErrTooManyJWTRequests, ErrNotReady (the CA failed,
// or Run has ended), or the CA's refusal.
func (m *Manager) JWTSVID(ctx context.Context, audience []string) (*JWTSVID, error) {
	if m.jwt == nil {
		return nil, ErrJWTUnavailable
	}
	return m.jwt.svid(ctx, audience)
}

// JWTSVIDsCached returns how many JWT-SVIDs the Manager holds.
func (m *Manager) JWTSVIDsCached() int {
	if m.jwt == nil {
		return 0
	}
	m.jwt.mu.Lock()
	defer m.jwt.mu.Unlock()
	return m.jwt.lru.Len()
}

// JWTRequestsInProgress returns how many JWT-SVID requests (one per
// audience set) are in progress, at most Config.MaxJWTFlights.
func (m *Manager) JWTRequestsInProgress() int {
	if m.jwt == nil {
		return 0
	}
	m.jwt.mu.Lock()
	defer m.jwt.mu.Unlock()
	return len(m.jwt.flights)
}

// JWTBundle returns the JWT bundle, fetching it from the CA the first
// time; from then on Run refreshes it every JWTBundleRefresh.
func (m *Manager) JWTBundle(ctx context.Context) (*JWTBundle, error) {
	if m.jwt == nil {
		return nil, ErrJWTUnavailable
	}
	return m.jwt.currentBundle(ctx)
}

// WatchJWTBundle calls notify, which must not block, each time the JWT
// bundle changes, until cancel is called.
func (m *Manager) WatchJWTBundle(notify func(*JWTBundle)) (cancel func()) {
	if m.jwt == nil || notify == nil {
		return func() {}
	}
	c := m.jwt
	c.watchMu.Lock()
	id := c.watchID
	c.watchID++
	c.watchers[id] = notify
	c.watchMu.Unlock()
	return func() {
		c.watchMu.Lock()
		delete(c.watchers, id)
		c.watchMu.Unlock()
	}
}

// ValidateJWTSVID validates token for audience against the JWT bundle, on
// the Manager's clock. A token signed with a key the bundle lacks makes the
// Manager fetch the bundle again (at most every 30 seconds) before it
// refuses. Refusals wrap ErrInvalidJWT.
func (m *Manager) ValidateJWTSVID(ctx context.Context, token, audience string) (*JWTSVID, error) {
	if m.jwt == nil {
		return nil, ErrJWTUnavailable
	}
	return m.jwt.validate(ctx, token, []string{audience}, false)
}

func (c *jwtCache) svid(ctx context.Context, audience []string) (*JWTSVID, error) {
	key, err := audienceKey(audience)
	if err != nil {
		return nil, err
	}
	key = c.id.String() + "\n" + key // per (identity, audience set)
	now := c.clock.Now()
	c.mu.Lock()
	if el, ok := c.entries[key]; ok {
		e := el.Value.(*jwtEntry)
		if now.Before(e.renewAt) {
			c.lru.MoveToFront(el)
			c.mu.Unlock()
			return e.svid, nil
		}
	}
	f := c.flights[key]
	if f == nil {
		switch {
		case c.stopped:
			c.mu.Unlock()
			return nil, fmt.Errorf("%w: the agent is stopping", ErrNotReady)
		case len(c.flights) >= c.maxFlights:
			c.mu.Unlock()
			if c.refused != nil {
				c.refused.Inc()
			}
			return nil, fmt.Errorf("%w: %d distinct audience sets are being requested, the limit; retry later", ErrTooManyJWTRequests, c.maxFlights)
		}
		// Not this caller's context: callers that join the flight still
		// get its result when the first leaves. The flight's own context
		// ends with its last caller (leave) or with Run (stop); the CA
		// client bounds the request's time.
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &jwtFlight{done: make(chan struct{}), cancel: cancel}
		c.flights[key] = f
		c.running.Add(1)
		go c.mint(fctx, key, slices.Clone(audience), f)
	}
	f.waiters++
	c.mu.Unlock()
	select {
	case <-f.done:
		return f.svid, f.err
	case <-ctx.Done():
		c.leave(key, f)
		return nil, ctx.Err()
	}
}

// leave is a caller of f giving up; the last one cancels f, and a new
// caller of the same audience set starts a new flight.
func (c *jwtCache) leave(key string, f *jwtFlight) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.waiters--; f.waiters > 0 {
		return
	}
	f.cancel()
	if c.flights[key] == f {
		delete(c.flights, key)
	}
}

// stop cancels every flight, refuses new ones and waits for the flights'
// goroutines: once Run returns, none is left.
func (c *jwtCache) stop() {
	c.mu.Lock()
	c.stopped = true
	for _, f := range c.flights {
		f.cancel()
	}
	c.mu.Unlock()
	c.running.Wait()
}

// mint obtains, checks and caches the JWT-SVID of f, unless f is cancelled
// first: a flight whose callers all left before it got one of the CA slots
// never asks the CA.
func (c *jwtCache) mint(ctx context.Context, key string, audience []string, f *jwtFlight) {
	defer c.running.Done()
	defer f.cancel()
	var (
		tok string
		err error
	)
	select {
	case c.mints <- struct{}{}:
		if err = ctx.Err(); err == nil {
			tok, err = c.signer.MintJWTSVID(ctx, c.id, audience)
		}
		<-c.mints
	case <-ctx.Done():
		err = ctx.Err()
	}
	var svid *JWTSVID
	if err == nil {
		svid, err = c.validate(ctx, tok, audience, true)
		if err == nil && (svid.ID != c.id || !sameSet(svid.Audience, audience)) {
			err = fmt.Errorf("%w: the CA's token is for %s %q, want %s %q", ErrInvalidJWT, svid.ID, svid.Audience, c.id, audience)
		}
	}
	// Warnings are throttled: callers asking in a loop while the CA is
	// down would otherwise write a line per request.
	switch {
	case err == nil:
	case ctx.Err() != nil:
		// Every caller left, or Run ended: nobody to tell, nothing to warn.
		err = fmt.Errorf("%w: JWT-SVID request cancelled: %w", ErrNotReady, ctx.Err())
	case tok != "":
		c.warns.Warn(c.log, c.clock.Now(), "JWT-SVID from the CA refused", "error", err)
		// The CA's fault, not the caller's: not ready, not invalid input.
		err = fmt.Errorf("%w: the CA's JWT-SVID: %w", ErrNotReady, err)
	default:
		c.warns.Warn(c.log, c.clock.Now(), "JWT-SVID request failed", "error", err)
	}
	now := c.clock.Now()
	c.mu.Lock()
	if err == nil {
		if el, ok := c.entries[key]; ok {
			c.lru.Remove(el)
		}
		renewAt := now.Add(svid.Expiry.Sub(now) / 2)
		c.entries[key] = c.lru.PushFront(&jwtEntry{key: key, svid: svid, renewAt: renewAt})
		for c.lru.Len() > c.max {
			old := c.lru.Remove(c.lru.Back()).(*jwtEntry)
			delete(c.entries, old.key)
		}
	}
	if c.flights[key] == f {
		delete(c.flights, key)
	}
	f.svid, f.err = svid, err
	c.mu.Unlock()
	close(f.done)
}

// validate checks token against the bundle; a token signed by a key the
// bundle lacks triggers one fetch (always for the CA's own answers,
// otherwise at most every minJWTBundleRefetch) and a second check.
func (c *jwtCache) validate(ctx context.Context, token string, audience []string, fromCA bool) (*JWTSVID, error) {
	b, err := c.currentBundle(ctx)
	if err != nil {
		return nil, err
	}
	svid, err := validateJWT(token, b.Set, audience, c.clock.Now())
	if !errors.Is(err, errUnknownKey) {
		return svid, err
	}
	if b, err = c.fetchBundle(ctx, b, fromCA); err != nil {
		return nil, err
	}
	return validateJWT(token, b.Set, audience, c.clock.Now())
}

func (c *jwtCache) currentBundle(ctx context.Context) (*JWTBundle, error) {
	c.wantOnce.Do(func() { close(c.wanted) })
	if b := c.bundle.Load(); b != nil {
		return b, nil
	}
	return c.fetchBundle(ctx, nil, true)
}

// fetchBundle fetches the bundle unless one newer than seen was installed
// meanwhile, or unless force is false and the last fetch was recent. One
// fetch at a time; a caller waiting for another's fetch leaves when its
// context ends (ValidateJWTSVID callers do not pile up behind a slow CA).
func (c *jwtCache) fetchBundle(ctx context.Context, seen *JWTBundle, force bool) (*JWTBundle, error) {
	select {
	case c.fetching <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: JWT bundle: %w", ErrNotReady, ctx.Err())
	}
	defer func() { <-c.fetching }()
	cur := c.bundle.Load()
	if cur != nil && cur != seen {
		return cur, nil
	}
	now := c.clock.Now()
	if cur != nil && !force && now.Sub(c.lastFetch) < minJWTBundleRefetch {
		return cur, nil
	}
	c.lastFetch = now
	raw, err := c.signer.FetchJWTBundles(ctx)
	if err == nil {
		var b *JWTBundle
		if b, err = parseJWTBundles(raw); err == nil {
			if cur == nil || cur.Version != b.Version {
				c.bundle.Store(b)
				c.log.Info("JWT bundle updated", logs.KeyVersion, b.Version)
				c.notify(b)
			}
			return c.bundle.Load(), nil
		}
	}
	if cur != nil {
		c.log.Warn("JWT bundle refresh failed; keeping the current one", logs.KeyError, err)
		return cur, nil
	}
	return nil, fmt.Errorf("%w: JWT bundle: %w", ErrNotReady, err)
}

func (c *jwtCache) notify(b *JWTBundle) {
	c.watchMu.Lock()
	fns := make([]func(*JWTBundle), 0, len(c.watchers))
	for _, fn := range c.watchers {
		fns = append(fns, fn)
	}
	c.watchMu.Unlock()
	for _, fn := range fns {
		fn(b)
	}
}

// run refreshes the bundle every refresh interval once it is in use (an
// agent whose workloads never use JWT-SVIDs never asks the CA for it).
// When ctx ends it cancels the JWT-SVID requests in progress and waits for
// them.
func (c *jwtCache) run(ctx context.Context) {
	c.mu.Lock()
	c.stopped = false
	c.mu.Unlock()
	defer c.stop()
	select {
	case <-ctx.Done():
		return
	case <-c.wanted:
	}
	clock.Loop(ctx, c.clock, c.refresh, nil, func(ctx context.Context) time.Duration {
		_, _ = c.fetchBundle(ctx, c.bundle.Load(), true)
		return c.refresh
	})
}

// parseJWTBundles parses the CA's bundles; Version is a hash of them all.
func parseJWTBundles(raw map[string][]byte) (*JWTBundle, error) {
	tds := make([]string, 0, len(raw))
	for k := range raw {
		tds = append(tds, k)
	}
	sort.Strings(tds)
	h := sha256.New()
	set := jwtbundle.NewSet()
	for _, k := range tds {
		td, err := spiffeid.TrustDomainFromString(k)
		if err != nil {
			return nil, fmt.Errorf("secretcache: JWT bundle key %q: %w", k, err)
		}
		b, err := jwtbundle.Parse(td, raw[k])
		if err != nil {
			return nil, fmt.Errorf("secretcache: JWT bundle of %s: %w", td.Name(), err)
		}
		set.Add(b)
		fmt.Fprintf(h, "%d:%s%d:", len(k), k, len(raw[k]))
		h.Write(raw[k])
	}
	return &JWTBundle{Version: hex.EncodeToString(h.Sum(nil))[:16], Raw: raw, Set: set}, nil
}

// audienceKey checks audience and returns the cache key of its set.
func audienceKey(audience []string) (string, error) {
	switch {
	case len(audience) == 0:
		return "", fmt.Errorf("%w: at least one audience is required", ErrInvalidAudience)
	case len(audience) > MaxJWTAudiences:
		return "", fmt.Errorf("%w: %d audiences, more than the limit of %d", ErrInvalidAudience, len(audience), MaxJWTAudiences)
	}
	for n, a := range audience {
		switch {
		case a == "":
			return "", fmt.Errorf("%w: audience %d is empty", ErrInvalidAudience, n)
		case len(a) > MaxJWTAudienceLength:
			return "", fmt.Errorf("%w: audience %d is %d bytes, more than the limit of %d", ErrInvalidAudience, n, len(a), MaxJWTAudienceLength)
		case !utf8.ValidString(a):
			return "", fmt.Errorf("%w: audience %d is not valid UTF-8", ErrInvalidAudience, n)
		}
	}
	set := slices.Clone(audience)
	slices.Sort(set)
	set = slices.Compact(set)
	key, err := json.Marshal(set) // an unambiguous encoding of the set
	return string(key), err
}

// sameSet reports whether a and b hold the same strings.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}
