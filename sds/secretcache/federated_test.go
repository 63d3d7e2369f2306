package secretcache_test

import (
	"context"
	"crypto/x509"
	"errors"
	"sync"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// fedSource is the CA's FetchFederatedBundles, answering what is set.
type fedSource struct {
	mu     sync.Mutex
	answer map[string][]byte
	err    error
}

func (s *fedSource) FetchFederatedBundles(context.Context) (map[string][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.answer, s.err
}

func (s *fedSource) set(answer map[string][]byte, err error) {
	s.mu.Lock()
	s.answer, s.err = answer, err
	s.mu.Unlock()
}

func spiffeBundle(t *testing.T, td spiffeid.TrustDomain, roots ...*x509.Certificate) []byte {
	t.Helper()
	data, err := spiffebundle.FromX509Authorities(td, roots).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// ROOTCA_FEDERATED holds the mesh's roots and each federated trust
// domain's, separately; a change the CA hands out is pushed at the next
// poll (DefaultFederationRefresh, under the 30 s); a bad answer
// (the mesh's own trust domain, garbage, a failure) keeps the current
// bundles; a CA without the method is logged once.
func TestFederatedRoots(t *testing.T) {
	tdB := spiffeid.RequireTrustDomainFromString("b.example")
	rootB1, rootB2 := newTestCA(t, nil).currentRoot(), newTestCA(t, nil).currentRoot()
	src := &fedSource{answer: map[string][]byte{tdB.IDString(): spiffeBundle(t, tdB, rootB1)}}
	f := newFixture(t, func(c *secretcache.Config) { c.Federation = src })
	f.run(t)
	fed := watch(t, f.m, secretcache.FederatedRootName)
	f.logs.WaitFor(t, "federated bundles updated", 1)
	s := mustSecret(t, f.m, secretcache.FederatedRootName)
	own := mustSecret(t, f.m, secretcache.RootName)
	if s.TrustDomain != testTD || len(s.Roots) != 1 || !s.Roots[0].Equal(own.Roots[0]) {
		t.Fatalf("ROOTCA_FEDERATED's own roots: %s %d", s.TrustDomain, len(s.Roots))
	}
	if len(s.Federated) != 1 || len(s.Federated[tdB]) != 1 || !s.Federated[tdB][0].Equal(rootB1) {
		t.Fatalf("federated: %v", s.Federated)
	}
	receive(t, fed, "the first ROOTCA_FEDERATED")

	// B rotates: the next poll pushes both of its roots.
	src.set(map[string][]byte{tdB.IDString(): spiffeBundle(t, tdB, rootB1, rootB2)}, nil)
	testkit.WaitForTimers(t, f.clock, 2, "the renewal and the federation poll")
	f.clock.Add(secretcache.DefaultFederationRefresh)
	got := receive(t, fed, "B's new root")
	if len(got.Federated[tdB]) != 2 || got.Version == s.Version {
		t.Fatalf("after B's rotation: %d roots of B, version %s (was %s)", len(got.Federated[tdB]), got.Version, s.Version)
	}

	for i, bad := range []struct {
		answer map[string][]byte
		err    error
		log    string
	}{
		{map[string][]byte{testTD.IDString(): spiffeBundle(t, testTD, rootB1)}, nil, "federated bundles refused"},
		{map[string][]byte{tdB.IDString(): []byte("<html>")}, nil, "federated bundles refused"},
		{map[string][]byte{"not a trust domain": spiffeBundle(t, tdB, rootB1)}, nil, "federated bundles refused"},
		{nil, errors.New("the CA is down"), "federated bundles: the CA's answer failed"},
	} {
		before := f.logs.Count(bad.log)
		src.set(bad.answer, bad.err)
		testkit.WaitForTimers(t, f.clock, 2, "the renewal and the federation poll")
		f.clock.Add(secretcache.DefaultFederationRefresh)
		f.logs.WaitFor(t, bad.log, before+1)
		if cur := mustSecret(t, f.m, secretcache.FederatedRootName); cur != got {
			t.Fatalf("bad answer %d replaced ROOTCA_FEDERATED", i)
		}
	}
	// A CA without the method is logged once, and the poll stops: no
	// timer of its own is left on the clock, only the renewal's.
	src.set(nil, status.Error(codes.Unimplemented, "unknown service meshid.v1.FederationService"))
	testkit.WaitForTimers(t, f.clock, 2, "the renewal and the federation poll")
	f.clock.Add(secretcache.DefaultFederationRefresh)
	f.logs.WaitFor(t, "the CA does not serve federated bundles", 1)
	testkit.WaitForTimers(t, f.clock, 1, "the renewal")
	if n := f.clock.Waiters(); n != 1 {
		t.Fatalf("%d timers on the clock after the CA said it serves no federated bundles, want the renewal's only", n)
	}
	if n := f.logs.Count("the CA does not serve federated bundles"); n != 1 {
		t.Fatalf("an older CA logged %d times, want once", n)
	}
	select {
	case s := <-fed:
		t.Fatalf("a push without a change: %s", s.Version)
	default:
	}
}

// A CA that federates with nobody costs no poll: the agent keeps no timer
// of its own for it, and asks again when it obtains a certificate, so a CA
// restarted with peers is followed from the agent's next renewal.
func TestFederationIdleUntilRenewal(t *testing.T) {
	tdB := spiffeid.RequireTrustDomainFromString("b.example")
	src := &fedSource{answer: map[string][]byte{}}
	f := newFixture(t, func(c *secretcache.Config) { c.Federation = src })
	f.run(t)
	mustSecret(t, f.m, secretcache.DefaultName) // the first certificate
	at := testkit.NextDeadline(t, f.clock, "the renewal")
	if n := f.clock.Waiters(); n != 1 {
		t.Fatalf("%d timers on the clock with no federation, want the renewal's only", n)
	}
	rootB := newTestCA(t, nil).currentRoot()
	src.set(map[string][]byte{tdB.IDString(): spiffeBundle(t, tdB, rootB)}, nil)
	f.clock.Set(at)
	f.logs.WaitFor(t, "federated bundles updated", 1)
	if s := mustSecret(t, f.m, secretcache.FederatedRootName); len(s.Federated[tdB]) != 1 || !s.Federated[tdB][0].Equal(rootB) {
		t.Fatalf("after the renewal: federated %v", s.Federated)
	}
}
