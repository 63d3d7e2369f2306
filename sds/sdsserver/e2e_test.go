package sdsserver_test

import (
	"context"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/caclient"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// caStack is the real thing behind the agent: a CA server (ca.Authority,
// offline JWT authentication with a dev issuer, TLS gRPC on 127.0.0.1)
// and a secretcache.Manager signing through caclient with a token file.
type caStack struct {
	authority *ca.Authority
	bundles   []*keystore.Bundle // bundles[0] is in use first; rootChange moves on
	next      int
	reg       *prometheus.Registry // the CA's metrics
	csrs      atomic.Int64         // Sign calls made by the Managers
	client    *caclient.Client
	m         *secretcache.Manager
}

// countingSigner counts the CSRs the Manager sends.
type countingSigner struct {
	s *caStack
	c *caclient.Client
}

func (c countingSigner) Sign(ctx context.Context, csr *x509.CertificateRequest, ttl time.Duration) ([]*x509.Certificate, []*x509.Certificate, error) {
	c.s.csrs.Add(1)
	return c.c.Sign(ctx, csr, ttl)
}

func newCAStack(t testing.TB) *caStack {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	s := &caStack{reg: prometheus.NewRegistry()}
	var allRoots []*x509.Certificate
	for range 3 {
		b, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: testTD.Name(), KeyType: certs.ECP256})
		if err != nil {
			t.Fatal(err)
		}
		s.bundles = append(s.bundles, b)
		allRoots = append(allRoots, b.Roots...)
	}
	var err error
	s.authority, err = ca.New(ca.Config{TrustDomain: testTD, Bundle: s.bundles[0], Logger: quiet, Registerer: s.reg})
	if err != nil {
		t.Fatal(err)
	}
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	issuer, err := devissuer.New(key, "")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := testkit.ServeCA(t, certservice.Config{Authority: s.authority, Authenticator: authn.NewChain(testkit.DevJWT(t, issuer)), Registerer: s.reg})

	tok, err := issuer.Mint("default", "default", []string{"istio-ca"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "istio-token")
	if err := certs.WriteFileAtomic(tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	// The client trusts every root the test will move the CA to, so that
	// it keeps verifying the CA's serving certificate after a root change.
	client, err := caclient.New(caclient.Config{Addr: addr, Roots: allRoots, TokenFile: tokenFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })

	s.client = client
	m, stop := s.newManager(t, nil)
	t.Cleanup(stop)
	s.m = m
	return s
}

// newManager runs another Manager signing through the stack's CA client,
// until stop is called.
func (s *caStack) newManager(t testing.TB, clk clock.Clock) (*secretcache.Manager, func()) {
	t.Helper()
	m, err := secretcache.New(secretcache.Config{Signer: countingSigner{s: s, c: s.client}, ID: testID, TTL: time.Hour, Clock: clk, FileSecretDirs: []string{os.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	return m, testkit.Start(t, "Manager", m.Run)
}

func (s *caStack) roots() []*x509.Certificate { return s.authority.Bundle().Roots }

// rootChange moves the CA to its next root and rotates, so that the Manager
// learns the new roots.
func (s *caStack) rootChange(t *testing.T) {
	t.Helper()
	s.next++
	if err := s.authority.SetBundle(s.bundles[s.next]); err != nil {
		t.Fatal(err)
	}
	if err := s.m.Rotate(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// caServerEnv runs the protocol tests end to end: SDS server, Manager,
// caclient and the real CA server.
func caServerEnv(t *testing.T) *env {
	s := newCAStack(t)
	dir := t.TempDir()
	n := 0
	return &env{
		name:  "ca-server",
		src:   s.m,
		roots: s.roots,
		rotate: func(t *testing.T) {
			if err := s.m.Rotate(context.Background()); err != nil {
				t.Fatal(err)
			}
		},
		rootChange: s.rootChange,
		later: func(t *testing.T) (string, func()) {
			n++
			path := filepath.Join(dir, "later-"+string(rune('a'+n))+".pem")
			return secretcache.FileRootPrefix + path, func() {
				if err := certs.WriteFileAtomic(path, certs.EncodeCertificates(s.roots()...), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		},
		watchers: s.m.Watchers,
	}
}

// With a fake clock driving the agent, the Manager renews at the grace
// point and the new certificate reaches the stream before the old one
// expires. End to end through the CA server.
func TestRotationPushArrivesBeforeExpiry(t *testing.T) {
	cas := newCAStack(t)
	clk := clock.NewFake(time.Now())
	m, stop := cas.newManager(t, clk)
	t.Cleanup(stop)
	h := start(t, m, withClock(clk))

	c := newSotw(t, h.client, nil)
	c.request(dflt, root)
	got := c.recvNamed(dflt, root)
	chain, key := tlsCert(t, got[dflt])
	verifySVID(t, chain, key, trustedCA(t, got[root]))
	old := chain[0]
	c.ack()

	// The scheduler parks on its renewal timer.
	renew := testkit.NextDeadline(t, clk, "the Manager's renewal timer")
	life := old.NotAfter.Sub(old.NotBefore)
	lo, hi := old.NotBefore.Add(life*49/100), old.NotBefore.Add(life*51/100)
	if renew.Before(lo) || renew.After(hi) {
		t.Fatalf("renewal at %v, want within [%v, %v] (grace 0.5 ± 1%%)", renew, lo, hi)
	}
	clk.Set(renew)
	s := c.recvSecret()
	next, nkey := tlsCert(t, s)
	if s.GetName() != dflt || serial(next[0]) == serial(old) {
		t.Fatalf("got %q, want a new default", s.GetName())
	}
	if !clk.Now().Before(old.NotAfter) {
		t.Fatal("the new certificate arrived after the old one expired")
	}
	verifySVID(t, next, nkey, cas.roots())
}
