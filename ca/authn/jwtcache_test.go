package authn_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

const jwtCacheHits = "meshid_ca_jwt_cache_hits_total"

func writeJWKS(t *testing.T, path string, keys ...jose.JSONWebKey) {
	t.Helper()
	b, err := json.Marshal(jose.JSONWebKeySet{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A verified token is answered from the cache: never past its exp, never
// longer than CacheTTL, and never once the key set that verified it has
// been replaced.
func TestJWTCache(t *testing.T) {
	k1 := newHandKey(t, certs.ECP256, jose.ES256, "k1")
	k2 := newHandKey(t, certs.ECP256, jose.ES256, "k2")
	type step struct {
		advance time.Duration
		rotate  bool // replace the key set by one holding only k2
		ok      bool
		hit     bool
	}
	tests := []struct {
		name   string
		ttl    time.Duration // token lifetime
		cfg    func(*authn.JWTConfig)
		steps  []step
		wantOK int
	}{
		{name: "second use is a hit", ttl: time.Hour, steps: []step{{ok: true}, {ok: true, hit: true}, {advance: 59 * time.Second, ok: true, hit: true}}},
		{name: "not beyond CacheTTL", ttl: time.Hour, steps: []step{{ok: true}, {advance: 61 * time.Second, ok: true}, {ok: true, hit: true}}},
		{name: "custom CacheTTL", ttl: time.Hour, cfg: func(c *authn.JWTConfig) { c.CacheTTL = 10 * time.Second },
			steps: []step{{ok: true}, {advance: 9 * time.Second, ok: true, hit: true}, {advance: 2 * time.Second, ok: true}}},
		{name: "not beyond exp", ttl: 20 * time.Second, steps: []step{{ok: true}, {advance: 19 * time.Second, ok: true, hit: true}, {advance: 3 * time.Second}}},
		{name: "key set replaced", ttl: time.Hour, steps: []step{{ok: true}, {rotate: true}, {}}},
		{name: "disabled", ttl: time.Hour, cfg: func(c *authn.JWTConfig) { c.CacheSize = -1 }, steps: []step{{ok: true}, {ok: true}, {ok: true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			reg := prometheus.NewRegistry()
			file := filepath.Join(t.TempDir(), "jwks.json")
			writeJWKS(t, file, k1.jwk)
			cfg := authn.JWTConfig{Issuer: testIssuer, JWKSFile: file, Leeway: time.Second, Clock: clk, Registerer: reg}
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			j, err := authn.NewJWT(cfg)
			if err != nil {
				t.Fatal(err)
			}
			tok := k1.sign(t, stdClaims(t0, func(c *jwt.Claims) { c.Expiry = jwt.NewNumericDate(t0.Add(tc.ttl)) }), k8sBound)
			hits := 0.0
			for i, s := range tc.steps {
				clk.Add(s.advance)
				if s.rotate {
					writeJWKS(t, file, k2.jwk)
					if err := j.Refresh(context.Background()); err != nil {
						t.Fatal(err)
					}
					continue
				}
				c, err := j.Authenticate(context.Background(), authn.Credentials{Token: tok})
				if s.ok != (err == nil) {
					t.Fatalf("step %d: error %v, want ok=%v", i, err, s.ok)
				}
				if err != nil {
					wantKind(t, err, ca.KindUnauthenticated, tok)
				} else {
					if c.Namespace != "prod" || c.ServiceAccount != "api" || c.Method != "jwt" || !c.Expiry.Equal(t0.Add(tc.ttl)) {
						t.Fatalf("step %d: caller %+v", i, *c)
					}
					c.Namespace = "mutated" // must not leak into the cached answer
				}
				if s.hit {
					hits++
				}
				if got := testkit.Metric(t, reg, jwtCacheHits); got != hits {
					t.Fatalf("step %d: %v cache hits, want %v", i, got, hits)
				}
			}
		})
	}
}

// Tokens that fail verification are never cached: a bad token stays bad.
func TestJWTCacheKeepsRejections(t *testing.T) {
	k1 := newHandKey(t, certs.ECP256, jose.ES256, "k1")
	clk := clock.NewFake(t0)
	reg := prometheus.NewRegistry()
	j, err := authn.NewJWT(authn.JWTConfig{Issuer: testIssuer, JWKS: &jose.JSONWebKeySet{Keys: []jose.JSONWebKey{k1.jwk}}, Clock: clk, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	// Not valid yet: rejected now, accepted once nbf has passed.
	tok := k1.sign(t, stdClaims(t0, func(c *jwt.Claims) { c.NotBefore = jwt.NewNumericDate(t0.Add(time.Minute)) }), k8sBound)
	_, err = j.Authenticate(context.Background(), authn.Credentials{Token: tok})
	wantKind(t, err, ca.KindUnauthenticated, tok)
	clk.Add(time.Minute)
	for range 2 {
		if _, err := j.Authenticate(context.Background(), authn.Credentials{Token: tok}); err != nil {
			t.Fatal(err)
		}
	}
	if got := testkit.Metric(t, reg, jwtCacheHits); got != 1 {
		t.Fatalf("%v cache hits, want 1", got)
	}
}
