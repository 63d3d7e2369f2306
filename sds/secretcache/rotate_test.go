package secretcache_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

func TestRotationAtGracePoint(t *testing.T) {
	const ttl = 24 * time.Hour
	f := newFixture(t, func(c *secretcache.Config) { c.TTL = ttl })
	old := mustSecret(t, f.m, secretcache.DefaultName)
	defaults := watch(t, f.m, secretcache.DefaultName)
	roots := watch(t, f.m, secretcache.RootName)
	f.run(t)

	deadline := f.parked(t)
	nb := old.Chain[0].NotBefore
	lo, hi := nb.Add(ttl/2-ttl/100), nb.Add(ttl/2+ttl/100)
	if deadline.Before(lo) || deadline.After(hi) {
		t.Fatalf("renewal at %v, want NotBefore + 12h ± 1%% = [%v, %v]", deadline, lo, hi)
	}
	// Just before the grace point nothing happens.
	f.clock.Set(deadline.Add(-time.Second))
	if n := f.ca.calls.Load(); n != 1 {
		t.Fatalf("%d CSRs before the renewal time", n)
	}
	f.clock.Set(deadline)
	got := receive(t, defaults, "default after renewal")
	if !f.clock.Now().Before(old.NotAfter) {
		t.Fatal("renewal pushed only after the old certificate expired")
	}
	if got.Version == old.Version || !got.NotAfter.After(old.NotAfter) || got.Key == old.Key {
		t.Fatalf("renewal returned the old certificate: %v vs %v", got.Version, old.Version)
	}
	if s := mustSecret(t, f.m, secretcache.DefaultName); s != got {
		t.Fatal("Secret does not serve the renewed certificate")
	}
	// The log tells the first certificate from a rotation.
	var issued []string
	for _, line := range strings.Split(f.logs.All(), "\n") {
		if strings.HasPrefix(line, "workload certificate issued") {
			issued = append(issued, line)
		}
	}
	if len(issued) != 2 || !strings.Contains(issued[0], "rotation=false") || !strings.Contains(issued[1], "rotation=true") {
		t.Fatalf("issuances logged, want the first with rotation=false, the renewal with rotation=true:\n%s", strings.Join(issued, "\n"))
	}
	select {
	case r := <-roots:
		t.Fatalf("ROOTCA pushed although the roots did not change (version %s)", r.Version)
	default:
	}
	if n := testkit.Metric(t, f.reg, "meshid_agent_rotations_total"); n != 2 {
		t.Fatalf("rotations_total = %v, want 2", n)
	}
	// The scheduler re-arms for the new certificate.
	next := f.parked(t)
	if want := got.Chain[0].NotBefore.Add(ttl / 2); next.Sub(want).Abs() > ttl/100 {
		t.Fatalf("next renewal at %v, want about %v", next, want)
	}
	if g := testkit.Metric(t, f.reg, "meshid_agent_cert_expiry_seconds"); g != got.NotAfter.Sub(f.clock.Now()).Seconds() {
		t.Fatalf("expiry gauge %v", g)
	}
}

func TestRotationNeverServesExpired(t *testing.T) {
	// Walk three lifetimes with the clock and check that at every step the
	// served certificate is valid and every push is of a valid one.
	const ttl = time.Hour
	f := newFixture(t, func(c *secretcache.Config) { c.TTL = ttl })
	mustSecret(t, f.m, secretcache.DefaultName)
	var bad atomic.Int32
	cancel := f.m.Watch(secretcache.DefaultName, func(s *secretcache.Secret) {
		if !f.clock.Now().Before(s.NotAfter) {
			bad.Add(1)
		}
	})
	defer cancel()
	f.run(t)
	end := epoch.Add(3 * ttl)
	for f.clock.Now().Before(end) {
		f.parked(t)
		f.clock.Add(5 * time.Minute)
		s := mustSecret(t, f.m, secretcache.DefaultName)
		if !f.clock.Now().Before(s.NotAfter) {
			t.Fatalf("served a certificate expired at %v at %v", s.NotAfter, f.clock.Now())
		}
	}
	if bad.Load() != 0 {
		t.Fatal("an expired certificate was pushed")
	}
	if n := f.ca.calls.Load(); n < 5 || n > 7 {
		t.Fatalf("%d CSRs over three lifetimes with renewal at half life, want about 6", n)
	}
}

