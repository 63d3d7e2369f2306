package caclient_test

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/sds/caclient"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

// realCA is meshid's CA as `meshid dev` runs it: a self-signed root, the
// Authority, offline JWT authentication of dev-issuer tokens, and the gRPC
// server on a loopback port.
type realCA struct {
	t         testing.TB
	authority *ca.Authority
	roots     []*x509.Certificate
	issuer    *devissuer.Issuer
	auth      authn.Authenticator
	rateLimit float64
	addr      string
	stop      func()
}

func startRealCA(t testing.TB, rateLimit float64) *realCA {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	bundle, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: td.Name()})
	if err != nil {
		t.Fatal(err)
	}
	authority, err := ca.New(ca.Config{TrustDomain: td, Bundle: bundle, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := devissuer.LoadOrCreate(t.TempDir(), "https://meshid.test")
	if err != nil {
		t.Fatal(err)
	}
	r := &realCA{t: t, authority: authority, roots: bundle.Roots, issuer: iss, auth: authn.NewChain(testkit.DevJWT(t, iss)), rateLimit: rateLimit, addr: "127.0.0.1:0"}
	r.start()
	t.Cleanup(func() { r.stop() })
	return r
}

// start runs a server on r.addr (the same port again after stop).
func (r *realCA) start() {
	r.t.Helper()
	r.addr, r.stop = testkit.ServeCA(r.t, certservice.Config{Authority: r.authority, Authenticator: r.auth, Listen: r.addr, RateLimit: r.rateLimit})
}

// token writes a dev token for ns/sa to path.
func (r *realCA) token(path, ns, sa string) {
	r.t.Helper()
	tok, err := r.issuer.Mint(ns, sa, []string{"istio-ca"}, time.Hour, time.Now())
	if err != nil {
		r.t.Fatal(err)
	}
	writeToken(r.t, path, tok+"\n")
}

// localhostAddr dials the CA as istio-agent does with CA_ADDR=localhost:15012.
func (r *realCA) localhostAddr() string {
	_, port, _ := net.SplitHostPort(r.addr)
	return "localhost:" + port
}

func TestRealCAEndToEnd(t *testing.T) {
	r := startRealCA(t, 0)
	tok := tokenPath(t)
	r.token(tok, "default", "default")
	c := newClient(t, caclient.Config{Addr: r.localhostAddr(), Roots: r.roots, TokenFile: tok, ClusterID: "Kubernetes"})
	key, csr := newCSR(t, workload)
	chain, roots, err := c.Sign(context.Background(), csr, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := x509svid.Verify(chain, x509bundle.FromX509Authorities(td, roots))
	if err != nil || id.String() != workload {
		t.Fatalf("verify: %v, %v", id, err)
	}
	if !certs.KeyMatches(chain[0].PublicKey, key) || len(roots) != 1 || !roots[0].Equal(r.roots[0]) {
		t.Fatal("wrong key or roots")
	}
	if life := chain[0].NotAfter.Sub(time.Now()); life > 2*time.Hour || life < 2*time.Hour-5*time.Minute {
		t.Fatalf("lifetime %v, want the requested 2h", life)
	}
}

func TestRealCATokenRotation(t *testing.T) {
	r := startRealCA(t, 0)
	tok := tokenPath(t)
	c := newClient(t, caclient.Config{Addr: r.addr, ServerName: "localhost", Roots: r.roots, TokenFile: tok})
	sign := func(uri string) (spiffeid.ID, error) {
		_, csr := newCSR(t, uri)
		chain, _, err := c.Sign(context.Background(), csr, time.Hour)
		if err != nil {
			return spiffeid.ID{}, err
		}
		return x509svid.IDFromCert(chain[0])
	}
	const frontend = "spiffe://cluster.local/ns/prod/sa/frontend"
	r.token(tok, "prod", "frontend")
	if id, err := sign(frontend); err != nil || id.String() != frontend {
		t.Fatalf("frontend token, frontend CSR: %v %v", id, err)
	}
	if _, err := sign(workload); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("frontend token, default CSR: %v, want PermissionDenied", err)
	}
	// The kubelet rotates the file to another identity's token: the next
	// request carries it, with the same client and connection.
	r.token(tok, "default", "default")
	if id, err := sign(workload); err != nil || id.String() != workload {
		t.Fatalf("after token rotation: %v %v", id, err)
	}
	if _, err := sign(frontend); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("old identity after rotation: %v, want PermissionDenied", err)
	}
	// A token for another audience is refused by the CA.
	bad, err := r.issuer.Mint("default", "default", []string{"other"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	writeToken(t, tok, bad)
	if _, err := sign(workload); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("wrong audience: %v, want Unauthenticated", err)
	}
}

func TestRealCARateLimit(t *testing.T) {
	r := startRealCA(t, 0.001) // one request, then none for 1000s
	tok := tokenPath(t)
	r.token(tok, "default", "default")
	c := newClient(t, caclient.Config{Addr: r.localhostAddr(), Roots: r.roots, TokenFile: tok})
	_, csr := newCSR(t, workload)
	if _, _, err := c.Sign(context.Background(), csr, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Sign(context.Background(), csr, time.Hour); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("over the rate limit: %v, want ResourceExhausted", err)
	}
}

// switchSigner lets a test swap the client under a Manager.
type switchSigner struct {
	cur atomic.Pointer[caclient.Client]
}

func (s *switchSigner) Sign(ctx context.Context, csr *x509.CertificateRequest, ttl time.Duration) ([]*x509.Certificate, []*x509.Certificate, error) {
	return s.cur.Load().Sign(ctx, csr, ttl)
}

// TestRealCASecretManager runs the agent's SecretManager over this client
// against the real CA, through a CA outage and restart.
func TestRealCASecretManager(t *testing.T) {
	r := startRealCA(t, 0)
	tok := tokenPath(t)
	r.token(tok, "default", "default")
	cfg := caclient.Config{Addr: r.localhostAddr(), Roots: r.roots, TokenFile: tok}
	failFast := newClient(t, cfg)
	// This one waits for the connection instead of failing fast, so the
	// test sees the reconnection after the restart without polling.
	cfg.DialOptions = []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.WaitForReady(true))}
	waiting := newClient(t, cfg)
	var signer switchSigner
	signer.cur.Store(waiting)

	id, err := identity.IDFromToken(mustRead(t, tok), td)
	if err != nil {
		t.Fatal(err)
	}
	// The Manager's clock is fake so that the test can step past the
	// failure backoff that a forced rotation also keeps.
	clk := clock.NewFake(time.Now())
	m, err := secretcache.New(secretcache.Config{Signer: &signer, ID: id, TTL: time.Hour, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v1, err := m.Secret(ctx, secretcache.DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	rootSecret, err := m.Secret(ctx, secretcache.RootName)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := x509svid.Verify(v1.Chain, x509bundle.FromX509Authorities(td, rootSecret.Roots))
	if err != nil || got.String() != workload {
		t.Fatalf("default does not verify to ROOTCA: %v %v", got, err)
	}

	// CA down: a renewal fails with Unavailable and the cached certificate
	// is still served.
	r.stop()
	signer.cur.Store(failFast)
	if err := m.Rotate(ctx); status.Code(err) != codes.Unavailable {
		t.Fatalf("rotation with the CA down: %v, want Unavailable", err)
	}
	if s, err := m.Secret(ctx, secretcache.DefaultName); err != nil || s != v1 {
		t.Fatalf("cached certificate not served during the outage: %v", err)
	}

	// CA back on the same address: the connection used before the outage
	// recovers and rotation works again.
	r.start()
	signer.cur.Store(waiting)
	clk.Add(secretcache.DefaultBackoffMax)
	watched := make(chan *secretcache.Secret, 1)
	stop := m.Watch(secretcache.DefaultName, func(s *secretcache.Secret) { watched <- s })
	defer stop()
	if err := m.Rotate(ctx); err != nil {
		t.Fatalf("rotation after the CA restarted: %v", err)
	}
	v2 := <-watched
	if v2.Version == v1.Version {
		t.Fatal("no new certificate after recovery")
	}
	if s, _ := m.Secret(ctx, secretcache.DefaultName); s != v2 {
		t.Fatal("not serving the new certificate")
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
