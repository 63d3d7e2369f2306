package authn_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
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

// runJWT runs j.Run until the test ends, and fails the test if Run returns
// an error or before it is stopped.
func runJWT(t *testing.T, j *authn.JWT) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- j.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// TestJWTPinnedKeysWithoutIssuer: each pinned key source (a JWKS, a JWKS
// file, a JWKS URL) is accepted without an Issuer, and its key then
// verifies a token of any iss. The JWKS URL is served over TLS that only
// the configured HTTPClient trusts: the client given is the one used.
func TestJWTPinnedKeysWithoutIssuer(t *testing.T) {
	k := newHandKey(t, certs.ECP256, jose.ES256, "k")
	set := &jose.JSONWebKeySet{Keys: []jose.JSONWebKey{k.jwk}}
	file := filepath.Join(t.TempDir(), "jwks.json")
	writeJWKS(t, file, k.jwk)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(set)
	}))
	t.Cleanup(srv.Close)
	tok := k.sign(t, stdClaims(t0, func(c *jwt.Claims) { c.Issuer = "https://any.issuer.test" }), k8sBound)
	for _, tc := range []struct {
		name string
		cfg  authn.JWTConfig
	}{
		{"JWKS", authn.JWTConfig{JWKS: set}},
		{"JWKS file", authn.JWTConfig{JWKSFile: file}},
		{"JWKS URL", authn.JWTConfig{JWKSURL: srv.URL + "/keys", HTTPClient: srv.Client()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			tc.cfg.Clock = clk
			j, err := authn.NewJWT(tc.cfg)
			if err != nil {
				t.Fatalf("NewJWT without Issuer: %v", err)
			}
			if tc.cfg.JWKSURL != "" {
				runJWT(t, j)
				// Run parks on its timer once the first load is done.
				testkit.WaitForTimers(t, clk, 1, "the JWKS refresh timer")
			}
			if _, err := j.Authenticate(context.Background(), authn.Credentials{Token: tok}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestJWTIssuerDiscoveryConfig: without a pinned key source the Issuer is
// where the keys are discovered, so it must be an http(s) URL with a host;
// with neither, NewJWT names what is missing.
func TestJWTIssuerDiscoveryConfig(t *testing.T) {
	for _, iss := range []string{"https://issuer.test", "http://issuer.test:8080/path"} {
		if _, err := authn.NewJWT(authn.JWTConfig{Issuer: iss}); err != nil {
			t.Errorf("issuer %q refused: %v", iss, err)
		}
	}
	for _, iss := range []string{"ftp://issuer.test", "https://", "kubernetes/serviceaccount", "https://%zz"} {
		_, err := authn.NewJWT(authn.JWTConfig{Issuer: iss})
		if err == nil || !strings.Contains(err.Error(), "is not an http(s) URL") {
			t.Errorf("issuer %q: err = %v, want one saying it is not an http(s) URL", iss, err)
		}
	}
	_, err := authn.NewJWT(authn.JWTConfig{})
	if err == nil || !strings.Contains(err.Error(), "needs an Issuer") {
		t.Errorf("no issuer and no keys: err = %v, want one naming what is missing", err)
	}
	if _, err := authn.NewJWT(authn.JWTConfig{JWKSURL: "https://keys.test/%zz"}); err == nil || !strings.Contains(err.Error(), "JWKS URL") {
		t.Errorf("malformed JWKS URL: err = %v", err)
	}
}

// TestJWTFileReload: Run re-reads a JWKS file every RefreshInterval.
func TestJWTFileReload(t *testing.T) {
	k1 := newHandKey(t, certs.ECP256, jose.ES256, "k1")
	k2 := newHandKey(t, certs.ECP256, jose.ES256, "k2")
	file := filepath.Join(t.TempDir(), "jwks.json")
	writeJWKS(t, file, k1.jwk)
	clk := clock.NewFake(t0)
	j, err := authn.NewJWT(authn.JWTConfig{Issuer: testIssuer, JWKSFile: file, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	tok1 := k1.sign(t, stdClaims(t0, nil), k8sBound)
	tok2 := k2.sign(t, stdClaims(t0, nil), k8sBound)
	runJWT(t, j)
	if d := testkit.NextDeadline(t, clk, "the JWKS refresh timer"); !d.Equal(t0.Add(authn.DefaultJWKSRefresh)) {
		t.Fatalf("next reload at %v, want %v", d, t0.Add(authn.DefaultJWKSRefresh))
	}
	writeJWKS(t, file, k2.jwk)
	clk.Add(authn.DefaultJWKSRefresh)
	testkit.WaitForTimers(t, clk, 1, "the JWKS refresh timer after the reload")
	if _, err := j.Authenticate(context.Background(), authn.Credentials{Token: tok2}); err != nil {
		t.Fatalf("the new file's key: %v", err)
	}
	_, err = j.Authenticate(context.Background(), authn.Credentials{Token: tok1})
	wantKind(t, err, ca.KindUnauthenticated, tok1)
}

// TestJWTRefreshRetry: Run retries a failed load after MinRefreshInterval
// while it has no keys, and keeps running; once it has keys, a failed
// reload keeps them and the next try is a full RefreshInterval later. The
// HTTPClient is the default one.
func TestJWTRefreshRetry(t *testing.T) {
	srv := newOIDCServer(t)
	k := newHandKey(t, certs.ECP256, jose.ES256, "k")
	srv.set(&jose.JSONWebKeySet{Keys: []jose.JSONWebKey{k.jwk}})
	srv.fail(http.StatusInternalServerError)
	clk := clock.NewFake(t0)
	reg := prometheus.NewRegistry()
	j, err := authn.NewJWT(authn.JWTConfig{Issuer: srv.URL, Clock: clk, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	tok := k.sign(t, stdClaims(t0, func(c *jwt.Claims) { c.Issuer = srv.URL; c.Expiry = jwt.NewNumericDate(t0.Add(24 * time.Hour)) }), k8sBound)
	refreshes := func(result string) float64 {
		v, _ := testkit.LookupMetric(t, reg, "meshid_ca_jwks_refreshes_total", "result", result)
		return v
	}
	wantNext := func(want time.Time, what string) {
		t.Helper()
		if d := testkit.NextDeadline(t, clk, what); !d.Equal(want) {
			t.Fatalf("%s at %v, want %v", what, d, want)
		}
	}

	runJWT(t, j)
	wantNext(t0.Add(authn.DefaultJWKSMinRefresh), "the retry without keys")
	_, err = j.Authenticate(context.Background(), authn.Credentials{Token: tok})
	wantKind(t, err, ca.KindUnavailable, tok)

	srv.fail(0)
	clk.Add(authn.DefaultJWKSMinRefresh)
	now := t0.Add(authn.DefaultJWKSMinRefresh)
	wantNext(now.Add(authn.DefaultJWKSRefresh), "the refresh after the first load")
	if _, err := j.Authenticate(context.Background(), authn.Credentials{Token: tok}); err != nil {
		t.Fatal(err)
	}

	srv.fail(http.StatusServiceUnavailable)
	clk.Add(authn.DefaultJWKSRefresh)
	now = now.Add(authn.DefaultJWKSRefresh)
	wantNext(now.Add(authn.DefaultJWKSRefresh), "the refresh after a failed reload with keys")
	if _, err := j.Authenticate(context.Background(), authn.Credentials{Token: tok}); err != nil {
		t.Fatalf("the keys of the last good load were dropped: %v", err)
	}
	if ok, bad := refreshes("ok"), refreshes("error"); ok != 1 || bad != 2 {
		t.Fatalf("refreshes: %v ok, %v error; want 1 and 2", ok, bad)
	}
}