// checkBackoff advances the clock deadline by deadline while the CA
// fails and checks each retry delay against base·2^n capped at max, less up
// to 20% jitter, and that the jitter shortened them (each by a random
// fraction in [0, 0.2): all of them unshortened has odds of 2^-53 each).
func checkBackoff(t *testing.T, f *fixture, want []time.Duration) {
	t.Helper()
	shortened := 0
	for i, w := range want {
		now := f.clock.Now()
		d := f.parked(t).Sub(now)
		if d > w || d < w-w/5 {
			t.Fatalf("retry %d after %v, want %v less up to 20%% jitter", i+1, d, w)
		}
		if d < w {
			shortened++
		}
		calls := f.ca.calls.Load()
		f.clock.Add(d)
		<-f.ca.entered
		if f.ca.calls.Load() != calls+1 {
			t.Fatalf("retry %d did not reach the CA", i+1)
		}
	}
	if shortened == 0 {
		t.Fatalf("none of %d retries was shortened by jitter: agents failing together would retry in step", len(want))
	}
	f.parked(t) // the last failure has been handled
}

func TestCAOutage(t *testing.T) {
	const ttl = 10 * time.Minute
	f := newFixture(t, func(c *secretcache.Config) { c.TTL = ttl })
	v1 := mustSecret(t, f.m, secretcache.DefaultName)
	<-f.ca.entered
	defaults := watch(t, f.m, secretcache.DefaultName)
	f.run(t)

	f.ca.setFail(codes.Unavailable)
	renew := f.parked(t)
	f.clock.Set(renew)
	<-f.ca.entered // the renewal attempt, which fails
	// 1s, 2s, 4s ... doubling, capped at 1 minute.
	checkBackoff(t, f, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute})
	if f.clock.Now().After(v1.NotAfter) {
		t.Fatal("test walked past expiry too early")
	}
	// While the cached certificate is valid it is served, without a CSR.
	calls := f.ca.calls.Load()
	if s := mustSecret(t, f.m, secretcache.DefaultName); s != v1 {
		t.Fatal("cached certificate not served during the outage")
	}
	if f.ca.calls.Load() != calls {
		t.Fatal("Secret sent a CSR although a valid certificate is cached")
	}
	if want := float64(9); testkit.Metric(t, f.reg, "meshid_agent_rotation_failures_total", "code", "Unavailable") != want {
		t.Fatalf("failures_total{Unavailable} = %v, want %v", testkit.Metric(t, f.reg, "meshid_agent_rotation_failures_total", "code", "Unavailable"), want)
	}
	if n := f.logs.CountContaining("CA request failed"); n != 9 {
		t.Fatalf("%d failure log lines, want 9", n)
	}

	// Past expiry: never served, reported as not ready with the cause.
	f.parked(t)
	f.clock.Set(v1.NotAfter)
	<-f.ca.entered
	f.parked(t)
	_, err := f.m.Secret(context.Background(), secretcache.DefaultName)
	if !isNotReady(err) || status.Code(err) != codes.Unavailable {
		t.Fatalf("Secret after expiry = %v, want ErrNotReady (Unavailable)", err)
	}
	if f.m.Ready() == nil {
		t.Fatal("Ready with an expired certificate")
	}
	if g := testkit.Metric(t, f.reg, "meshid_agent_cert_expiry_seconds"); g > 0 {
		t.Fatalf("expiry gauge %v after expiry", g)
	}
	select {
	case s := <-defaults:
		t.Fatalf("pushed %s during the outage", s.Version)
	default:
	}

	// The CA comes back: the next retry succeeds and is pushed on its own.
	f.ca.setFail(codes.OK)
	f.clock.Set(f.parked(t))
	v2 := receive(t, defaults, "default after recovery")
	if v2.Version == v1.Version || !f.clock.Now().Before(v2.NotAfter) {
		t.Fatal("recovery pushed a stale certificate")
	}
	if s := mustSecret(t, f.m, secretcache.DefaultName); s != v2 {
		t.Fatal("not serving the recovered certificate")
	}
	// Rotation resumes at the grace point of the new certificate.
	if next := f.parked(t); next.Sub(v2.Chain[0].NotBefore.Add(ttl/2)).Abs() > ttl/100 {
		t.Fatalf("after recovery the next renewal is at %v", next)
	}
}

