package authn_test

import (
	"bytes"
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/devissuer"
	"github.com/meshid/meshid/testkit"
)

const testIssuer = "https://issuer.test"

// handKey is a signing key with its public JWK, for hand-made tokens.
type handKey struct {
	alg jose.SignatureAlgorithm
	key crypto.Signer
	jwk jose.JSONWebKey
}

func newHandKey(t testing.TB, kt certs.KeyType, alg jose.SignatureAlgorithm, kid string) handKey {
	t.Helper()
	k, err := certs.GenerateKey(kt)
	if err != nil {
		t.Fatal(err)
	}
	return handKey{alg: alg, key: k, jwk: jose.JSONWebKey{Key: k.Public(), KeyID: kid, Algorithm: string(alg), Use: "sig"}}
}

// sign makes a compact JWS over claims (each value is JSON-marshalled).
func (h handKey) sign(t testing.TB, claims ...any) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: h.alg, Key: jose.JSONWebKey{Key: h.key, KeyID: h.jwk.KeyID}}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	b := jwt.Signed(s)
	for _, c := range claims {
		b = b.Claims(c)
	}
	tok, err := b.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func stdClaims(now time.Time, mod func(*jwt.Claims)) jwt.Claims {
	c := jwt.Claims{
		Issuer:    testIssuer,
		Subject:   "system:serviceaccount:prod:api",
		Audience:  jwt.Audience{"istio-ca"},
		IssuedAt:  jwt.NewNumericDate(now),
		NotBefore: jwt.NewNumericDate(now),
		Expiry:    jwt.NewNumericDate(now.Add(time.Hour)),
	}
	if mod != nil {
		mod(&c)
	}
	return c
}

var k8sBound = map[string]any{"kubernetes.io": map[string]any{
	"namespace":      "prod",
	"serviceaccount": map[string]string{"name": "api", "uid": "u1"},
	"pod":            map[string]string{"name": "api-7d9", "uid": "p1"},
	"node":           map[string]string{"name": "node-a", "uid": "n1"},
}}

var k8sLegacy = map[string]any{
	"kubernetes.io/serviceaccount/namespace":            "prod",
	"kubernetes.io/serviceaccount/service-account.name": "api",
}

