package authn

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/meshid/meshid/internal/clock"
)

// TestUnknownKeyRequestsRefresh: a token signed with a key id the set does
// not hold asks Run for a reload (a kick), whatever the key source that
// Run reloads (file, URL, discovery), at most once per MinRefreshInterval
// after the last load, and only for a token of the configured issuer (any
// issuer when none is configured). Run itself is tested in jwt_test.go;
// here the kick is seen on its channel, so that the throttle's boundary
// and the tokens that must not kick are checked without timing.
func TestUnknownKeyRequestsRefresh(t *testing.T) {
	const issuer = "https://issuer.test"
	known, unknown := ecKey(t, "known"), ecKey(t, "unknown")
	file := filepath.Join(t.TempDir(), "jwks.json")
	data, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{known.Public()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	token := func(iss string) string {
		sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: unknown}, nil)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(sig).Claims(jwt.Claims{Issuer: iss, Audience: jwt.Audience{DefaultTokenAudience},
			Expiry: jwt.NewNumericDate(t0.Add(time.Hour))}).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	kicked := func(j *JWT, tok string) bool {
		t.Helper()
		if _, err := j.Authenticate(context.Background(), Credentials{Token: tok}); err == nil {
			t.Fatal("a token of an unknown key accepted")
		}
		select {
		case <-j.kick:
			return true
		default:
			return false
		}
	}

	// The throttle: not before MinRefreshInterval after the last load.
	clk := clock.NewFake(t0)
	j, err := NewJWT(JWTConfig{Issuer: issuer, JWKSFile: file, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	clk.Add(DefaultJWKSMinRefresh - time.Nanosecond)
	if kicked(j, token(issuer)) {
		t.Error("a reload requested within MinRefreshInterval of the last one")
	}
	clk.Add(time.Nanosecond)
	if !kicked(j, token(issuer)) {
		t.Error("no reload requested MinRefreshInterval after the last one")
	}
	if kicked(j, token("https://other.test")) {
		t.Error("a token of another issuer requested a reload")
	}

	// Every source Run reloads; without an Issuer, a token of any issuer.
	loaded := &jose.JSONWebKeySet{Keys: []jose.JSONWebKey{known.Public()}}
	for name, cfg := range map[string]JWTConfig{
		"JWKS file, no issuer": {JWKSFile: file},
		"JWKS URL":             {Issuer: issuer, JWKSURL: "https://keys.test/jwks"},
		"discovery":            {Issuer: issuer},
	} {
		cfg.Clock = clock.NewFake(t0)
		j, err := NewJWT(cfg)
		if err != nil {
			t.Fatal(err)
		}
		j.keys.Store(loaded) // as Run's first load would
		iss := cfg.Issuer
		if iss == "" {
			iss = "https://other.test"
		}
		if !kicked(j, token(iss)) {
			t.Errorf("%s: a token of an unknown key requested no reload", name)
		}
	}
}

func ecKey(t *testing.T, kid string) jose.JSONWebKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return jose.JSONWebKey{Key: k, KeyID: kid, Algorithm: string(jose.ES256), Use: "sig"}
}
