package caserver_test

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// upstreamWorld is the assembled CA with a real upstream (cfssl serve or
// step-ca) whose root is root, on a fake clock that starts at the real
// time (the upstream signs on the real clock).
type upstreamWorld struct {
	up   *testkit.CFSSL // nil with another upstream
	root *x509.Certificate
	dir  string
	td   spiffeid.TrustDomain
	iss  *devissuer.Issuer
	fake *clock.Fake
	logs *testkit.LogRecorder
	reg  *prometheus.Registry
	s    *caserver.Server
}

func newUpstreamWorld(t *testing.T) *upstreamWorld {
	t.Helper()
	up := testkit.StartCFSSL(t, 2*time.Hour)
	w := newUpstreamWorldWith(t, up.Root, "cfssl+https://"+up.Addr+"?profile="+testkit.CFSSLProfileCA+"&ca="+up.TLSCAFile, up.KeyFile, 2*time.Hour)
	w.up = up
	return w
}

// newUpstreamWorldWith assembles the CA with the upstream of rawURL,
// whose root is root, asking for intermediates of lifetime renewed at a
// quarter of their life.
func newUpstreamWorldWith(t *testing.T, root *x509.Certificate, rawURL, credentials string, lifetime time.Duration) *upstreamWorld {
	t.Helper()
	w := &upstreamWorld{
		root: root,
		dir:  t.TempDir(),
		td:   spiffeid.RequireTrustDomainFromString("example.org"),
		fake: clock.NewFake(time.Now()),
		logs: testkit.NewLogRecorder(),
		reg:  prometheus.NewRegistry(),
	}
	var err error
	if w.iss, err = devissuer.LoadOrCreate(w.dir, "https://meshid.dev.local"); err != nil {
		t.Fatal(err)
	}
	u, err := upstream.ParseURL(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	w.s = testkit.CA(t, caserver.Config{
		TrustDomain: w.td,
		StateDir:    w.dir,
		Authn: caserver.AuthnConfig{
			JWTIssuer: w.iss.Issuer(),
			JWKSFile:  filepath.Join(w.dir, devissuer.JWKSFile),
		},
		// cfssl's profile gives 2h; renewed at a quarter of the life.
		Upstream:   caserver.UpstreamConfig{URL: u, CredentialsFile: credentials, Lifetime: lifetime, RenewAt: 0.25},
		Clock:      w.fake,
		Logger:     w.logs.Logger(),
		Registerer: w.reg,
	})
	return w
}

// leaf runs a real agent for ns/sa and returns the certificate chain it
// serves, checked to chain to the upstream's root.
func (w *upstreamWorld) leaf(t *testing.T, sa string) []*x509.Certificate {
	t.Helper()
	tok, err := w.iss.Mint("ns1", sa, []string{"istio-ca"}, 24*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(w.dir, "token-"+sa)
	if err := os.WriteFile(tokenFile, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	a := testkit.RunAgent(t, agent.Config{
		CAAddr: w.s.Addr().String(), CARootFile: filepath.Join(w.dir, "root-cert.pem"),
		TokenFile: tokenFile, TrustDomain: w.td, Clock: w.fake,
	})
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	sec, err := a.Manager().Secret(ctx, secretcache.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	id, err := certs.VerifySVID(sec.Chain, w.td, []*x509.Certificate{w.root}, w.fake.Now())
	if err != nil || id.Path() != "/ns/ns1/sa/"+sa {
		t.Fatalf("the agent's certificate does not chain to the upstream root as %s: %v", sa, err)
	}
	return sec.Chain
}

// sign has the running authority sign a leaf for ns1/sa (the agent's TLS
// to the CA verifies on the real clock, which the fake one has left
// behind) and checks that it chains to the cfssl root and does not
// outlive the intermediate that signed it.
func (w *upstreamWorld) sign(t *testing.T, sa string) []*x509.Certificate {
	t.Helper()
	id := spiffeid.RequireFromPath(w.td, "/ns/ns1/sa/"+sa)
	csr, err := ca.VerifyCSR(testkit.CSR(t, testkit.Key(t, certs.ECP256), id))
	if err != nil {
		t.Fatal(err)
	}
	iss, err := w.s.Authority().Sign(context.Background(), ca.Request{CSR: csr, ID: id, Caller: "test"})
	if err != nil {
		t.Fatalf("the CA does not sign: %v", err)
	}
	chain := append([]*x509.Certificate{iss.Leaf}, iss.Chain...)
	if _, err := certs.VerifySVID(chain, w.td, []*x509.Certificate{w.root}, w.fake.Now()); err != nil {
		t.Fatalf("the leaf does not chain to the upstream root: %v", err)
	}
	if iss.Leaf.NotAfter.After(iss.Chain[0].NotAfter) {
		t.Fatalf("the leaf (until %v) outlives its intermediate (until %v)", iss.Leaf.NotAfter, iss.Chain[0].NotAfter)
	}
	return chain
}

// advanceUntil moves the fake clock by step until cond holds: a timer set
// after the previous move (a loop that re-arms) is caught by the next.
func advanceUntil(t *testing.T, w *upstreamWorld, step time.Duration, what string, cond func() bool) {
	t.Helper()
	for range 40 {
		if cond() {
			return
		}
		w.fake.Add(step)
		select {
		case <-time.After(250 * time.Millisecond): // real time for the woken loop to act; not a timed assertion
		case <-w.s.Rotation().Changed():
		}
	}
	if !cond() {
		t.Fatalf("%s: not within 40 steps of %v; logs:\n%s", what, step, w.logs.All())
	}
}

// TestUpstreamCFSSL (issue 32): a CA with no intermediate mints one from
// the real cfssl serve, signs leaves chaining to the cfssl root that an
// agent serves; at the renewal point a new intermediate with a new key
// signs; with cfssl stopped the CA keeps signing and the failure metric
// moves; when cfssl returns the renewal succeeds.
func TestUpstreamCFSSL(t *testing.T) {
	w := newUpstreamWorld(t)
	start := w.fake.Now()
	first := w.s.Authority().Bundle()
	if len(first.Roots) != 1 || !first.Roots[0].Equal(w.up.Root) || first.Cert.CheckSignatureFrom(w.up.Root) != nil {
		t.Fatal("the CA does not sign with an intermediate of the cfssl root, trusting that root only")
	}
	if got := testkit.ReadCerts(t, filepath.Join(w.dir, "root-cert.pem")); len(got) != 1 || !got[0].Equal(w.up.Root) {
		t.Fatal("root-cert.pem is not the cfssl root")
	}
	if p := testkit.FilePerm(t, filepath.Join(w.dir, "upstream", keystore.CAKeyFile)); p != 0o600 {
		t.Fatalf("intermediate key mode %#o", p)
	}
	if chain := w.leaf(t, "a"); !chain[1].Equal(first.Cert) {
		t.Fatal("the leaf is not signed by the minted intermediate")
	}
	if left := testkit.Metric(t, w.reg, "meshid_ca_upstream_intermediate_remaining_seconds"); left < 3600 {
		t.Fatalf("remaining seconds %v", left)
	}

	// The renewal point: a quarter of the life from the mint (the fake
	// clock has not moved since). Then small steps, should the renewer
	// not have armed its timer yet.
	w.fake.Set(start.Add((first.Cert.NotAfter.Sub(start)) / 4))
	advanceUntil(t, w, time.Minute, "first renewal", func() bool {
		return !w.s.Authority().Bundle().Cert.Equal(first.Cert)
	})
	second := w.s.Authority().Bundle()
	// Through the rotation (same root: switched at once), never to the
	// authority directly.
	if n := testkit.Metric(t, w.reg, "meshid_ca_rotation_steps_total", "step", "switched"); n != 1 {
		t.Fatalf("rotation switched %v times, want 1", n)
	}
	if certs.KeyMatches(first.Cert.PublicKey, second.Key) || !second.Roots[0].Equal(w.up.Root) || len(second.Roots) != 1 {
		t.Fatal("the renewed intermediate kept the key, or the bundle changed")
	}
	if chain := w.sign(t, "b"); !chain[1].Equal(second.Cert) {
		t.Fatal("leaves are not signed by the renewed intermediate")
	}

	w.up.Stop()
	advanceUntil(t, w, 5*time.Minute, "a failed renewal", func() bool {
		return w.logs.CountContaining("did not renew") > 0
	})
	if ts := testkit.Metric(t, w.reg, "meshid_ca_upstream_last_mint_failure_timestamp_seconds"); ts <= float64(time.Now().Unix()) {
		t.Fatalf("last failure timestamp %v, want the fake clock's time of the failure", ts)
	}
	if !w.s.Authority().Bundle().Cert.Equal(second.Cert) {
		t.Fatal("the intermediate changed while the upstream was down")
	}
	if chain := w.sign(t, "c"); !chain[1].Equal(second.Cert) {
		t.Fatal("the CA did not keep signing with the current intermediate")
	}
	if !strings.Contains(w.logs.All(), "the current one keeps signing") {
		t.Fatal("no clear log line")
	}

	w.up.Start(t)
	advanceUntil(t, w, time.Minute, "renewal once cfssl is back", func() bool {
		return w.logs.CountContaining("new intermediate minted") == 2
	})
	if w.s.Authority().Bundle().Cert.Equal(second.Cert) {
		t.Fatal("the renewal after the outage did not reach the authority")
	}
	if n := testkit.Metric(t, w.reg, "meshid_ca_upstream_consecutive_failures"); n != 0 {
		t.Fatalf("consecutive failures %v after a success", n)
	}
}

// TestUpstreamRestartAndNoFallback: a restarted CA signs with the saved
// intermediate without asking the upstream (it is down); a CA with no
// intermediate and the upstream down does not start, and never makes a
// self-signed root; --upstream excludes --ca-dir.
func TestUpstreamRestartAndNoFallback(t *testing.T) {
	up := testkit.StartCFSSL(t, 2*time.Hour)
	u, err := upstream.ParseURL("cfssl+https://" + up.Addr + "?profile=" + testkit.CFSSLProfileCA + "&ca=" + up.TLSCAFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := caserver.Config{StateDir: dir, Listen: "127.0.0.1:0", Upstream: caserver.UpstreamConfig{URL: u, CredentialsFile: up.KeyFile, Lifetime: 2 * time.Hour}}
	s1, err := caserver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	minted := s1.Authority().Bundle().Cert
	up.Stop()
	s2, err := caserver.New(cfg)
	if err != nil {
		t.Fatalf("restart with a saved intermediate and the upstream down: %v", err)
	}
	if !s2.Authority().Bundle().Cert.Equal(minted) {
		t.Fatal("the restarted CA does not sign with the saved intermediate")
	}

	empty := t.TempDir()
	cfg.StateDir = empty
	if _, err := caserver.New(cfg); err == nil || !strings.Contains(err.Error(), "did not mint") {
		t.Fatalf("no intermediate and the upstream down: %v", err)
	}
	if _, err := os.Stat(filepath.Join(empty, keystore.CACertFile)); !os.IsNotExist(err) {
		t.Fatalf("a self-signed CA was made: %v", err)
	}
	cfg.CADir = dir
	if _, err := caserver.New(cfg); err == nil || !strings.Contains(err.Error(), "excludes") {
		t.Fatalf("--upstream with --ca-dir: %v", err)
	}
}

// TestUpstreamRootChangeBetweenMints (issue 32, "report upstream root
// changes"): cfssl's root changes long before the renewal point. At the
// next root check the CA mints under the new root at once and the rotation
// prepares it: root-cert.pem holds both roots while the old intermediate
// still signs, and the new one signs from the activation on. A check that
// finds the same roots again mints nothing.
func TestUpstreamRootChangeBetweenMints(t *testing.T) {
	w := newUpstreamWorld(t)
	start := w.fake.Now()
	first := w.s.Authority().Bundle()
	st, _ := w.s.UpstreamStatus()
	check := start.Add(upstream.DefaultRootCheck)
	if !check.Before(st.RenewAt) {
		t.Fatalf("the root check (%v) is not before the renewal point (%v): the test would prove nothing", check, st.RenewAt)
	}
	mints := func() float64 {
		v, _ := testkit.LookupMetric(t, w.reg, "meshid_ca_upstream_mints_total", "result", "ok")
		return v
	}
	oldRoot := w.up.Root
	w.up.NewRoot(t)
	newRoot := w.up.Root

	testkit.Until(t, "the root check's timer", func() bool { return slices.ContainsFunc(w.fake.Deadlines(), check.Equal) })
	w.fake.Set(check)
	testkit.Until(t, "the new root's intermediate prepared and saved", func() bool {
		return w.s.Rotation().Status().Prepared != nil && w.logs.CountContaining("new intermediate minted by the upstream") == 1
	})
	if n := mints(); n != 2 {
		t.Fatalf("%v mints, want 2 (at the start, then at the root change)", n)
	}
	if n := testkit.Metric(t, w.reg, "meshid_ca_upstream_root_checks_total", "result", "changed"); n != 1 {
		t.Fatalf("root checks that found a change: %v, want 1", n)
	}
	rs := w.s.Rotation().Status()
	if rs.Prepared.CheckSignatureFrom(newRoot) != nil {
		t.Fatal("the prepared intermediate is not signed by the new root")
	}
	if !w.s.Authority().Bundle().Cert.Equal(first.Cert) {
		t.Fatal("the new intermediate signs before its root was published")
	}
	testkit.Until(t, "both roots in root-cert.pem", func() bool {
		got := testkit.ReadCerts(t, filepath.Join(w.dir, "root-cert.pem"))
		return len(got) == 2 && slices.ContainsFunc(got, oldRoot.Equal) && slices.ContainsFunc(got, newRoot.Equal)
	})

	next := check.Add(upstream.DefaultRootCheck)
	testkit.Until(t, "the next root check's timer", func() bool { return slices.ContainsFunc(w.fake.Deadlines(), next.Equal) })
	w.fake.Set(next)
	advanceUntil(t, w, time.Second, "the next root check", func() bool {
		v, _ := testkit.LookupMetric(t, w.reg, "meshid_ca_upstream_root_checks_total", "result", "unchanged")
		return v >= 1
	})
	if n := mints(); n != 2 {
		t.Fatalf("%v mints after a check that found the same roots, want 2", n)
	}

	if w.fake.Now().Before(rs.ActivateAt) {
		testkit.Until(t, "the activation timer", func() bool { return slices.ContainsFunc(w.fake.Deadlines(), rs.ActivateAt.Equal) })
		w.fake.Set(rs.ActivateAt)
	}
	testkit.Until(t, "the activation", func() bool { return w.s.Authority().Bundle().Cert.Equal(rs.Prepared) })
	w.root = newRoot
	w.sign(t, "after-root-change")
}