func TestJWT(t *testing.T) {
	es256 := newHandKey(t, certs.ECP256, jose.ES256, "es256")
	es384 := newHandKey(t, certs.ECP384, jose.ES384, "es384")
	rs256 := newHandKey(t, certs.RSA2048, jose.RS256, "rs256")
	foreign := newHandKey(t, certs.ECP256, jose.ES256, "foreign")
	impostor := newHandKey(t, certs.ECP256, jose.ES256, "es256") // same kid, other key
	nokid := newHandKey(t, certs.ECP256, jose.ES256, "")
	// noalg's JWK names no alg: it verifies any alg of its key type.
	noalg := newHandKey(t, certs.ECP256, jose.ES256, "noalg")
	noalg.jwk.Algorithm = ""
	// otherAlg signs ES256 tokens under the kid of the RS256 key.
	otherAlg := newHandKey(t, certs.ECP256, jose.ES256, "rs256")
	dev, err := devissuer.New(mustKey(t), "") // the default dev issuer URL, not testIssuer
	if err != nil {
		t.Fatal(err)
	}
	jwks := &jose.JSONWebKeySet{Keys: append([]jose.JSONWebKey{es256.jwk, es384.jwk, rs256.jwk, noalg.jwk}, dev.JWKS().Keys...)}

	now := t0
	unsigned := func(claims any) string {
		h := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
		p, _ := json.Marshal(claims)
		return h + "." + base64.RawURLEncoding.EncodeToString(p) + "."
	}
	hs256 := func() string {
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte("0123456789abcdef0123456789abcdef")}, nil)
		if err != nil {
			t.Fatal(err)
		}
		tok, _ := jwt.Signed(s).Claims(stdClaims(now, nil)).Claims(k8sBound).Serialize()
		return tok
	}()

	tests := []struct {
		name   string
		token  string
		want   *authn.Caller
		kind   ca.Kind
		msg    string
		legacy bool
	}{
		{name: "ES256", token: es256.sign(t, stdClaims(now, nil), k8sBound),
			want: &authn.Caller{Namespace: "prod", ServiceAccount: "api", PodName: "api-7d9", PodUID: "p1", NodeName: "node-a", Method: "jwt"}},
		{name: "ES384", token: es384.sign(t, stdClaims(now, nil), k8sBound),
			want: &authn.Caller{Namespace: "prod", ServiceAccount: "api", PodName: "api-7d9", PodUID: "p1", NodeName: "node-a", Method: "jwt"}},
		{name: "RS256", token: rs256.sign(t, stdClaims(now, nil), k8sBound),
			want: &authn.Caller{Namespace: "prod", ServiceAccount: "api", PodName: "api-7d9", PodUID: "p1", NodeName: "node-a", Method: "jwt"}},
		{name: "legacy claims", token: es256.sign(t, stdClaims(now, nil), k8sLegacy),
			want: &authn.Caller{Namespace: "prod", ServiceAccount: "api", Method: "jwt"}},
		{name: "any of audiences", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.Audience = jwt.Audience{"x", "istio-ca"} }), k8sBound),
			want: &authn.Caller{Namespace: "prod", ServiceAccount: "api", PodName: "api-7d9", PodUID: "p1", NodeName: "node-a", Method: "jwt"}},
		{name: "expired within leeway", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.Expiry = jwt.NewNumericDate(now.Add(-20 * time.Second)) }), k8sBound),
			want: &authn.Caller{Namespace: "prod", ServiceAccount: "api", PodName: "api-7d9", PodUID: "p1", NodeName: "node-a", Method: "jwt"}},
		{name: "expired", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.Expiry = jwt.NewNumericDate(now.Add(-time.Minute)) }), k8sBound),
			kind: ca.KindUnauthenticated, msg: "expired"},
		{name: "not yet valid", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.NotBefore = jwt.NewNumericDate(now.Add(2 * time.Minute)) }), k8sBound),
			kind: ca.KindUnauthenticated, msg: "not valid yet"},
		{name: "issued in the future", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.IssuedAt = jwt.NewNumericDate(now.Add(2 * time.Minute)) }), k8sBound),
			kind: ca.KindUnauthenticated, msg: "issued in the future"},
		// Issue 9, hole 12: a token that lives for ever is refused (on
		// b96f7b0 the year-9999 one was accepted), and an exp go-jose
		// cannot decode is an invalid expiry, not a bad signature.
		{name: "exp in the year 9999", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.Expiry = jwt.NewNumericDate(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)) }), k8sBound),
			kind: ca.KindUnauthenticated, msg: "more than the 48h0m0s allowed"},
		{name: "exp 48h past iat", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.Expiry = jwt.NewNumericDate(now.Add(48 * time.Hour)) }), k8sBound),
			want: &authn.Caller{Namespace: "prod", ServiceAccount: "api", PodName: "api-7d9", PodUID: "p1", NodeName: "node-a", Method: "jwt"}},
		// The limit has the leeway too: 48h30s is the longest accepted.
		{name: "exp 48h+leeway past iat", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) {
			c.Expiry = jwt.NewNumericDate(now.Add(48*time.Hour + authn.DefaultJWTLeeway))
		}), k8sBound), want: &authn.Caller{Namespace: "prod", ServiceAccount: "api", PodName: "api-7d9", PodUID: "p1", NodeName: "node-a", Method: "jwt"}},
		{name: "exp 48h+leeway+1s past iat", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) {
			c.Expiry = jwt.NewNumericDate(now.Add(48*time.Hour + authn.DefaultJWTLeeway + time.Second))
		}), k8sBound), kind: ca.KindUnauthenticated, msg: "more than the 48h0m0s allowed"},
		// The lifetime runs from iat, not from now; from now without iat.
		{name: "iat 2h ago, exp 47h from now", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) {
			c.IssuedAt = jwt.NewNumericDate(now.Add(-2 * time.Hour))
			c.Expiry = jwt.NewNumericDate(now.Add(47 * time.Hour))
		}), k8sBound), kind: ca.KindUnauthenticated, msg: "more than the 48h0m0s allowed"},
		{name: "no iat, exp 1h from now", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.IssuedAt = nil }), k8sBound),
			want: &authn.Caller{Namespace: "prod", ServiceAccount: "api", PodName: "api-7d9", PodUID: "p1", NodeName: "node-a", Method: "jwt"}},
		{name: "exp 49h past iat", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.Expiry = jwt.NewNumericDate(now.Add(49 * time.Hour)) }), k8sBound),
			kind: ca.KindUnauthenticated, msg: "more than the 48h0m0s allowed"},
		{name: "no iat, exp 49h from now", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) {
			c.IssuedAt = nil
			c.Expiry = jwt.NewNumericDate(now.Add(49 * time.Hour))
		}), k8sBound), kind: ca.KindUnauthenticated, msg: "more than the 48h0m0s allowed"},
		{name: "exp 2^62", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.Expiry = nil }), map[string]any{"exp": int64(1) << 62}, k8sBound),
			kind: ca.KindUnauthenticated, msg: "invalid expiry (exp)"},
		{name: "no expiry", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.Expiry = nil }), k8sBound),
			kind: ca.KindUnauthenticated, msg: "no expiry"},
		{name: "wrong audience", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.Audience = jwt.Audience{"kubernetes"} }), k8sBound),
			kind: ca.KindUnauthenticated, msg: "audience"},
		{name: "wrong issuer", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.Issuer = "https://evil.test" }), k8sBound),
			kind: ca.KindUnauthenticated, msg: "issuer"},
		{name: "foreign key", token: foreign.sign(t, stdClaims(now, nil), k8sBound),
			kind: ca.KindUnauthenticated, msg: "unknown key"},
		{name: "foreign key without kid", token: nokid.sign(t, stdClaims(now, nil), k8sBound),
			kind: ca.KindUnauthenticated, msg: "bad token signature"},
		{name: "key without alg", token: noalg.sign(t, stdClaims(now, nil), k8sBound),
			want: &authn.Caller{Namespace: "prod", ServiceAccount: "api", PodName: "api-7d9", PodUID: "p1", NodeName: "node-a", Method: "jwt"}},
		{name: "known kid, other alg", token: otherAlg.sign(t, stdClaims(now, nil), k8sBound),
			kind: ca.KindUnauthenticated, msg: "unknown key"},
		{name: "impostor with a known kid", token: impostor.sign(t, stdClaims(now, nil), k8sBound),
			kind: ca.KindUnauthenticated, msg: "bad token signature"},
		{name: "alg none", token: unsigned(map[string]any{"iss": testIssuer, "aud": "istio-ca", "exp": now.Add(time.Hour).Unix(), "kubernetes.io": k8sBound["kubernetes.io"]}),
			kind: ca.KindUnauthenticated, msg: "not a JWT"},
		{name: "HS256", token: hs256, kind: ca.KindUnauthenticated, msg: "not a JWT"},
		{name: "garbage", token: "abc.def", kind: ca.KindUnauthenticated, msg: "not a JWT"},
		{name: "tampered payload", token: func() string {
			p := strings.Split(es256.sign(t, stdClaims(now, nil), k8sBound), ".")
			c, _ := json.Marshal(map[string]any{"iss": testIssuer, "aud": "istio-ca", "exp": now.Add(time.Hour).Unix(),
				"kubernetes.io": map[string]any{"namespace": "kube-system", "serviceaccount": map[string]string{"name": "admin"}}})
			return p[0] + "." + base64.RawURLEncoding.EncodeToString(c) + "." + p[2]
		}(), kind: ca.KindUnauthenticated, msg: "bad token signature"},
		{name: "missing kubernetes claims", token: es256.sign(t, stdClaims(now, nil)),
			kind: ca.KindUnauthenticated, msg: "kubernetes.io"},
		{name: "service account missing", token: es256.sign(t, stdClaims(now, nil), map[string]any{"kubernetes.io": map[string]any{"namespace": "prod"}}),
			kind: ca.KindUnauthenticated, msg: "kubernetes.io"},
		{name: "subject mismatch", token: es256.sign(t, stdClaims(now, func(c *jwt.Claims) { c.Subject = "system:serviceaccount:kube-system:admin" }), k8sBound),
			kind: ca.KindUnauthenticated, msg: "subject"},
		{name: "dev issuer token", token: func() string {
			d, err := devissuer.New(mustKey(t), testIssuer)
			if err != nil {
				t.Fatal(err)
			}
			jwks.Keys = append(jwks.Keys, d.JWKS().Keys...)
			return mint(t, d, "default", "default", []string{"istio-ca"}, time.Hour, now)
		}(), want: &authn.Caller{Namespace: "default", ServiceAccount: "default", Method: "jwt"}},
		{name: "dev issuer, other issuer URL", token: mint(t, dev, "default", "default", []string{"istio-ca"}, time.Hour, now),
			kind: ca.KindUnauthenticated, msg: "issuer"},
	}
	j, err := authn.NewJWT(authn.JWTConfig{Issuer: testIssuer, JWKS: jwks, Clock: clock.NewFake(now)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := j.Authenticate(context.Background(), authn.Credentials{Token: tc.token})
			if tc.want != nil {
				if err != nil {
					t.Fatal(err)
				}
				if c.Expiry.IsZero() {
					t.Fatal("caller has no expiry")
				}
				c.Expiry = time.Time{}
				if *c != *tc.want {
					t.Fatalf("caller %+v, want %+v", *c, *tc.want)
				}
				return
			}
			wantKind(t, err, tc.kind, tc.token)
			var e *ca.Error
			errors.As(err, &e)
			if !strings.Contains(e.Msg, tc.msg) {
				t.Fatalf("message %q lacks %q", e.Msg, tc.msg)
			}
		})
	}
	if _, err := j.Authenticate(context.Background(), authn.Credentials{}); !errors.Is(err, authn.ErrNoCredentials) {
		t.Fatalf("no token: %v, want ErrNoCredentials", err)
	}
}

