package storm_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/secretcache"
)

// agent is one SecretManager and what it served, in fake time.
type testAgent struct {
	m *secretcache.Manager

	mu        sync.Mutex
	served    []served // every default certificate pushed, in order
	limited   int      // CA answers ResourceExhausted, before the first certificate
	limitedRe int      // the same while holding a certificate (renewing)
}

// Sign passes the CSR to the CA client and counts rate-limited answers.
func (a *testAgent) sign(c secretcache.Signer) secretcache.Signer {
	return signerFunc(func(ctx context.Context, csr *x509.CertificateRequest, ttl time.Duration) ([]*x509.Certificate, []*x509.Certificate, error) {
		chain, roots, err := c.Sign(ctx, csr, ttl)
		if status.Code(err) == codes.ResourceExhausted {
			a.mu.Lock()
			if len(a.served) == 0 {
				a.limited++
			} else {
				a.limitedRe++
			}
			a.mu.Unlock()
		}
		return chain, roots, err
	})
}

type signerFunc func(ctx context.Context, csr *x509.CertificateRequest, ttl time.Duration) ([]*x509.Certificate, []*x509.Certificate, error)

func (f signerFunc) Sign(ctx context.Context, csr *x509.CertificateRequest, ttl time.Duration) ([]*x509.Certificate, []*x509.Certificate, error) {
	return f(ctx, csr, ttl)
}

type served struct {
	at       time.Time // when it was pushed
	notAfter time.Time
	version  string
}

