package certservice_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

// gate is an Authenticator that holds each request until it is released
// (or its context ends), as a slow TokenReview does.
type gate struct {
	next    authn.Authenticator
	entered chan struct{}
	release chan struct{}
}

func (g *gate) Authenticate(ctx context.Context, creds authn.Credentials) (*authn.Caller, error) {
	g.entered <- struct{}{}
	select {
	case <-g.release:
		return g.next.Authenticate(ctx, creds)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestShutdownLetsRequestsFinish: when Run's context ends, a request in
// flight is answered (Run waits for it), for up to DefaultShutdownGrace of
// the injected clock; after that Run stops the server, which ends the
// requests still running, and returns.
func TestShutdownLetsRequestsFinish(t *testing.T) {
	for _, tc := range []struct {
		name     string
		released bool // the request is released during the grace period
		want     codes.Code
	}{
		{"request done within the grace period", true, codes.OK},
		{"request still running after it", false, codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := fakeClock()
			g := &gate{entered: make(chan struct{}, 1), release: make(chan struct{})}
			e := newEnv(t, envOpts{
				cfg: func(c *certservice.Config) { c.Clock = clk },
				auths: func(e *env) []authn.Authenticator {
					g.next = e.srvAuth(t)
					return []authn.Authenticator{g}
				},
			})
			c := e.client(t, "localhost", nil)
			csr := csrFor(t, testkit.Key(t, certs.ECP256), sid("shop", "cart"), nil)
			ctx := withToken(context.Background(), e.token(t, "shop", "cart"))
			call := testkit.Go(func() (*securityv1alpha1.IstioCertificateResponse, error) {
				return c.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr})
			})
			select {
			case <-g.entered:
			case <-time.After(testkit.Guard): // a safety bound only
				t.Fatal("the request never reached the authenticator")
			}
			stopped := testkit.Go(func() (struct{}, error) { return struct{}{}, e.stop() })
			// Run has begun its graceful stop once its grace timer is set.
			graceEnds := clk.Now().Add(certservice.DefaultShutdownGrace)
			waitUntil(t, func() bool { return slices.ContainsFunc(clk.Deadlines(), graceEnds.Equal) })
			if tc.released {
				close(g.release)
			} else {
				clk.Add(certservice.DefaultShutdownGrace)
			}
			r := <-call
			if got := status.Code(r.Err); got != tc.want {
				t.Fatalf("the request in flight: %v, want %v", r.Err, tc.want)
			}
			if tc.want == codes.OK {
				verifyChain(t, r.Value.CertChain, e.authority.Bundle().Roots, 0, sid("shop", "cart").String())
			}
			if s := <-stopped; s.Err != nil {
				t.Fatalf("Run: %v", s.Err)
			}
		})
	}
}