func mustKey(t *testing.T) crypto.Signer {
	t.Helper()
	k, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestJWTFromDevIssuerFiles(t *testing.T) {
	dir := t.TempDir()
	iss, err := devissuer.LoadOrCreate(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	j, err := authn.NewJWT(authn.JWTConfig{Issuer: iss.Issuer(), JWKSFile: filepath.Join(dir, devissuer.JWKSFile)})
	if err != nil {
		t.Fatal(err)
	}
	tok := mint(t, iss, "team-a", "worker", []string{"istio-ca"}, time.Hour, time.Now())
	c, err := j.Authenticate(context.Background(), authn.Credentials{Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	if c.Namespace != "team-a" || c.ServiceAccount != "worker" {
		t.Fatalf("caller %+v", c)
	}
}

func TestJWTPinnedKeysAnyIssuer(t *testing.T) {
	dir := t.TempDir()
	iss, err := devissuer.LoadOrCreate(dir, "https://some.cluster")
	if err != nil {
		t.Fatal(err)
	}
	j, err := authn.NewJWT(authn.JWTConfig{JWKSFile: filepath.Join(dir, devissuer.JWKSFile)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Authenticate(context.Background(), authn.Credentials{Token: mint(t, iss, "a", "b", []string{"istio-ca"}, time.Hour, time.Now())}); err != nil {
		t.Fatal(err)
	}
	other := newIssuer(t) // another key: still refused
	tok := mint(t, other, "a", "b", []string{"istio-ca"}, time.Hour, time.Now())
	_, err = j.Authenticate(context.Background(), authn.Credentials{Token: tok})
	wantKind(t, err, ca.KindUnauthenticated, tok)
}

func TestJWTConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sym := write("sym.json", `{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"s"}]}`)
	bad := write("bad.json", `{"keys":`)
	// The fixture itself: the same issuer with a good key file is accepted,
	// so each case below is refused for its own defect.
	good := filepath.Join(dir, "good.json")
	writeJWKS(t, good, newHandKey(t, certs.ECP256, jose.ES256, "k1").jwk)
	if _, err := authn.NewJWT(authn.JWTConfig{Issuer: testIssuer, JWKSFile: good}); err != nil {
		t.Fatalf("a good JWKS file refused: %v", err)
	}
	tests := []struct {
		name string
		cfg  authn.JWTConfig
	}{
		{"no issuer and no keys", authn.JWTConfig{}},
		{"empty JWKS", authn.JWTConfig{Issuer: testIssuer, JWKS: &jose.JSONWebKeySet{}}},
		{"symmetric key only", authn.JWTConfig{Issuer: testIssuer, JWKSFile: sym}},
		{"malformed file", authn.JWTConfig{Issuer: testIssuer, JWKSFile: bad}},
		{"missing file", authn.JWTConfig{Issuer: testIssuer, JWKSFile: filepath.Join(dir, "nope.json")}},
		{"issuer not a URL and no keys", authn.JWTConfig{Issuer: "kubernetes/serviceaccount"}},
		{"negative leeway", authn.JWTConfig{Issuer: testIssuer, Leeway: -time.Second, JWKSURL: "https://x"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := authn.NewJWT(tc.cfg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// oidcServer serves discovery and a JWKS that the test can swap; every
// JWKS fetch is reported on fetched.
type oidcServer struct {
	*httptest.Server
	mu      sync.Mutex
	jwks    *jose.JSONWebKeySet
	status  int // when set, the JWKS is answered with this status instead
	fetched chan struct{}
}

// waitFetched waits for the next JWKS fetch, failing t after testkit.Guard:
// a verifier whose discovery keeps failing fails the test instead of hanging
// it.
func (s *oidcServer) waitFetched(t *testing.T) {
	t.Helper()
	select {
	case <-s.fetched:
	case <-time.After(testkit.Guard):
		t.Fatalf("no JWKS fetch within %v", testkit.Guard)
	}
}

func newOIDCServer(t *testing.T) *oidcServer {
	s := &oidcServer{fetched: make(chan struct{}, 16)}
	mux := http.NewServeMux()
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]string{"issuer": s.URL, "jwks_uri": s.URL + "/keys"})
	})
	mux.HandleFunc("/keys", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.status != 0 {
			w.WriteHeader(s.status)
		} else {
			json.NewEncoder(w).Encode(s.jwks)
		}
		s.mu.Unlock()
		s.fetched <- struct{}{}
	})
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func (s *oidcServer) set(set *jose.JSONWebKeySet) {
	s.mu.Lock()
	s.jwks = set
	s.mu.Unlock()
}

// fail makes the JWKS answer status (0: serve the key set again).
func (s *oidcServer) fail(status int) {
	s.mu.Lock()
	s.status = status
	s.mu.Unlock()
}

func TestJWTDiscoveryAndRotation(t *testing.T) {
	srv := newOIDCServer(t)
	k1 := newHandKey(t, certs.ECP256, jose.ES256, "k1")
	k2 := newHandKey(t, certs.ECP256, jose.ES256, "k2")
	srv.set(&jose.JSONWebKeySet{Keys: []jose.JSONWebKey{k1.jwk}})
	clk := clock.NewFake(t0)
	j, err := authn.NewJWT(authn.JWTConfig{Issuer: srv.URL, Clock: clk, HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	claims := func() jwt.Claims { return stdClaims(t0, func(c *jwt.Claims) { c.Issuer = srv.URL }) }
	tok1 := k1.sign(t, claims(), k8sBound)
	tok2 := k2.sign(t, claims(), k8sBound)

	// Before Run has loaded keys, tokens cannot be judged.
	_, err = j.Authenticate(context.Background(), authn.Credentials{Token: tok1})
	wantKind(t, err, ca.KindUnavailable, tok1)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- j.Run(ctx) }()
	srv.waitFetched(t)
	testkit.WaitForTimers(t, clk, 1, "the JWKS refresh timer") // Run stored the keys and parks on it
	if _, err := j.Authenticate(context.Background(), authn.Credentials{Token: tok1}); err != nil {
		t.Fatal(err)
	}

	// The issuer rotates to k2. A k2 token is unknown; it triggers a
	// reload (throttled: only once MinRefreshInterval has passed).
	srv.set(&jose.JSONWebKeySet{Keys: []jose.JSONWebKey{k1.jwk, k2.jwk}})
	clk.Add(authn.DefaultJWKSMinRefresh)
	_, err = j.Authenticate(context.Background(), authn.Credentials{Token: tok2})
	wantKind(t, err, ca.KindUnauthenticated, tok2)
	srv.waitFetched(t)
	testkit.WaitForTimers(t, clk, 1, "the JWKS refresh timer")
	if _, err := j.Authenticate(context.Background(), authn.Credentials{Token: tok2}); err != nil {
		t.Fatalf("after reload: %v", err)
	}

	// The periodic refresh drops k1.
	srv.set(&jose.JSONWebKeySet{Keys: []jose.JSONWebKey{k2.jwk}})
	clk.Add(authn.DefaultJWKSRefresh)
	srv.waitFetched(t)
	testkit.WaitForTimers(t, clk, 1, "the JWKS refresh timer")
	_, err = j.Authenticate(context.Background(), authn.Credentials{Token: tok1})
	wantKind(t, err, ca.KindUnauthenticated, tok1)

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestJWTMaxTokenLifetime: the lifetime limit is configurable, and a
// negative one accepts any exp.
func TestJWTMaxTokenLifetime(t *testing.T) {
	k := newHandKey(t, certs.ECP256, jose.ES256, "k")
	tok := k.sign(t, stdClaims(t0, func(c *jwt.Claims) { c.Expiry = jwt.NewNumericDate(t0.Add(72 * time.Hour)) }), k8sBound)
	for _, tc := range []struct {
		max time.Duration
		ok  bool
	}{{0, false}, {time.Hour, false}, {72 * time.Hour, true}, {-1, true}} {
		j, err := authn.NewJWT(authn.JWTConfig{Issuer: testIssuer, JWKS: &jose.JSONWebKeySet{Keys: []jose.JSONWebKey{k.jwk}}, MaxTokenLifetime: tc.max, Clock: clock.NewFake(t0)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := j.Authenticate(context.Background(), authn.Credentials{Token: tok}); (err == nil) != tc.ok {
			t.Errorf("MaxTokenLifetime %v: err %v, want ok=%v", tc.max, err, tc.ok)
		}
	}
}

// TestJWKSFileSizeLimit: a JWKS file of exactly 1 MiB (a key set padded
// with whitespace) is read whole and accepted; one byte more is refused
// with an error that names the limit, not a truncated-JSON error.
func TestJWKSFileSizeLimit(t *testing.T) {
	dir := t.TempDir()
	iss, err := devissuer.LoadOrCreate(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	set, err := os.ReadFile(filepath.Join(dir, devissuer.JWKSFile))
	if err != nil {
		t.Fatal(err)
	}
	const limit = 1 << 20
	for _, size := range []int{limit, limit + 1} {
		file := filepath.Join(dir, fmt.Sprintf("jwks-%d.json", size))
		padded := append(bytes.Repeat([]byte(" "), size-len(set)), set...)
		if err := os.WriteFile(file, padded, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := authn.NewJWT(authn.JWTConfig{Issuer: iss.Issuer(), JWKSFile: file})
		switch {
		case size == limit && err != nil:
			t.Fatalf("a %d-byte JWKS file refused: %v", size, err)
		case size > limit && (err == nil || !strings.Contains(err.Error(), "larger than")):
			t.Fatalf("a %d-byte JWKS file: err = %v, want one naming the size limit", size, err)
		}
	}
}

// TestJWKSURLSizeLimit: the same limit on a JWKS fetched from a URL (and
// on a discovery document, read by the same code): a body of exactly 1 MiB
// is read whole and loaded; one byte more is refused by size.
func TestJWKSURLSizeLimit(t *testing.T) {
	k := newHandKey(t, certs.ECP256, jose.ES256, "k")
	set, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{k.jwk}})
	if err != nil {
		t.Fatal(err)
	}
	const limit = 1 << 20
	for _, size := range []int{limit, limit + 1} {
		body := append(bytes.Repeat([]byte(" "), size-len(set)), set...)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) }))
		j, err := authn.NewJWT(authn.JWTConfig{JWKSURL: srv.URL, HTTPClient: srv.Client()})
		if err != nil {
			t.Fatal(err)
		}
		err = j.Refresh(context.Background())
		srv.Close()
		switch {
		case size == limit && err != nil:
			t.Fatalf("a %d-byte JWKS refused: %v", size, err)
		case size > limit && (err == nil || !strings.Contains(err.Error(), "larger than")):
			t.Fatalf("a %d-byte JWKS: err = %v, want one naming the size limit", size, err)
		}
	}
}
