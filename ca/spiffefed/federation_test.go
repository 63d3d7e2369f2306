package spiffefed_test

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/spiffefed"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

var (
	tdA = spiffeid.RequireTrustDomainFromString("a.example")
	tdB = spiffeid.RequireTrustDomainFromString("b.example")
	tdC = spiffeid.RequireTrustDomainFromString("c.example")
)

// keys is a mutable spiffefed.Source.
type keys struct {
	mu    sync.Mutex
	roots []*x509.Certificate
	jwks  []byte
}

func (k *keys) source() ([]*x509.Certificate, []byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.roots, k.jwks, nil
}

func (k *keys) set(roots []*x509.Certificate) {
	k.mu.Lock()
	k.roots = roots
	k.mu.Unlock()
}

// startEndpoint serves td's bundle with src (https_spiffe, an SVID of
// authority) and returns its URL.
func startEndpoint(t *testing.T, td spiffeid.TrustDomain, authority *ca.Authority, src spiffefed.Source, clk clock.Clock, reg prometheus.Registerer) string {
	t.Helper()
	e, err := spiffefed.NewEndpoint(spiffefed.EndpointConfig{
		Listen: "127.0.0.1:0", TrustDomain: td, Source: src, Clock: clk, Registerer: reg,
		Authority: func() *ca.Authority { return authority },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Listen(); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "bundle endpoint", e.Run)
	return "https://" + e.Addr().String() + "/"
}

func writePEM(t *testing.T, cs ...*x509.Certificate) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "roots.pem")
	if err := os.WriteFile(p, certs.EncodeCertificates(cs...), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The endpoint serves what go-spiffe's own client reads: the CA's roots,
// the JWT keys, the refresh hint, and a sequence that grows on a change;
// GET only, and a caller over its rate is refused.
func TestEndpointServesTheBundle(t *testing.T) {
	clk := clock.NewFake(time.Now())
	authority := testkit.NewAuthority(t, tdA, clk, nil)
	jwks := `{"keys":[{"kty":"EC","crv":"P-256","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0","kid":"k1","use":"jwt-svid"}]}`
	src := &keys{roots: authority.Bundle().Roots, jwks: []byte(jwks)}
	reg := prometheus.NewRegistry()
	url := startEndpoint(t, tdA, authority, src.source, clk, reg)
	boot := spiffebundle.FromX509Authorities(tdA, authority.Bundle().Roots)

	b, err := federation.FetchBundle(t.Context(), tdA, url, federation.WithSPIFFEAuth(boot, spiffefed.EndpointID(tdA)))
	if err != nil {
		t.Fatal(err)
	}
	if !b.HasX509Authority(authority.Bundle().Roots[0]) || len(b.X509Authorities()) != 1 || !b.HasJWTAuthority("k1") {
		t.Fatalf("bundle: %d roots, JWT keys %v", len(b.X509Authorities()), b.JWTAuthorities())
	}
	if hint, ok := b.RefreshHint(); !ok || hint != spiffefed.DefaultRefreshHint {
		t.Fatalf("refresh hint %v %v", hint, ok)
	}
	seq1, ok := b.SequenceNumber()
	if !ok || seq1 == 0 {
		t.Fatal("no sequence number")
	}
	// Same content: same sequence.
	b, err = federation.FetchBundle(t.Context(), tdA, url, federation.WithSPIFFEAuth(boot, spiffefed.EndpointID(tdA)))
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := b.SequenceNumber(); s != seq1 {
		t.Fatalf("sequence moved without a change: %d then %d", seq1, s)
	}
	// A rotation adds a root: the union is served, with a higher sequence.
	other := testkit.NewAuthority(t, tdA, clk, nil)
	src.set(append(authority.Bundle().Roots, other.Bundle().Roots...))
	b, err = federation.FetchBundle(t.Context(), tdA, url, federation.WithSPIFFEAuth(boot, spiffefed.EndpointID(tdA)))
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := b.SequenceNumber(); s <= seq1 || len(b.X509Authorities()) != 2 {
		t.Fatalf("after a change: sequence %d (was %d), %d roots", s, seq1, len(b.X509Authorities()))
	}
	// GET only.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsconfig.TLSClientConfig(boot, tlsconfig.AuthorizeID(spiffefed.EndpointID(tdA)))}}
	resp, err := client.Post(url, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", resp.StatusCode)
	}
	// A caller that never stops is refused once its burst is spent.
	limited := 0
	for range spiffefed.DefaultEndpointBurst + 5 {
		resp, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			limited++
		}
	}
	if limited == 0 {
		t.Fatal("no request refused beyond the burst")
	}
	if n := testkit.Metric(t, reg, "meshid_federation_endpoint_requests_total", "code", "429"); n != float64(limited) {
		t.Fatalf("429 counted %v times, seen %d", n, limited)
	}
}

