package caclient_test

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/sds/caclient"
	"github.com/meshid/meshid/testkit"
)

const workload = "spiffe://cluster.local/ns/default/sa/default"

var istiodOnly = []string{"istiod.istio-system.svc"}

func newClient(t *testing.T, cfg caclient.Config) *caclient.Client {
	t.Helper()
	c, err := caclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestSign(t *testing.T) {
	// The serving certificate names only istiod.istio-system.svc: dialling
	// localhost works only through Istio's localhost rule.
	ca := startCA(t, istiodOnly, nil)
	_, port, _ := net.SplitHostPort(ca.addr)
	tok := tokenPath(t)
	writeToken(t, tok, "  header.payload.sig-1\n")
	reg := prometheus.NewRegistry()
	c := newClient(t, caclient.Config{
		Addr: "localhost:" + port, Roots: []*x509.Certificate{ca.h.root}, TokenFile: tok,
		ClusterID: "Kubernetes", Registerer: reg,
	})
	key, csr := newCSR(t, workload)
	chain, roots, err := c.Sign(context.Background(), csr, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 || !chain[1].Equal(ca.h.inter) || len(roots) != 1 || !roots[0].Equal(ca.h.root) {
		t.Fatalf("chain %d certs, roots %d", len(chain), len(roots))
	}
	if !certs.KeyMatches(chain[0].PublicKey, key) {
		t.Fatal("leaf does not hold the key")
	}
	reqs := ca.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	r := reqs[0]
	if len(r.auth) != 1 || r.auth[0] != "Bearer header.payload.sig-1" {
		t.Errorf("authorization = %q, want the trimmed bearer token", r.auth)
	}
	if r.req.GetValidityDuration() != 7200 {
		t.Errorf("validity_duration = %d, want 7200", r.req.GetValidityDuration())
	}
	if got := r.req.GetMetadata().GetFields()["ClusterID"].GetStringValue(); got != "Kubernetes" {
		t.Errorf("metadata ClusterID = %q", got)
	}
	if !strings.Contains(r.clientUA, "meshid-agent") {
		t.Errorf("user-agent %q", r.clientUA)
	}
	if n := testkit.Metric(t, reg, "meshid_agent_ca_request_duration_seconds"); n != 1 {
		t.Errorf("duration samples = %v, want 1", n)
	}
}

func TestNoClusterIDNoMetadata(t *testing.T) {
	ca := startCA(t, nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	c := newClient(t, ca.clientConfig(t))
	_, csr := newCSR(t, workload)
	if _, _, err := c.Sign(context.Background(), csr, 0); err != nil {
		t.Fatal(err)
	}
	r := ca.requests()[0]
	if r.req.GetMetadata() != nil || r.req.GetValidityDuration() != 0 {
		t.Fatalf("metadata %v, validity %d", r.req.GetMetadata(), r.req.GetValidityDuration())
	}
}

func TestTokenReReadEveryRequest(t *testing.T) {
	ca := startCA(t, nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	tok := tokenPath(t)
	reg := prometheus.NewRegistry()
	c := newClient(t, caclient.Config{Addr: ca.addr, Roots: []*x509.Certificate{ca.h.root}, TokenFile: tok, Registerer: reg})
	sign := func() error {
		_, csr := newCSR(t, workload)
		_, _, err := c.Sign(context.Background(), csr, time.Hour)
		return err
	}
	for _, v := range []string{"token-one", "token-two"} {
		writeToken(t, tok, v) // the kubelet rotates the projected token
		if err := sign(); err != nil {
			t.Fatal(err)
		}
	}
	reqs := ca.requests()
	if reqs[0].auth[0] != "Bearer token-one" || reqs[1].auth[0] != "Bearer token-two" {
		t.Fatalf("tokens sent: %q, %q", reqs[0].auth, reqs[1].auth)
	}
	// Unreadable or empty token: no request, an error naming the file only.
	writeToken(t, tok, "secret-token-three")
	mustRemove(t, tok)
	for _, content := range []string{"", " \n"} {
		if content != "" {
			writeToken(t, tok, content)
		}
		err := sign()
		if err == nil || !strings.Contains(err.Error(), "token") || strings.Contains(err.Error(), "secret-token") {
			t.Fatalf("missing/empty token: %v", err)
		}
	}
	if n := len(ca.requests()); n != 2 {
		t.Fatalf("%d requests, want none without a token", n)
	}
	if got := testkit.Metric(t, reg, "meshid_agent_ca_request_failures_total", "code", "token_file"); got != 2 {
		t.Fatalf("failures{token_file} = %v", got)
	}
}

func TestServerVerification(t *testing.T) {
	ca := startCA(t, istiodOnly, nil)
	other := newHierarchy(t)
	tok := tokenPath(t)
	writeToken(t, tok, "t")
	tests := []struct {
		name       string
		addr       string
		serverName string
		roots      []*x509.Certificate
		ok         bool
	}{
		{"IP not in the serving cert", ca.addr, "", []*x509.Certificate{ca.h.root}, false},
		{"explicit server name", ca.addr, "istiod.istio-system.svc", []*x509.Certificate{ca.h.root}, true},
		{"untrusted roots", ca.addr, "istiod.istio-system.svc", []*x509.Certificate{other.root}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, caclient.Config{Addr: tc.addr, ServerName: tc.serverName, Roots: tc.roots, TokenFile: tok})
			_, csr := newCSR(t, workload)
			_, _, err := c.Sign(context.Background(), csr, time.Hour)
			if tc.ok != (err == nil) {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && status.Code(err) != codes.Unavailable {
				t.Fatalf("code %v, want Unavailable for a TLS failure", status.Code(err))
			}
		})
	}
}

func TestInvalidResponses(t *testing.T) {
	ca := startCA(t, nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	other := newHierarchy(t)
	reg := prometheus.NewRegistry()
	cfg := ca.clientConfig(t)
	cfg.Registerer = reg
	c := newClient(t, cfg)
	h := ca.h
	later := time.Now().Add(time.Hour)
	leafFor := func(csr *x509.CertificateRequest) *x509.Certificate {
		return h.issue(t, csr.PublicKey, csr.URIs, nil, nil, later)
	}
	type respondFunc = func(*x509.CertificateRequest, *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error)
	answer := func(f func(csr *x509.CertificateRequest) []string) respondFunc {
		return func(csr *x509.CertificateRequest, _ *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
			return &pb.IstioCertificateResponse{CertChain: f(csr)}, nil
		}
	}
	otherKey, _ := certs.GenerateKey(certs.ECP256)
	otherID, _ := url.Parse("spiffe://cluster.local/ns/default/sa/admin")
	tests := []struct {
		name string
		f    func(csr *x509.CertificateRequest) []string
		want string
	}{
		{"empty chain", func(*x509.CertificateRequest) []string { return nil }, "0 elements"},
		{"leaf only", func(csr *x509.CertificateRequest) []string { return []string{pemOf(leafFor(csr))} }, "1 elements"},
		{"garbage leaf", func(*x509.CertificateRequest) []string { return []string{"not pem", pemOf(h.root)} }, "cert_chain[0]"},
		{"truncated roots", func(csr *x509.CertificateRequest) []string {
			r := pemOf(h.root)
			return []string{pemOf(leafFor(csr)), pemOf(h.inter), r[:len(r)-60]}
		}, "root bundle"},
		{"other key", func(csr *x509.CertificateRequest) []string {
			return []string{pemOf(h.issue(t, otherKey.Public(), csr.URIs, nil, nil, later)), pemOf(h.inter), pemOf(h.root)}
		}, "public key"},
		{"other identity", func(csr *x509.CertificateRequest) []string {
			return []string{pemOf(h.issue(t, csr.PublicKey, []*url.URL{otherID}, nil, nil, later)), pemOf(h.inter), pemOf(h.root)}
		}, "identity"},
		{"no identity", func(csr *x509.CertificateRequest) []string {
			return []string{pemOf(h.issue(t, csr.PublicKey, nil, nil, nil, later)), pemOf(h.inter), pemOf(h.root)}
		}, "URI"},
		{"missing intermediate", func(csr *x509.CertificateRequest) []string { return []string{pemOf(leafFor(csr)), pemOf(h.root)} }, "verify"},
		{"roots of another CA", func(csr *x509.CertificateRequest) []string {
			return []string{pemOf(leafFor(csr)), pemOf(h.inter), pemOf(other.root)}
		}, "verify"},
		{"signed by another CA", func(csr *x509.CertificateRequest) []string {
			return []string{pemOf(other.issue(t, csr.PublicKey, csr.URIs, nil, nil, later)), pemOf(h.inter), pemOf(h.root)}
		}, "verify"},
		{"expired leaf", func(csr *x509.CertificateRequest) []string {
			return []string{pemOf(h.issue(t, csr.PublicKey, csr.URIs, nil, nil, time.Now().Add(-time.Second))), pemOf(h.inter), pemOf(h.root)}
		}, "verify"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ca.setRespond(answer(tc.f))
			_, csr := newCSR(t, workload)
			_, _, err := c.Sign(context.Background(), csr, time.Hour)
			if !errors.Is(err, caclient.ErrInvalidResponse) {
				t.Fatalf("err = %v, want ErrInvalidResponse", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
			if got := testkit.Metric(t, reg, "meshid_agent_ca_request_failures_total", "code", "invalid_response"); got != float64(i+1) {
				t.Errorf("failures{invalid_response} = %v, want %d", got, i+1)
			}
		})
	}
}

func TestChainShapes(t *testing.T) {
	ca := startCA(t, nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	second := newHierarchy(t)
	c := newClient(t, ca.clientConfig(t))
	h := ca.h
	tests := []struct {
		name              string
		f                 func(leaf *x509.Certificate) []string
		wantChain, wantRs int
	}{
		{"leaf, intermediate, root", func(l *x509.Certificate) []string { return []string{pemOf(l), pemOf(h.inter), pemOf(h.root)} }, 2, 1},
		{"root bundle of two (root rotation)", func(l *x509.Certificate) []string {
			return []string{pemOf(l), pemOf(h.inter), pemOf(second.root) + pemOf(h.root)}
		}, 2, 2},
		{"leaf and intermediate in one element", func(l *x509.Certificate) []string { return []string{pemOf(l, h.inter), pemOf(h.root)} }, 2, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ca.setRespond(func(csr *x509.CertificateRequest, _ *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
				return &pb.IstioCertificateResponse{CertChain: tc.f(h.issue(t, csr.PublicKey, csr.URIs, nil, nil, time.Now().Add(time.Hour)))}, nil
			})
			_, csr := newCSR(t, workload)
			chain, roots, err := c.Sign(context.Background(), csr, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if len(chain) != tc.wantChain || len(roots) != tc.wantRs {
				t.Fatalf("chain %d roots %d, want %d %d", len(chain), len(roots), tc.wantChain, tc.wantRs)
			}
		})
	}
}

func TestCodesPreserved(t *testing.T) {
	ca := startCA(t, nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	reg := prometheus.NewRegistry()
	cfg := ca.clientConfig(t)
	cfg.Registerer = reg
	c := newClient(t, cfg)
	for _, code := range []codes.Code{codes.ResourceExhausted, codes.Unavailable, codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument} {
		t.Run(code.String(), func(t *testing.T) {
			ca.setRespond(func(*x509.CertificateRequest, *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
				return nil, status.Error(code, "no")
			})
			_, csr := newCSR(t, workload)
			_, _, err := c.Sign(context.Background(), csr, time.Hour)
			if status.Code(err) != code || !strings.HasPrefix(err.Error(), "caclient: ") {
				t.Fatalf("err = %v (code %v), want %v", err, status.Code(err), code)
			}
			if got := testkit.Metric(t, reg, "meshid_agent_ca_request_failures_total", "code", code.String()); got != 1 {
				t.Fatalf("failures{%s} = %v", code, got)
			}
		})
	}
}

func TestTimeout(t *testing.T) {
	ca := startCA(t, nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	cfg := ca.clientConfig(t)
	cfg.Timeout = 100 * time.Millisecond
	c := newClient(t, cfg)
	release := make(chan struct{})
	defer close(release)
	ca.setRespond(func(*x509.CertificateRequest, *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
		<-release // a CA that hangs
		return nil, status.Error(codes.Internal, "late")
	})
	_, csr := newCSR(t, workload)
	if _, _, err := c.Sign(context.Background(), csr, time.Hour); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
}

func TestNewValidates(t *testing.T) {
	h := newHierarchy(t)
	roots := []*x509.Certificate{h.root}
	for name, cfg := range map[string]caclient.Config{
		"no addr":          {Roots: roots, TokenFile: "t"},
		"no roots":         {Addr: "127.0.0.1:1", TokenFile: "t"},
		"no token file":    {Addr: "127.0.0.1:1", Roots: roots},
		"negative timeout": {Addr: "127.0.0.1:1", Roots: roots, TokenFile: "t", Timeout: -1},
	} {
		if _, err := caclient.New(cfg); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}

func TestBadCSR(t *testing.T) {
	h := newHierarchy(t)
	c := newClient(t, caclient.Config{Addr: "127.0.0.1:1", Roots: []*x509.Certificate{h.root}, TokenFile: "unused"})
	_, noID := newCSR(t, "https://example.com/not-spiffe")
	for name, csr := range map[string]*x509.CertificateRequest{"nil": nil, "no SPIFFE ID": noID, "no URI": {}} {
		if _, _, err := c.Sign(context.Background(), csr, time.Hour); err == nil {
			t.Errorf("%s: accepted the CSR", name)
		}
	}
}

func TestCARestart(t *testing.T) {
	ca := startCA(t, nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	c := newClient(t, ca.clientConfig(t))
	// A second client waits for the connection instead of failing fast,
	// so the test needs no polling to see the reconnection.
	cfg := ca.clientConfig(t)
	cfg.DialOptions = []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.WaitForReady(true))}
	waiting := newClient(t, cfg)
	sign := func(c *caclient.Client) error {
		_, csr := newCSR(t, workload)
		_, _, err := c.Sign(context.Background(), csr, time.Hour)
		return err
	}
	for _, cl := range []*caclient.Client{c, waiting} {
		if err := sign(cl); err != nil {
			t.Fatal(err)
		}
	}
	ca.stop()
	if err := sign(c); status.Code(err) != codes.Unavailable {
		t.Fatalf("CA down: %v, want Unavailable", err)
	}
	ca.start() // same address
	// The same channel reconnects: no new client is needed. A call sent
	// before the channel noticed the old connection closed fails once
	// with Unavailable (EOF), as gRPC specifies for a transport lost under
	// an RPC; the agent's SecretManager retries such a failure with
	// backoff, and so does this test, a bounded number of times.
	var err error
	for range 5 {
		if err = sign(waiting); status.Code(err) != codes.Unavailable {
			break
		}
	}
	if err != nil {
		t.Fatalf("after the CA restarted: %v", err)
	}
	if n := len(ca.requests()); n != 3 {
		t.Fatalf("%d requests reached the CA, want 3", n)
	}
}

// TestTokenSizeLimit: a token file of identity.MaxTokenSize bytes is sent
// whole; one byte more is refused with an error naming the file and the
// limit, and no request is made (a huge file is not sent cut short).
func TestTokenSizeLimit(t *testing.T) {
	ca := startCA(t, nil, []net.IP{net.IPv4(127, 0, 0, 1)})
	tok := tokenPath(t)
	c := newClient(t, caclient.Config{Addr: ca.addr, Roots: []*x509.Certificate{ca.h.root}, TokenFile: tok})
	sign := func() error {
		_, csr := newCSR(t, workload)
		_, _, err := c.Sign(context.Background(), csr, time.Hour)
		return err
	}
	largest := strings.Repeat("t", identity.MaxTokenSize)
	writeToken(t, tok, largest)
	if err := sign(); err != nil {
		t.Fatalf("a token of %d bytes: %v", identity.MaxTokenSize, err)
	}
	if reqs := ca.requests(); len(reqs) != 1 || reqs[0].auth[0] != "Bearer "+largest {
		t.Fatalf("the largest token was not sent whole (%d requests)", len(reqs))
	}
	writeToken(t, tok, largest+"t")
	err := sign()
	if err == nil || !strings.Contains(err.Error(), tok) || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("a token of %d bytes: %v, want refused as too large", identity.MaxTokenSize+1, err)
	}
	if n := len(ca.requests()); n != 1 {
		t.Fatalf("%d requests, want none for the oversized token", n)
	}
}

// TestVerifyEmpty: Verify, the agent's one check of a CA's answer (also
// used on certificates read back from elsewhere), refuses an empty chain
// and an empty root set as invalid responses.
func TestVerifyEmpty(t *testing.T) {
	h := newHierarchy(t)
	key, csr := newCSR(t, workload)
	leaf := h.issue(t, csr.PublicKey, csr.URIs, nil, nil, time.Now().Add(time.Hour))
	chain, roots := []*x509.Certificate{leaf, h.inter}, []*x509.Certificate{h.root}
	id := spiffeid.RequireFromString(workload)
	if err := caclient.Verify(chain, roots, key.Public(), id, time.Now()); err != nil {
		t.Fatalf("a good answer refused: %v", err)
	}
	for name, tc := range map[string]struct{ chain, roots []*x509.Certificate }{
		"no chain": {nil, roots},
		"no roots": {chain, nil},
	} {
		if err := caclient.Verify(tc.chain, tc.roots, key.Public(), id, time.Now()); !errors.Is(err, caclient.ErrInvalidResponse) {
			t.Errorf("%s: %v, want ErrInvalidResponse", name, err)
		}
	}
}

// SetRoots replaces the roots that verify the CA from the next handshake
// on: a CA that moved to a new root is reached once the client trusts it,
// and an empty list does not drop the trust.
func TestSetRoots(t *testing.T) {
	ca := startCA(t, istiodOnly, nil)
	other := newHierarchy(t)
	tok := tokenPath(t)
	writeToken(t, tok, "t")
	c := newClient(t, caclient.Config{Addr: ca.addr, ServerName: "istiod.istio-system.svc", Roots: []*x509.Certificate{other.root}, TokenFile: tok})
	_, csr := newCSR(t, workload)
	if _, _, err := c.Sign(context.Background(), csr, time.Hour); status.Code(err) != codes.Unavailable {
		t.Fatalf("untrusted CA: %v", err)
	}
	c.SetRoots(nil)
	c.SetRoots([]*x509.Certificate{other.root, ca.h.root})
	// SetRoots cuts gRPC's reconnect backoff short (at least a second
	// after the failed handshake above): the channel leaves
	// TRANSIENT_FAILURE as soon as its reconnect goroutine runs, and a
	// request on a connecting channel waits for it. Until that goroutine
	// has run, a request may still fail fast; a few such attempts take
	// microseconds, while waiting out the backoff would take a second and
	// hundreds of thousands of them.
	const attempts = 10000
	var err error
	for i := 0; i < attempts; i++ {
		if _, _, err = c.Sign(context.Background(), csr, time.Hour); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("after SetRoots, %d attempts: %v", attempts, err)
	}
	c.SetRoots([]*x509.Certificate{other.root})
	c2 := newClient(t, caclient.Config{Addr: ca.addr, ServerName: "istiod.istio-system.svc", Roots: []*x509.Certificate{other.root}, TokenFile: tok})
	c2.SetRoots(nil) // ignored: still other.root only
	if _, _, err := c2.Sign(context.Background(), csr, time.Hour); status.Code(err) != codes.Unavailable {
		t.Fatalf("SetRoots(nil) dropped the check: %v", err)
	}
}