// TestRotationStorm runs 2,000 agents (20 deployments of 100 pods, each
// deployment one service account) against a real CA server over TLS whose
// per-caller rate limit (1 certificate/s, burst 5) is far below what the
// agents ask for: all 2,000 start at the same instant, and their renewals
// come due within a few minutes of each other. The fake clock moves from one
// timer deadline to the next (at most a second at a time), and every step
// waits until every agent is parked again.
//
// It shows that the CA answers the excess with ResourceExhausted, never
// anything else; that the agents back off and keep trying; that every agent
// gets its first certificate and renews it; and that no agent ever holds an
// expired certificate: each certificate is replaced before it expires.
func TestRotationStorm(t *testing.T) {
	const (
		deployments = 20
		pods        = 100
		agents      = deployments * pods
		ttl         = 10 * time.Minute
		rate        = 1.0
		burst       = 5
		step        = time.Second
	)
	t0 := time.Now().Truncate(time.Second)
	clk := clock.NewFake(t0)
	s := startCA(t, clk, rate, burst)
	ctx, cancel := context.WithCancel(context.Background())
	var runs sync.WaitGroup
	t.Cleanup(func() { cancel(); runs.Wait() })

	all := make([]*testAgent, 0, agents)
	for d := range deployments {
		sa := fmt.Sprintf("deploy-%d", d)
		client := s.client(t, "storm", sa) // one token, one connection per deployment
		id := spiffeid.RequireFromSegments(td, "ns", "storm", "sa", sa)
		for range pods {
			a := &testAgent{}
			m, err := secretcache.New(managerConfig(t, a.sign(client), id, ttl, clk))
			if err != nil {
				t.Fatal(err)
			}
			a.m = m
			m.Watch(secretcache.DefaultName, func(sec *secretcache.Secret) {
				a.mu.Lock()
				a.served = append(a.served, served{at: clk.Now(), notAfter: sec.NotAfter, version: sec.Version})
				a.mu.Unlock()
			})
			all = append(all, a)
			runs.Go(func() { m.Run(ctx) })
		}
	}

	// Every proxy asks for its certificate at t0. Those beyond each
	// deployment's burst get ErrNotReady (ResourceExhausted): their agent
	// retries with backoff.
	var first sync.WaitGroup
	for _, a := range all {
		first.Go(func() { a.m.Secret(ctx, secretcache.DefaultName) })
	}
	first.Wait()

	// The waiters are one timer per agent plus the CA's limiter pruning.
	parked := agents + 1
	stuck := guard(t, 2*time.Minute)
	steps := 0
	for {
		if !clk.WaitForWaiters(parked, stuck) {
			t.Fatalf("after %d steps at %s: only %d of %d timers pending", steps, clk.Now().Sub(t0), clk.Waiters(), parked)
		}
		now := clk.Now()
		renewed, holding := 0, 0
		for i, a := range all {
			a.mu.Lock()
			n := len(a.served)
			var cur served
			if n > 0 {
				cur = a.served[n-1]
			}
			a.mu.Unlock()
			if n == 0 {
				continue
			}
			holding++
			if !now.Before(cur.notAfter) {
				t.Fatalf("agent %d holds a certificate that expired at %s (now %s)", i, cur.notAfter.Sub(t0), now.Sub(t0))
			}
			if err := a.m.Ready(); err != nil {
				t.Fatalf("agent %d: %v", i, err)
			}
			if n >= 2 {
				renewed++
			}
		}
		if renewed == agents {
			break
		}
		// Agents are certified within minutes and renew before their
		// certificates expire (checked above), so all have renewed well
		// within two lifetimes; this only bounds a broken run.
		if now.Sub(t0) > 2*ttl {
			t.Fatalf("after %s, %d agents hold a certificate and %d renewed theirs", now.Sub(t0), holding, renewed)
		}
		next, ok := clk.NextDeadline()
		if !ok {
			t.Fatal("no timer pending")
		}
		// Move to the next deadline, rounded up to whole steps of fake
		// time, so that timers due within one step fire together.
		if r := next.Truncate(step); r.Before(next) {
			next = r.Add(step)
		}
		if !next.After(now) {
			next = now.Add(step)
		}
		for _, a := range all { // nothing may expire before the next step
			a.mu.Lock()
			if n := len(a.served); n > 0 && !a.served[n-1].notAfter.After(next) {
				t.Fatalf("a certificate expires at %s, before its agent's next chance to renew at %s", a.served[n-1].notAfter.Sub(t0), next.Sub(t0))
			}
			a.mu.Unlock()
		}
		clk.Set(next)
		steps++
	}

	// Every certificate was replaced while still valid.
	var lastFirst, firstRenewal, lastRenewal time.Duration
	firstRenewal = ttl
	certsServed, limited, limitedRe, renewedLimited := 0, 0, 0, 0
	for i, a := range all {
		a.mu.Lock()
		limited += a.limited
		limitedRe += a.limitedRe
		if a.limitedRe > 0 {
			renewedLimited++
		}
		for k := 1; k < len(a.served); k++ {
			prev, cur := a.served[k-1], a.served[k]
			if !cur.at.Before(prev.notAfter) || cur.version == prev.version {
				t.Errorf("agent %d: certificate %d served at %s, its predecessor expired at %s", i, k, cur.at.Sub(t0), prev.notAfter.Sub(t0))
			}
		}
		certsServed += len(a.served)
		lastFirst = max(lastFirst, a.served[0].at.Sub(t0))
		firstRenewal = min(firstRenewal, a.served[1].at.Sub(t0))
		lastRenewal = max(lastRenewal, a.served[1].at.Sub(t0))
		a.mu.Unlock()
	}
	ok, exhausted := s.requests(t, "OK"), s.requests(t, "ResourceExhausted")
	t.Logf("%d agents (%d identities, limit %v/s burst %d each, certificates for %s): all certified by %s, renewals from %s to %s after start, %d steps; the CA signed %v and answered ResourceExhausted %v times: %d to first requests, %d to renewals (of %d agents, which backed off and renewed in time)",
		agents, deployments, rate, burst, ttl, lastFirst, firstRenewal, lastRenewal, steps, ok, exhausted, limited, limitedRe, renewedLimited)
	if limited == 0 || limitedRe == 0 || float64(limited+limitedRe) != exhausted {
		t.Errorf("ResourceExhausted answers: %d to first requests and %d to renewals, CA counted %v; want both phases limited", limited, limitedRe, exhausted)
	}
	if ok != float64(certsServed) {
		t.Errorf("the CA signed %v certificates, the agents served %d", ok, certsServed)
	}
	for _, code := range []string{"Internal", "Unavailable", "Unauthenticated", "InvalidArgument", "PermissionDenied", "DeadlineExceeded", "Canceled"} {
		if n := s.requests(t, code); n != 0 {
			t.Errorf("the CA answered %s %v times", code, n)
		}
	}
	// A per-identity limit of rate/s with a burst of burst signs at most
	// burst + rate*elapsed certificates per deployment.
	elapsed := clk.Now().Sub(t0).Seconds()
	if max := deployments * (burst + rate*elapsed); ok > max {
		t.Errorf("the CA signed %v certificates in %.0fs, above the limit's %v", ok, elapsed, max)
	}
}
