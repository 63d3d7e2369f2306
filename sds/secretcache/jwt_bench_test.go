package secretcache_test

import (
	"testing"

	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

func benchJWTManager(b *testing.B) *secretcache.Manager {
	b.Helper()
	clk := clock.NewFake(epoch)
	iss, err := jwtissuer.New(jwtissuer.Config{TrustDomain: testTD, Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	m, err := secretcache.New(secretcache.Config{Signer: newTestCA(b, clk), JWTSigner: testkit.JWTSigner{Issuer: iss}, ID: testID, Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// BenchmarkJWTSVIDCached: a JWT-SVID served from the cache (the audience
// set's key and the LRU move).
func BenchmarkJWTSVIDCached(b *testing.B) {
	m := benchJWTManager(b)
	aud := []string{"orders", "payments"}
	if _, err := m.JWTSVID(b.Context(), aud); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.JWTSVID(b.Context(), aud); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkValidateJWTSVID: one token checked against the JWT bundle
// (parse, ES256 verification, claims).
func BenchmarkValidateJWTSVID(b *testing.B) {
	m := benchJWTManager(b)
	svid, err := m.JWTSVID(b.Context(), []string{"orders"})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.ValidateJWTSVID(b.Context(), svid.Token, "orders"); err != nil {
			b.Fatal(err)
		}
	}
}
