package e2e_test

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"testing"

	"github.com/go-jose/go-jose/v4"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
)

// TestTokenReviewVerdictFinalWithJWT (issue 9, hole 2) configures both
// authenticators against the real API server: TokenReview, and the offline
// JWT check with the cluster's own service-account key. A token bound to a
// deleted pod verifies offline, but the API server rejects it, and that
// verdict is final. On b96f7b0 the chain accepted it through the JWT check.
func TestTokenReviewVerdictFinalWithJWT(t *testing.T) {
	ctx := context.Background()
	w := newWorkload(t, "verdict")
	good := w.token(t, "istio-ca")
	gone := w.deletedPodToken(t)

	pub := cluster.ServiceAccountKey().Public()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	kid := sha256.Sum256(der) // the API server's key id: base64url(SHA-256(PKIX))
	jwt, err := authn.NewJWT(authn.JWTConfig{
		Issuer:    cluster.Issuer(),
		Audiences: []string{"istio-ca"},
		JWKS:      &jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: pub, KeyID: base64.RawURLEncoding.EncodeToString(kid[:]), Algorithm: string(cluster.ServiceAccountAlgorithm()), Use: "sig"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jwt.Authenticate(ctx, authn.Credentials{Token: gone}); err != nil {
		t.Fatalf("the offline check alone must accept the deleted pod's token, or this test proves nothing: %v", err)
	}
	tr, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: cluster.MeshClient(), Audiences: []string{"istio-ca"}})
	if err != nil {
		t.Fatal(err)
	}
	chain := authn.NewChain(tr, jwt)
	if c, err := chain.Authenticate(ctx, authn.Credentials{Token: gone}); ca.KindOf(err) != ca.KindUnauthenticated {
		t.Fatalf("deleted pod's token: caller %+v, err %v; want unauthenticated", c, err)
	}
	c, err := chain.Authenticate(ctx, authn.Credentials{Token: good})
	if err != nil || c.Method != "tokenreview" {
		t.Fatalf("bound token: %+v, %v; want the TokenReview caller", c, err)
	}
}
