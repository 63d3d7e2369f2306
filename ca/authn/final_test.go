package authn_test

import (
	"context"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/internal/clock"
)

// TestTokenReviewVerdictIsFinal reproduces issue 9, hole 2: with both
// TokenReview and the offline JWT check configured, a token the API server
// rejects (its pod was deleted) was accepted by the JWT check, whose keys
// still verify it. TokenReview's answer on a token it owns is now final:
// a rejection stays Unauthenticated and an outage stays Unavailable; the
// JWT check sees only tokens of issuers TokenReview does not own. On
// b96f7b0 the first two cases authenticate the caller.
func TestTokenReviewVerdictIsFinal(t *testing.T) {
	iss := newIssuer(t) // iss https://issuer.test, the cluster's issuer here
	token := mint(t, iss, "default", "web", []string{"istio-ca"}, time.Hour, t0)
	jwtAuth, err := authn.NewJWT(authn.JWTConfig{Issuer: iss.Issuer(), JWKS: iss.JWKS(), Clock: clock.NewFake(t0)})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := authn.NewJWT(authn.JWTConfig{Issuer: "https://other.test", JWKS: iss.JWKS(), Clock: clock.NewFake(t0)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jwtAuth.Authenticate(context.Background(), authn.Credentials{Token: token}); err != nil {
		t.Fatalf("the JWT check alone must accept the token, or this test proves nothing: %v", err)
	}
	rejected := func(string, []string) (authenticationv1.TokenReviewStatus, error) {
		return authenticationv1.TokenReviewStatus{Authenticated: false, Error: "pod deleted"}, nil
	}
	down := func(string, []string) (authenticationv1.TokenReviewStatus, error) {
		return authenticationv1.TokenReviewStatus{}, apierrors.NewServiceUnavailable("down")
	}
	tests := []struct {
		name    string
		answer  func(string, []string) (authenticationv1.TokenReviewStatus, error)
		issuers []string
		then    authn.Authenticator
		kind    ca.Kind // 0 with wantJWT
		calls   int32
		wantJWT bool
	}{
		{name: "rejection is final", answer: rejected, then: jwtAuth, kind: ca.KindUnauthenticated, calls: 1},
		{name: "rejection is final for an owned issuer", answer: rejected, issuers: []string{iss.Issuer()}, then: jwtAuth, kind: ca.KindUnauthenticated, calls: 1},
		{name: "unavailable stays unavailable", answer: down, then: jwtAuth, kind: ca.KindUnavailable, calls: 1},
		{name: "issuer not owned goes to the JWT check", answer: rejected, issuers: []string{"https://kubernetes.default.svc"}, then: jwtAuth, wantJWT: true, calls: 0},
		{name: "issuer not owned, JWT check of another issuer", answer: down, issuers: []string{"https://kubernetes.default.svc"}, then: foreign, kind: ca.KindUnauthenticated, calls: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api := &fakeAPI{answer: tc.answer}
			tr, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: api.client(), Issuers: tc.issuers, Clock: clock.NewFake(t0)})
			if err != nil {
				t.Fatal(err)
			}
			c, err := authn.NewChain(tr, tc.then).Authenticate(context.Background(), authn.Credentials{Token: token})
			if tc.wantJWT {
				if err != nil || c.Method != "jwt" {
					t.Fatalf("got %+v, %v; want the JWT check's caller", c, err)
				}
			} else {
				if err == nil {
					t.Fatalf("accepted as %+v, want %v", c, tc.kind)
				}
				wantKind(t, err, tc.kind, token)
			}
			if got := api.calls.Load(); got != tc.calls {
				t.Fatalf("%d TokenReview calls, want %d", got, tc.calls)
			}
		})
	}
}

// TestChainAfterTokenVerdict: after a final verdict on the token, later
// authenticators are called without it (a client certificate still
// counts), and the verdict is the answer when none accepts.
func TestChainAfterTokenVerdict(t *testing.T) {
	verdict := fail(authn.FinalForToken(ca.Errorf(ca.KindUnauthenticated, "tr: rejected")))
	var seen []string
	record := authFunc(func(_ context.Context, c authn.Credentials) (*authn.Caller, error) {
		seen = append(seen, c.Token)
		if len(c.PeerCertificates) > 0 {
			return &authn.Caller{Namespace: "ns", ServiceAccount: "sa", Method: "clientcert"}, nil
		}
		if c.Token == "" {
			return nil, authn.ErrNoCredentials
		}
		return &authn.Caller{Namespace: "ns", ServiceAccount: "sa", Method: "jwt"}, nil
	})
	_, err := authn.NewChain(verdict, record).Authenticate(context.Background(), authn.Credentials{Token: "t"})
	wantKind(t, err, ca.KindUnauthenticated, "")
	if len(seen) != 1 || seen[0] != "" {
		t.Fatalf("the next authenticator saw tokens %q, want only the empty one", seen)
	}
	c, err := authn.NewChain(verdict, record).Authenticate(context.Background(), authn.Credentials{Token: "t", PeerCertificates: []*x509.Certificate{{}}})
	if err != nil || c.Method != "clientcert" {
		t.Fatalf("client certificate after a token verdict: %+v, %v", c, err)
	}
	if authn.FinalForToken(nil) != nil {
		t.Fatal("FinalForToken(nil) != nil")
	}
	if e := authn.FinalForToken(ca.Errorf(ca.KindUnavailable, "x")); ca.KindOf(e) != ca.KindUnavailable {
		t.Fatal("FinalForToken changes the kind")
	}
}

// TestAuthenticatorsRefuseHugeTokens (issue 9, hole 7): TokenReview and
// the JWT check refuse a token over MaxTokenSize before hashing it or
// calling the API server.
func TestAuthenticatorsRefuseHugeTokens(t *testing.T) {
	iss := newIssuer(t)
	huge := strings.Repeat("a", authn.MaxTokenSize+1)
	api := &fakeAPI{answer: func(string, []string) (authenticationv1.TokenReviewStatus, error) {
		return saStatus("default", "web", "istio-ca"), nil
	}}
	tr, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: api.client()})
	if err != nil {
		t.Fatal(err)
	}
	j, err := authn.NewJWT(authn.JWTConfig{Issuer: iss.Issuer(), JWKS: iss.JWKS()})
	if err != nil {
		t.Fatal(err)
	}
	for name, a := range map[string]authn.Authenticator{"tokenreview": tr, "jwt": j} {
		_, err := a.Authenticate(context.Background(), authn.Credentials{Token: huge})
		wantKind(t, err, ca.KindUnauthenticated, huge)
		if !strings.Contains(err.Error(), "16 KiB") {
			t.Errorf("%s: %v, want the 16 KiB limit named", name, err)
		}
	}
	if n := api.calls.Load(); n != 0 {
		t.Fatalf("%d TokenReview calls for an oversized token", n)
	}
}
