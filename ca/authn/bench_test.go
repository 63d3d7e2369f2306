package authn_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/devissuer"
)

// BenchmarkAuthenticate compares the per-request cost of offline JWT
// verification (one signature check) with a TokenReview answered from its
// cache (one SHA-256 and a map lookup).
func BenchmarkAuthenticate(b *testing.B) {
	now := time.Now()
	for _, kt := range []certs.KeyType{certs.ECP256, certs.RSA2048} {
		key, err := certs.GenerateKey(kt)
		if err != nil {
			b.Fatal(err)
		}
		iss, err := devissuer.New(key, "https://bench")
		if err != nil {
			b.Fatal(err)
		}
		j, err := authn.NewJWT(authn.JWTConfig{Issuer: iss.Issuer(), JWKS: iss.JWKS()})
		if err != nil {
			b.Fatal(err)
		}
		tok := mint(b, iss, "ns", "sa", []string{"istio-ca"}, time.Hour, now)
		name := "jwt-" + map[certs.KeyType]string{certs.ECP256: string(jose.ES256), certs.RSA2048: string(jose.RS256)}[kt]
		b.Run(name, func(b *testing.B) { benchAuth(b, j, tok) })
		if kt == certs.ECP256 {
			api := &fakeAPI{answer: func(string, []string) (authenticationv1.TokenReviewStatus, error) {
				return saStatus("ns", "sa", "istio-ca"), nil
			}}
			tr, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: api.client()})
			if err != nil {
				b.Fatal(err)
			}
			b.Run("tokenreview-cached", func(b *testing.B) { benchAuth(b, tr, tok) })
			b.Run("chain-jwt-first", func(b *testing.B) { benchAuth(b, authn.NewChain(j, tr), tok) })
		}
	}
}

func benchAuth(b *testing.B, a authn.Authenticator, tok string) {
	ctx := context.Background()
	creds := authn.Credentials{Token: tok}
	if _, err := a.Authenticate(ctx, creds); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := a.Authenticate(ctx, creds); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