func TestResourceExhaustedBacksOff(t *testing.T) {
	f := newFixture(t, nil)
	f.ca.setFail(codes.ResourceExhausted)
	_, err := f.m.Secret(context.Background(), secretcache.DefaultName)
	if !isNotReady(err) || status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Secret = %v, want ErrNotReady (ResourceExhausted)", err)
	}
	<-f.ca.entered
	// Within the backoff, more requests do not hammer the CA.
	for range 10 {
		if _, err := f.m.Secret(context.Background(), secretcache.DefaultName); !isNotReady(err) {
			t.Fatalf("Secret during backoff = %v", err)
		}
		if _, err := f.m.Secret(context.Background(), secretcache.RootName); !isNotReady(err) {
			t.Fatalf("Secret(ROOTCA) during backoff = %v", err)
		}
	}
	if n := f.ca.calls.Load(); n != 1 {
		t.Fatalf("%d CSRs during backoff, want 1", n)
	}
	defaults := watch(t, f.m, secretcache.DefaultName)
	roots := watch(t, f.m, secretcache.RootName)
	f.run(t)
	checkBackoff(t, f, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second})
	f.ca.setFail(codes.OK)
	f.clock.Set(f.parked(t))
	// The first certificate, once available, reaches the watchers of both
	// names.
	r := receive(t, roots, "ROOTCA")
	d := receive(t, defaults, "default")
	if d == nil || r == nil || !r.Roots[0].Equal(f.ca.currentRoot()) {
		t.Fatal("bad first push")
	}
	if got := testkit.Metric(t, f.reg, "meshid_agent_rotation_failures_total", "code", "ResourceExhausted"); got != 4 {
		t.Fatalf("failures{ResourceExhausted} = %v, want 4", got)
	}
}

func TestRootsChangePushesROOTCA(t *testing.T) {
	f := newFixture(t, nil)
	r1 := mustSecret(t, f.m, secretcache.RootName)
	d1 := mustSecret(t, f.m, secretcache.DefaultName)
	var order []string
	both := make(chan *secretcache.Secret, 10)
	for _, name := range []string{secretcache.DefaultName, secretcache.RootName} {
		cancel := f.m.Watch(name, func(s *secretcache.Secret) { both <- s })
		defer cancel()
	}
	// Same roots: only default is pushed, ROOTCA keeps its version.
	if err := f.m.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := receive(t, both, "default"); s.Name != secretcache.DefaultName || s.Version == d1.Version {
		t.Fatalf("got %s %s", s.Name, s.Version)
	}
	if r := mustSecret(t, f.m, secretcache.RootName); r.Version != r1.Version {
		t.Fatal("ROOTCA version changed without a content change")
	}
	// New root at the CA: ROOTCA is pushed, before default.
	newRoot := f.ca.newRoot(t)
	if err := f.m.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		s := receive(t, both, "push after root change")
		order = append(order, s.Name)
		if s.Name == secretcache.RootName && (!s.Roots[0].Equal(newRoot) || s.Version == r1.Version) {
			t.Fatal("ROOTCA push does not hold the new root")
		}
	}
	if order[0] != secretcache.RootName || order[1] != secretcache.DefaultName {
		t.Fatalf("push order %v, want ROOTCA then default", order)
	}
}

// A forced rotation keeps the failure backoff (security review, hole 6): a
// loop of POST /debug/rotate against a failing CA makes no CA call until
// the backoff ends, and the rotation goes through after it.
func TestRotateKeepsBackoff(t *testing.T) {
	f := newFixture(t, nil)
	f.ca.setFail(codes.Unavailable)
	if err := f.m.Rotate(context.Background()); status.Code(err) != codes.Unavailable || isNotReady(err) {
		t.Fatalf("Rotate = %v, want the CA's Unavailable", err)
	}
	calls := f.ca.calls.Load()
	f.ca.setFail(codes.OK)
	for range 100 {
		if err := f.m.Rotate(context.Background()); !isNotReady(err) || status.Code(err) != codes.Unavailable {
			t.Fatalf("Rotate during backoff = %v, want ErrNotReady with the last Unavailable", err)
		}
	}
	if got := f.ca.calls.Load(); got != calls {
		t.Fatalf("%d CA calls during the backoff, want none", got-calls)
	}
	f.clock.Add(secretcache.DefaultBackoffMax) // past any backoff
	if err := f.m.Rotate(context.Background()); err != nil {
		t.Fatalf("Rotate after the backoff: %v", err)
	}
	if err := f.m.Ready(); err != nil {
		t.Fatal(err)
	}
}

func TestRunTwice(t *testing.T) {
	f := newFixture(t, nil)
	mustSecret(t, f.m, secretcache.DefaultName)
	f.run(t)
	f.parked(t) // the first Run is scheduling
	if err := f.m.Run(context.Background()); err == nil || !containsFold(err.Error(), "twice") {
		t.Fatalf("second Run: %v", err)
	}
}

