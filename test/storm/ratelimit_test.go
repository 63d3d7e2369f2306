package storm_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// TestRateLimitBurst sends a burst of 2,000 concurrent CreateCertificate
// calls for one identity (a deployment's pods all restarting) to a CA with a
// per-caller rate limit of 10/s and a burst of 20, at one fake instant. The
// CA signs exactly the burst and answers every other call at once with
// ResourceExhausted; it goes on serving other callers during the burst, and
// the limited caller again once the bucket refills. The burst's calls are
// held in authentication until the other caller has been served, so that
// call overlaps the burst: a full connection's worth of the burst's calls
// (certservice.MaxConcurrentStreams) is inside the CA while it is served, on a
// connection of its own as another agent's would be.
func TestRateLimitBurst(t *testing.T) {
	const (
		calls = 2000
		rate  = 10
		burst = 20
	)
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	g := &gate{sa: "web", entered: make(chan struct{}, calls), release: make(chan struct{})}
	s := startCA(t, clk, rate, burst, g.wrap)
	api := s.api(t)
	stormID := spiffeid.RequireFromSegments(td, "ns", "storm", "sa", "web")
	stormCtx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+s.token(t, "storm", "web"))
	csr := csrPEM(t, stormID)

	codesSeen := make(map[codes.Code]int)
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range calls {
		wg.Go(func() {
			<-start
			_, err := api.CreateCertificate(stormCtx, &securityv1alpha1.IstioCertificateRequest{Csr: csr})
			mu.Lock()
			codesSeen[status.Code(err)]++
			mu.Unlock()
		})
	}
	close(start)
	timeout := guard(t, time.Minute)
	for i := range certservice.MaxConcurrentStreams {
		select {
		case <-g.entered:
		case <-timeout:
			close(g.release)
			t.Fatalf("only %d of the burst's calls reached the CA", i)
		}
	}
	// Another service's agent is served while the burst is in flight.
	other := spiffeid.RequireFromSegments(td, "ns", "storm", "sa", "db")
	otherCtx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+s.token(t, "storm", "db"))
	resp, err := s.api(t).CreateCertificate(otherCtx, &securityv1alpha1.IstioCertificateRequest{Csr: csrPEM(t, other)})
	close(g.release)
	if err != nil || len(resp.GetCertChain()) < 2 {
		t.Fatalf("another caller during the burst: %v", err)
	}
	wg.Wait()
	t.Logf("burst of %d calls for one identity (limit %d/s, burst %d): %v", calls, rate, burst, codesSeen)
	if codesSeen[codes.OK] != burst || codesSeen[codes.ResourceExhausted] != calls-burst || len(codesSeen) != 2 {
		t.Fatalf("codes %v, want %d OK and %d ResourceExhausted", codesSeen, burst, calls-burst)
	}
	if ok, re := s.requests(t, "OK"), s.requests(t, "ResourceExhausted"); ok != burst+1 || re != calls-burst {
		t.Fatalf("CA counted %v OK and %v ResourceExhausted", ok, re)
	}

	// One second later the bucket holds 10 tokens again.
	clk.Add(time.Second)
	okAfter := 0
	for range rate + 5 {
		_, err := api.CreateCertificate(stormCtx, &securityv1alpha1.IstioCertificateRequest{Csr: csr})
		switch status.Code(err) {
		case codes.OK:
			okAfter++
		case codes.ResourceExhausted:
		default:
			t.Fatalf("after refill: %v", err)
		}
	}
	if okAfter != rate {
		t.Fatalf("%d calls signed one second after the burst, want %d", okAfter, rate)
	}
}

// gate holds each call of service account sa in authentication, after its
// token is verified, until release is closed; entered receives once per
// call held.
type gate struct {
	next    authn.Authenticator
	sa      string
	entered chan struct{}
	release chan struct{}
}

func (g *gate) wrap(next authn.Authenticator) authn.Authenticator {
	g.next = next
	return g
}

func (g *gate) Authenticate(ctx context.Context, creds authn.Credentials) (*authn.Caller, error) {
	c, err := g.next.Authenticate(ctx, creds)
	if err == nil && c.ServiceAccount == g.sa {
		g.entered <- struct{}{}
		select {
		case <-g.release:
		case <-ctx.Done():
		}
	}
	return c, err
}

// api dials the CA over TLS with the generated Istio client.
func (s *caServer) api(t *testing.T) securityv1alpha1.IstioCertificateServiceClient {
	t.Helper()
	pool := x509.NewCertPool()
	for _, r := range s.authority.Bundle().Roots {
		pool.AddCert(r)
	}
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12,
	})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return securityv1alpha1.NewIstioCertificateServiceClient(conn)
}

// csrPEM returns a PEM CSR for id with a fresh ec-p256 key.
func csrPEM(t *testing.T, id spiffeid.ID) string {
	t.Helper()
	return string(testkit.CSRPEM(t, testkit.Key(t, certs.ECP256), id))
}