// A federator follows a peer's endpoint from a bootstrap file, refreshes at
// the hint, persists the bundle, and a new federator starts from it.
func TestFederatorFollowsAndPersists(t *testing.T) {
	clk := clock.NewFake(time.Now())
	authB := testkit.NewAuthority(t, tdB, clk, nil)
	src := &keys{roots: authB.Bundle().Roots}
	url := startEndpoint(t, tdB, authB, src.source, clk, nil)
	state := t.TempDir()
	peer := spiffefed.Peer{TrustDomain: tdB, URL: url, Profile: spiffefed.ProfileSPIFFE, EndpointID: spiffefed.EndpointID(tdB), BundleFile: writePEM(t, authB.Bundle().Roots...)}
	f, err := spiffefed.New(spiffefed.Config{TrustDomain: tdA, Peers: []spiffefed.Peer{peer}, StateDir: state, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	changed := f.Changed()
	testkit.Run(t, "federator", f.Run)
	waitChange(t, changed)
	b := f.Snapshot().Bundles[tdB]
	seq1, _ := b.SequenceNumber()
	if seq1 == 0 || !b.HasX509Authority(authB.Bundle().Roots[0]) {
		t.Fatalf("first fetch: %v", f.Status())
	}
	if d := testkit.NextDeadline(t, clk, "the refresh").Sub(clk.Now()); d != spiffefed.DefaultRefreshHint {
		t.Fatalf("next refresh in %v, want the hint %v", d, spiffefed.DefaultRefreshHint)
	}
	other := testkit.NewAuthority(t, tdB, clk, nil)
	src.set(append(authB.Bundle().Roots, other.Bundle().Roots...))
	changed = f.Changed()
	clk.Add(spiffefed.DefaultRefreshHint)
	waitChange(t, changed)
	b = f.Snapshot().Bundles[tdB]
	if s, _ := b.SequenceNumber(); s <= seq1 || len(b.X509Authorities()) != 2 {
		t.Fatalf("after the change: %v", f.Status())
	}
	// A restart without the bootstrap file starts from the kept bundle.
	peer.BundleFile = ""
	g, err := spiffefed.New(spiffefed.Config{TrustDomain: tdA, Peers: []spiffefed.Peer{peer}, StateDir: state, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if kept := g.Snapshot().Bundles[tdB]; kept == nil || !kept.Equal(b) {
		t.Fatal("the persisted bundle was not loaded")
	}
}

func waitChange(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(testkit.Guard):
		t.Fatal("no bundle change")
	}
}

// badServer serves a bundle of tdB over https_web in the mode set.
type badServer struct {
	mu   sync.Mutex
	mode string
	good []byte
	low  []byte
}

func (s *badServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	mode := s.mode
	s.mu.Unlock()
	switch mode {
	case "good":
		w.Write(s.good)
	case "garbage":
		w.Write([]byte("<html>not a bundle</html>"))
	case "huge":
		chunk := make([]byte, 1<<20)
		for range 100 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	case "lower sequence":
		w.Write(s.low)
	case "redirect":
		http.Redirect(w, r, "https://elsewhere.example/", http.StatusFound)
	case "slow drip":
		w.Write([]byte("{"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	case "status":
		http.Error(w, "down", http.StatusServiceUnavailable)
	}
}

func (s *badServer) set(mode string) {
	s.mu.Lock()
	s.mode = mode
	s.mu.Unlock()
}

func bundleJSON(t *testing.T, td spiffeid.TrustDomain, roots []*x509.Certificate, seq uint64) []byte {
	t.Helper()
	b := spiffebundle.FromX509Authorities(td, roots)
	b.SetSequenceNumber(seq)
	b.SetRefreshHint(time.Minute)
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Every bad answer of an endpoint is refused with its reason, logged and
// counted, and the last good bundle stays.
func TestFederatorRefusesBadBundles(t *testing.T) {
	clk := clock.NewFake(time.Now())
	authB := testkit.NewAuthority(t, tdB, clk, nil)
	srv := &badServer{mode: "good", good: bundleJSON(t, tdB, authB.Bundle().Roots, 10), low: bundleJSON(t, tdB, authB.Bundle().Roots, 9)}
	hs := httptest.NewTLSServer(srv)
	t.Cleanup(hs.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hs.Certificate().Raw}), 0o600)

	logs := testkit.NewLogRecorder()
	reg := prometheus.NewRegistry()
	peer := spiffefed.Peer{TrustDomain: tdB, URL: hs.URL + "/", Profile: spiffefed.ProfileWeb, CAFile: caFile}
	f, err := spiffefed.New(spiffefed.Config{TrustDomain: tdA, Peers: []spiffefed.Peer{peer}, Clock: clk, Logger: logs.Logger(), Registerer: reg, FetchTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	f.RefreshOnce(t.Context(), tdB)
	good := f.Snapshot().Bundles[tdB]
	if good == nil {
		t.Fatalf("the good bundle was not taken: %v", f.Status())
	}
	for mode, reason := range map[string]string{
		"garbage": spiffefed.ReasonParse, "huge": spiffefed.ReasonTooLarge, "lower sequence": spiffefed.ReasonSequence,
		"redirect": spiffefed.ReasonRedirect, "slow drip": spiffefed.ReasonFetch, "status": spiffefed.ReasonStatus,
	} {
		srv.set(mode)
		before, _ := testkit.LookupMetric(t, reg, "meshid_federation_bundle_refresh_failures_total", "trust_domain", "b.example", "reason", reason)
		f.RefreshOnce(t.Context(), tdB)
		if n, _ := testkit.LookupMetric(t, reg, "meshid_federation_bundle_refresh_failures_total", "trust_domain", "b.example", "reason", reason); n != before+1 {
			t.Errorf("%s: %s failures %v, want %v: %v", mode, reason, n, before+1, f.Status())
		}
		if !f.Snapshot().Bundles[tdB].Equal(good) {
			t.Errorf("%s: the last good bundle was replaced", mode)
		}
		if st := f.Status()[0]; st.LastError == "" {
			t.Errorf("%s: no error in the status", mode)
		}
	}
	// https_spiffe on real endpoints: b.example's endpoint serving
	// c.example's roots, and one presenting another SPIFFE ID.
	authC := testkit.NewAuthority(t, tdC, clk, nil)
	bootB := writePEM(t, authB.Bundle().Roots...)
	wrongID, _ := spiffeid.FromPath(tdB, "/someone-else")
	for name, c := range map[string]struct {
		serve  []*x509.Certificate
		id     spiffeid.ID
		reason string
	}{
		"wrong trust domain": {authC.Bundle().Roots, spiffefed.EndpointID(tdB), spiffefed.ReasonTrustDomain},
		"wrong SPIFFE ID":    {authB.Bundle().Roots, wrongID, spiffefed.ReasonFetch},
	} {
		url := startEndpoint(t, tdB, authB, (&keys{roots: c.serve}).source, clk, nil)
		reg := prometheus.NewRegistry()
		p := spiffefed.Peer{TrustDomain: tdB, URL: url, Profile: spiffefed.ProfileSPIFFE, EndpointID: c.id, BundleFile: bootB}
		g, err := spiffefed.New(spiffefed.Config{TrustDomain: tdA, Peers: []spiffefed.Peer{p}, Clock: clk, Logger: logs.Logger(), Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		boot := g.Snapshot().Bundles[tdB]
		g.RefreshOnce(t.Context(), tdB)
		if n := testkit.Metric(t, reg, "meshid_federation_bundle_refresh_failures_total", "trust_domain", "b.example", "reason", c.reason); n != 1 {
			t.Errorf("%s: %s failures %v, want 1: %v", name, c.reason, n, g.Status())
		}
		if !g.Snapshot().Bundles[tdB].Equal(boot) {
			t.Errorf("%s: the bootstrap bundle was replaced", name)
		}
	}
	if n := logs.Count("federated bundle refused"); n < 8 {
		t.Errorf("%d refusals logged, want 8:\n%s", n, logs.All())
	}
	if strings.Contains(logs.All(), "PRIVATE KEY") {
		t.Error("a key reached the log")
	}
}

// webCert writes a serving certificate for 127.0.0.1 signed by root to
// certFile and keyFile, and returns it.
func webCert(t *testing.T, root *x509.Certificate, rootKey crypto.Signer, certFile, keyFile string, serial int64) *x509.Certificate {
	t.Helper()
	key := testkit.Key(t, certs.ECP256)
	leaf := testkit.Certificate(t, &x509.Certificate{
		SerialNumber: big.NewInt(serial), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature,
	}, root, key.Public(), rootKey)
	keyPEM, err := certs.EncodePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, certs.EncodeCertificates(leaf), 0o600); err != nil {
		t.Fatal(err)
	}
	return leaf
}

// An https_web endpoint presents its certificate files, and the new ones
// once they change (checked at most every 10 s on the clock); the
// Federator's https_web profile verifies it with ca-file's roots.
func TestEndpointWebCertificateReloads(t *testing.T) {
	clk := clock.NewFake(time.Now())
	authority := testkit.NewAuthority(t, tdA, clk, nil)
	root, rootKey := testkit.Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "web root"}, NotBefore: time.Now().Add(-time.Hour), TTL: 24 * time.Hour})
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	first := webCert(t, root, rootKey, certFile, keyFile, 1)
	e, err := spiffefed.NewEndpoint(spiffefed.EndpointConfig{
		Listen: "127.0.0.1:0", Profile: spiffefed.ProfileWeb, TrustDomain: tdA, CertFile: certFile, KeyFile: keyFile,
		Source: (&keys{roots: authority.Bundle().Roots}).source, Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Listen(); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "bundle endpoint", e.Run)
	url := "https://" + e.Addr().String() + "/"
	pool := x509.NewCertPool()
	pool.AddCert(root)
	served := func() *x509.Certificate {
		t.Helper()
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0]
	}
	if got := served(); !got.Equal(first) {
		t.Fatalf("serving serial %v, want %v", got.SerialNumber, first.SerialNumber)
	}
	second := webCert(t, root, rootKey, certFile, keyFile, 2)
	if got := served(); !got.Equal(first) {
		t.Fatal("the files were read again before the check interval")
	}
	clk.Add(10 * time.Second)
	if got := served(); !got.Equal(second) {
		t.Fatalf("serving serial %v after the change, want %v", got.SerialNumber, second.SerialNumber)
	}
	// A Federator with the https_web profile reads it, verifying with ca-file.
	f, err := spiffefed.New(spiffefed.Config{TrustDomain: tdB, Clock: clk, Peers: []spiffefed.Peer{{
		TrustDomain: tdA, URL: url, Profile: spiffefed.ProfileWeb, CAFile: writePEM(t, root),
	}}})
	if err != nil {
		t.Fatal(err)
	}
	f.RefreshOnce(t.Context(), tdA)
	if b := f.Snapshot().Bundles[tdA]; b == nil || !b.HasX509Authority(authority.Bundle().Roots[0]) {
		t.Fatalf("https_web fetch: %+v", f.Status())
	}
}

// ca-file is read again before every fetch: an https_web endpoint whose
// root is not in it is refused, and accepted at the next fetch once the
// file (a mounted ConfigMap key, in a cluster) holds the root, without a
// restart.
func TestFederatorReadsCAFileAgain(t *testing.T) {
	authB := testkit.NewAuthority(t, tdB, nil, nil)
	data, err := spiffebundle.FromX509Authorities(tdB, authB.Bundle().Roots).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(data) }))
	t.Cleanup(hs.Close)
	other, _ := testkit.Root(t, certs.CASpec{Subject: pkix.Name{CommonName: "another root"}, NotBefore: time.Now().Add(-time.Hour), TTL: time.Hour})
	caFile := writePEM(t, other)
	f, err := spiffefed.New(spiffefed.Config{TrustDomain: tdA, Clock: clock.NewFake(time.Now()), Peers: []spiffefed.Peer{{
		TrustDomain: tdB, URL: hs.URL + "/", Profile: spiffefed.ProfileWeb, CAFile: caFile,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	f.RefreshOnce(t.Context(), tdB)
	if b := f.Snapshot().Bundles[tdB]; b != nil {
		t.Fatal("fetched over https_web with a ca-file that lacks the endpoint's root")
	}
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hs.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	f.RefreshOnce(t.Context(), tdB)
	if b := f.Snapshot().Bundles[tdB]; b == nil || !b.HasX509Authority(authB.Bundle().Roots[0]) {
		t.Fatalf("ca-file's new root not used: %+v", f.Status())
	}
}

// The next refresh is at the bundle's hint, a hint under 5 s counts as
// 5 s, and a bundle without a hint is refreshed every 5 minutes.
func TestFederatorRefreshesAtTheHint(t *testing.T) {
	authB := testkit.NewAuthority(t, tdB, nil, nil)
	for _, c := range []struct {
		name string
		hint time.Duration // 0: none
		want time.Duration
	}{
		{"hint", 90 * time.Second, 90 * time.Second},
		{"hint under 5s", time.Second, spiffefed.MinRefresh},
		{"no hint", 0, spiffefed.DefaultRefresh},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := clock.NewFake(time.Now())
			b := spiffebundle.FromX509Authorities(tdB, authB.Bundle().Roots)
			if c.hint > 0 {
				b.SetRefreshHint(c.hint)
			}
			data, err := b.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			hs := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(data) }))
			t.Cleanup(hs.Close)
			caFile := filepath.Join(t.TempDir(), "ca.pem")
			os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hs.Certificate().Raw}), 0o600)
			f, err := spiffefed.New(spiffefed.Config{TrustDomain: tdA, Clock: clk, Peers: []spiffefed.Peer{{
				TrustDomain: tdB, URL: hs.URL + "/", Profile: spiffefed.ProfileWeb, CAFile: caFile,
			}}})
			if err != nil {
				t.Fatal(err)
			}
			changed := f.Changed()
			testkit.Run(t, "federator", f.Run)
			waitChange(t, changed)
			if d := testkit.NextDeadline(t, clk, "the refresh").Sub(clk.Now()); d != c.want {
				t.Fatalf("next refresh in %v, want %v", d, c.want)
			}
		})
	}
}