func TestManyWatchersOneRotation(t *testing.T) {
	f := newFixture(t, nil)
	mustSecret(t, f.m, secretcache.DefaultName)
	const n = 10000
	before := runtime.NumGoroutine()
	var got atomic.Int64
	done := make(chan struct{})
	cancels := make([]func(), n)
	for i := range n {
		cancels[i] = f.m.Watch(secretcache.DefaultName, func(*secretcache.Secret) {
			if got.Add(1) == n {
				close(done)
			}
		})
	}
	if g := runtime.NumGoroutine() - before; g > 10 {
		t.Fatalf("%d goroutines for %d watchers", g, n)
	}
	if w := f.m.Watchers(secretcache.DefaultName); w != n {
		t.Fatalf("%d watchers, want %d", w, n)
	}
	if err := f.m.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("only %d of %d watchers notified", got.Load(), n)
	}
	// Cancel half; the next rotation reaches only the rest.
	for _, c := range cancels[:n/2] {
		c()
	}
	got.Store(0)
	if err := f.m.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if g := got.Load(); g != n/2 {
		t.Fatalf("%d notifications after cancelling half, want %d", g, n/2)
	}
}

func TestBackdatedCertificateNoHotLoop(t *testing.T) {
	// NotBefore 10h in the past, 1h left: the grace point has passed
	// already. The Manager renews soon, but not in a tight loop.
	f := newFixture(t, func(c *secretcache.Config) { c.TTL = time.Hour })
	f.ca.setTamper("backdated")
	mustSecret(t, f.m, secretcache.DefaultName)
	f.run(t)
	if d := f.parked(t).Sub(f.clock.Now()); d != time.Second {
		t.Fatalf("renewal in %v, want the 1s floor", d)
	}
}

// TestRenewalInsideBackoffFloor: a renewal time that is still ahead, but
// closer than the base backoff (a one-second certificate renews at 0.5s),
// is raised to the floor too: the floor compares against now + backoff,
// not against now.
func TestRenewalInsideBackoffFloor(t *testing.T) {
	f := newFixture(t, nil)
	f.ca.setTamper("one-second")
	mustSecret(t, f.m, secretcache.DefaultName)
	f.run(t)
	if d := f.parked(t).Sub(f.clock.Now()); d != time.Second {
		t.Fatalf("renewal in %v, want the 1s floor", d)
	}
}

// TestWatchCancelConcurrently: watches of the same names opened and
// cancelled from many goroutines at once (10,000 streams closing while
// others open) leave exactly the watchers still held, and the last cancel
// of a name frees its topic. Run with -race: only adding or dropping a
// topic takes the Manager's map lock for writing.
func TestWatchCancelConcurrently(t *testing.T) {
	f := newFixture(t, nil)
	mustSecret(t, f.m, secretcache.DefaultName)
	topics0, _ := f.m.Held()
	held := f.m.Watch(secretcache.DefaultName, func(*secretcache.Secret) {})
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				name := []string{secretcache.DefaultName, secretcache.RootName}[(g+i)%2]
				cancel := f.m.Watch(name, func(*secretcache.Secret) {})
				if f.m.Watchers(name) == 0 {
					t.Errorf("%s has no watcher while one is held", name)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	if w := f.m.Watchers(secretcache.DefaultName); w != 1 {
		t.Fatalf("%d watchers of default, want the one held", w)
	}
	if w := f.m.Watchers(secretcache.RootName); w != 0 {
		t.Fatalf("%d watchers of ROOTCA, want 0", w)
	}
	held()
	if topics, _ := f.m.Held(); topics != topics0 {
		t.Fatalf("%d topics held after every cancel, want %d", topics, topics0)
	}
}

// Renewal moves by up to ±Jitter of the lifetime around the grace point
// (±1% by default), so that agents started together do not renew
// together; a negative Jitter renews exactly at the grace point.
func TestRenewalJitter(t *testing.T) {
	const ttl = 24 * time.Hour
	offset := func(jitter float64) time.Duration { // of the renewal from the grace point
		t.Helper()
		f := newFixture(t, func(c *secretcache.Config) { c.TTL = ttl; c.Jitter = jitter })
		s := mustSecret(t, f.m, secretcache.DefaultName)
		f.run(t)
		return f.parked(t).Sub(s.Chain[0].NotBefore.Add(ttl / 2))
	}
	if d := offset(-1); d != 0 {
		t.Errorf("jitter disabled: renewal %v from the grace point, want 0", d)
	}
	for _, tc := range []struct {
		jitter float64
		max    time.Duration
	}{{0, ttl / 100}, {0.2, ttl / 5}} {
		moved := 0
		for range 5 {
			d := offset(tc.jitter)
			if d.Abs() > tc.max {
				t.Errorf("jitter %v: renewal %v from the grace point, want at most ±%v", tc.jitter, d, tc.max)
			}
			if d != 0 {
				moved++
			}
		}
		if moved == 0 { // odds of 2^-53 each
			t.Errorf("jitter %v: 5 renewals all at the grace point", tc.jitter)
		}
	}
}
