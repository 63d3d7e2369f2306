package secretcache_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// heldJWT is a real signer behind a valve: while held, MintJWTSVID (and
// FetchJWTBundles when holdFetch) wait for the valve or their context, as
// a CA that does not answer. asked counts the calls that reached the
// signer: a cancelled flight must never be one of them.
type heldJWT struct {
	*countingJWT
	holdFetch bool

	mu     sync.Mutex
	open   chan struct{}
	asked  atomic.Int64
	inside atomic.Int64 // calls waiting at the valve now
	seen   sync.Map     // audience[0] of every call that reached the signer
}

func newHeldJWT(inner *countingJWT) *heldJWT {
	return &heldJWT{countingJWT: inner, open: make(chan struct{})}
}

func (h *heldJWT) valve() chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.open
}

func (h *heldJWT) release() { close(h.valve()) }

func (h *heldJWT) wait(ctx context.Context) error {
	h.inside.Add(1)
	defer h.inside.Add(-1)
	select {
	case <-h.valve():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *heldJWT) MintJWTSVID(ctx context.Context, id spiffeid.ID, aud []string) (string, error) {
	h.asked.Add(1)
	h.seen.Store(aud[0], true)
	if err := h.wait(ctx); err != nil {
		return "", err
	}
	return h.countingJWT.MintJWTSVID(ctx, id, aud)
}

func (h *heldJWT) FetchJWTBundles(ctx context.Context) (map[string][]byte, error) {
	if h.holdFetch {
		if err := h.wait(ctx); err != nil {
			return nil, err
		}
	}
	return h.countingJWT.FetchJWTBundles(ctx)
}

// heldFixture is a Manager whose JWT signer (a real jwtissuer) is held
// back by a valve, with its JWT bundle already fetched.
func heldFixture(t *testing.T, mod func(*secretcache.Config)) (*fixture, *heldJWT) {
	t.Helper()
	var held *heldJWT
	f, _ := jwtFixture(t, func(cfg *secretcache.Config) {
		held = newHeldJWT(cfg.JWTSigner.(*countingJWT))
		cfg.JWTSigner = held
		if mod != nil {
			mod(cfg)
		}
	})
	if _, err := f.m.JWTBundle(t.Context()); err != nil {
		t.Fatal(err)
	}
	return f, held
}

// Issue 28, hole 1: the flights are bounded; a request for one more
// audience set is refused at once with ErrTooManyJWTRequests (a caller of
// a set already in flight joins it); flights whose callers all leave are
// cancelled, and those that were still waiting for one of the 16 CA slots
// never reach the CA; nothing of them is left; the next request is served.
func TestJWTFlightsBoundedAndCancelled(t *testing.T) {
	const flights = 40 // more than the 16 CA slots
	f, ca := heldFixture(t, func(c *secretcache.Config) { c.MaxJWTFlights = flights })
	base := goleak.IgnoreCurrent()
	type caller struct {
		aud    string
		cancel context.CancelFunc
		err    chan error
	}
	call := func(aud string) caller {
		ctx, cancel := context.WithCancel(context.Background())
		c := caller{aud: aud, cancel: cancel, err: make(chan error, 1)}
		go func() {
			_, err := f.m.JWTSVID(ctx, []string{aud})
			c.err <- err
		}()
		return c
	}
	callers := make([]caller, 0, flights)
	for i := range flights {
		callers = append(callers, call(fmt.Sprint("aud-", i)))
	}
	testkit.Until(t, "16 requests at the CA", func() bool { return ca.inside.Load() == 16 })
	testkit.Until(t, "every flight started", func() bool { return f.m.JWTRequestsInProgress() == flights })
	// Beyond the bound: refused at once, with a clear message.
	_, err := f.m.JWTSVID(t.Context(), []string{"one-more"})
	if !errors.Is(err, secretcache.ErrTooManyJWTRequests) || !strings.Contains(err.Error(), fmt.Sprintf("%d distinct audience sets", flights)) {
		t.Fatalf("one audience set more: %v, want ErrTooManyJWTRequests naming the bound", err)
	}
	if n := testkit.Metric(t, f.reg, "meshid_agent_jwt_requests"); n != flights {
		t.Fatalf("meshid_agent_jwt_requests = %v, want %d", n, flights)
	}
	if n := testkit.Metric(t, f.reg, "meshid_agent_jwt_requests_refused_total"); n != 1 {
		t.Fatalf("meshid_agent_jwt_requests_refused_total = %v, want 1", n)
	}
	// A caller of a set in flight joins it instead of being refused, and
	// its leaving does not end the flight the first caller still waits
	// for. It leaves before the others: a joiner whose goroutine ran
	// only after aud-0's first caller left would start a new flight that
	// a slot freed later could carry to the CA.
	joiner := call("aud-0")
	joiner.cancel()
	if err := <-joiner.err; !errors.Is(err, context.Canceled) {
		t.Fatalf("a second caller of aud-0: %v, want to join the flight (context.Canceled once it left)", err)
	}
	if n := f.m.JWTRequestsInProgress(); n != flights {
		t.Fatalf("%d flights after a joiner left, want %d", n, flights)
	}
	// The callers of the 24 requests still waiting for a CA slot leave
	// first, then the others: a slot freed by a cancelled request could
	// otherwise go to a request whose caller has not left yet.
	leave := func(atCA bool) {
		for _, c := range callers {
			if _, ok := ca.seen.Load(c.aud); ok == atCA {
				c.cancel()
				if err := <-c.err; !errors.Is(err, context.Canceled) {
					t.Fatalf("caller of %s: %v, want context.Canceled", c.aud, err)
				}
			}
		}
	}
	leave(false)
	testkit.Until(t, "the waiting requests' end", func() bool { return f.m.JWTRequestsInProgress() == 16 })
	leave(true)
	if err := goleak.Find(base); err != nil {
		t.Fatalf("goroutines left after every caller left: %v", err)
	}
	if n := testkit.Metric(t, f.reg, "meshid_agent_jwt_requests"); n != 0 {
		t.Fatalf("%v requests in progress after every caller left", n)
	}
	if n := ca.asked.Load(); n != 16 {
		t.Fatalf("%d requests reached the CA, want the 16 that held a slot when their callers left", n)
	}
	if n := f.logs.Count("JWT-SVID request failed"); n != 0 {
		t.Errorf("%d warnings about requests nobody waits for", n)
	}
	ca.release()
	if _, err := f.m.JWTSVID(t.Context(), []string{"aud-0"}); err != nil {
		t.Fatalf("after the flood: %v", err)
	}
	if n := ca.mints.Load(); n != 1 {
		t.Fatalf("the CA minted %d JWT-SVIDs, want 1 (only for a caller still waiting)", n)
	}
}

// When Run ends, the flights in progress are cancelled and their callers
// told, even those whose own context lives on; once Run has returned no
// flight goroutine is left and new requests are refused as not ready.
func TestJWTFlightsEndWithRun(t *testing.T) {
	f, ca := heldFixture(t, nil)
	base := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.m.Run(ctx) }()
	results := make(chan error, 20)
	for i := range 20 {
		go func() {
			_, err := f.m.JWTSVID(context.Background(), []string{fmt.Sprint("aud-", i)})
			results <- err
		}()
	}
	testkit.Until(t, "16 requests at the CA", func() bool { return ca.inside.Load() == 16 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if err := <-results; !errors.Is(err, secretcache.ErrNotReady) {
			t.Fatalf("caller after Run ended: %v, want ErrNotReady", err)
		}
	}
	if err := goleak.Find(base); err != nil {
		t.Fatalf("goroutines left after Run returned: %v", err)
	}
	if _, err := f.m.JWTSVID(context.Background(), []string{"late"}); !errors.Is(err, secretcache.ErrNotReady) {
		t.Fatalf("a request after Run ended: %v, want ErrNotReady", err)
	}
}

// A CA that fails every JWT-SVID request: 200 requests write
// logs.WarnBurst warnings, then one a minute (on the injected clock) that
// counts those left out.
func TestJWTFailureWarningsThrottled(t *testing.T) {
	f, ca := jwtFixture(t, func(c *secretcache.Config) {
		inner := c.JWTSigner.(*countingJWT)
		inner.Mint = func(spiffeid.ID, []string) (string, error) {
			return "", status.Error(codes.Unavailable, "CA down")
		}
	})
	for i := range 200 {
		if _, err := f.m.JWTSVID(t.Context(), []string{fmt.Sprint("aud-", i)}); status.Code(err) != codes.Unavailable {
			t.Fatalf("request %d: %v, want the CA's Unavailable", i, err)
		}
	}
	if n := ca.mints.Load(); n != 200 {
		t.Fatalf("%d CA calls, want 200", n)
	}
	const warning = "JWT-SVID request failed"
	if n := f.logs.Count(warning); n != logs.WarnBurst {
		t.Fatalf("%d warnings for 200 failures, want %d", n, logs.WarnBurst)
	}
	f.clock.Add(logs.WarnEvery)
	if _, err := f.m.JWTSVID(t.Context(), []string{"later"}); err == nil {
		t.Fatal("served while the CA fails")
	}
	if n := f.logs.Count(warning); n != logs.WarnBurst+1 || f.logs.CountContaining("suppressed=195") != 1 {
		t.Fatalf("after a minute: %d warnings, want %d, the last counting 195 left out:\n%s", n, logs.WarnBurst+1, f.logs.All())
	}
}

// A caller waiting for another caller's JWT bundle fetch leaves when its
// own context ends, instead of waiting for the CA (issue 28: ValidateJWTSVID
// callers piled up behind one slow fetch).
func TestJWTBundleWaitWatchesContext(t *testing.T) {
	var held *heldJWT
	f, _ := jwtFixture(t, func(cfg *secretcache.Config) {
		held = newHeldJWT(cfg.JWTSigner.(*countingJWT))
		held.holdFetch = true
		cfg.JWTSigner = held
	})
	first := testkit.Go(func() (*secretcache.JWTBundle, error) { return f.m.JWTBundle(t.Context()) })
	testkit.Until(t, "the first fetch at the CA", func() bool { return held.inside.Load() == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	second := testkit.Go(func() (*secretcache.JWTSVID, error) {
		return f.m.ValidateJWTSVID(ctx, "a.b.c", "orders")
	})
	cancel()
	r := <-second
	if !errors.Is(r.Err, context.Canceled) || !errors.Is(r.Err, secretcache.ErrNotReady) {
		t.Fatalf("a caller behind a slow fetch: %v, want its own cancellation", r.Err)
	}
	if n := held.inside.Load(); n != 1 {
		t.Fatalf("%d fetches at the CA, want the first only", n)
	}
	held.release()
	if r := <-first; r.Err != nil || r.Value == nil {
		t.Fatalf("the first fetch: %v", r.Err)
	}
}

// The bound is a Config field with a default; a negative one is refused.
func TestMaxJWTFlightsConfig(t *testing.T) {
	if secretcache.DefaultMaxJWTFlights != 64 {
		t.Fatalf("DefaultMaxJWTFlights = %d", secretcache.DefaultMaxJWTFlights)
	}
	_, err := secretcache.New(secretcache.Config{Signer: newTestCA(t, nil), ID: testID, MaxJWTFlights: -1})
	if err == nil || !strings.Contains(err.Error(), "MaxJWTFlights") {
		t.Fatalf("negative MaxJWTFlights: %v", err)
	}
}
