package authn_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
)

// fuzzJWT is the authenticator the JWT fuzz targets attack: pinned ES256
// and RS256 keys, the test issuer, the default audience, a fake clock at t0
// and no cache (every token is verified, not remembered).
func fuzzJWT(t testing.TB, keys ...handKey) *authn.JWT {
	t.Helper()
	set := &jose.JSONWebKeySet{}
	for _, k := range keys {
		set.Keys = append(set.Keys, k.jwk)
	}
	j, err := authn.NewJWT(authn.JWTConfig{Issuer: testIssuer, JWKS: set, CacheSize: -1, Clock: clock.NewFake(t0)})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// signPayload signs payload as is (not necessarily JSON) with k.
func (h handKey) signPayload(t testing.TB, payload []byte) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: h.alg, Key: jose.JSONWebKey{Key: h.key, KeyID: h.jwk.KeyID}}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	obj, err := s.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := obj.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// checkRefused fails unless err is what Authenticate documents for a bad
// token: a *ca.Error of kind Unauthenticated whose text does not echo the
// token (tokens are credentials and errors reach logs and clients).
func checkRefused(t *testing.T, err error, token string) {
	t.Helper()
	var e *ca.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not a *ca.Error", err)
	}
	if e.Kind != ca.KindUnauthenticated {
		t.Fatalf("kind %v, want Unauthenticated: %v", e.Kind, err)
	}
	// Short tokens are substrings of ordinary words; only a token that
	// could be a credential is checked.
	if len(token) >= 16 && (strings.Contains(err.Error(), token) || strings.Contains(e.Msg, token)) {
		t.Fatalf("error echoes the token: %v", err)
	}
}

// checkAccepted fails unless the accepted token verifies independently
// with one of keys and carries the claims Authenticate promises to have
// checked: our issuer, our audience, an exp not past (within the 30s
// leeway) and matching the caller's Expiry, and a namespace and service
// account that the subject, if any, agrees with.
func checkAccepted(t *testing.T, c *authn.Caller, token string, keys ...handKey) {
	t.Helper()
	tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.ES256, jose.RS256})
	if err != nil {
		t.Fatalf("accepted a token go-jose cannot parse: %v", err)
	}
	var std jwt.Claims
	verified := false
	for _, k := range keys {
		if tok.Claims(k.key.Public(), &std) == nil {
			verified = true
			break
		}
	}
	if !verified {
		t.Fatalf("accepted a token that no trusted key verifies")
	}
	if std.Issuer != testIssuer || !slices.Contains([]string(std.Audience), authn.DefaultTokenAudience) {
		t.Fatalf("accepted iss=%q aud=%v", std.Issuer, std.Audience)
	}
	if std.Expiry == nil || !std.Expiry.Time().Add(authn.DefaultJWTLeeway).After(t0) || !c.Expiry.Equal(std.Expiry.Time()) {
		t.Fatalf("accepted exp=%v (caller expiry %v) at %v", std.Expiry, c.Expiry, t0)
	}
	if std.NotBefore != nil && std.NotBefore.Time().After(t0.Add(authn.DefaultJWTLeeway)) {
		t.Fatalf("accepted nbf=%v at %v", std.NotBefore.Time(), t0)
	}
	if c.Namespace == "" || c.ServiceAccount == "" || c.Method != "jwt" {
		t.Fatalf("accepted caller %+v", c)
	}
	if std.Subject != "" && std.Subject != "system:serviceaccount:"+c.Namespace+":"+c.ServiceAccount {
		t.Fatalf("accepted sub %q for caller %s/%s", std.Subject, c.Namespace, c.ServiceAccount)
	}
}

// FuzzJWTToken feeds arbitrary strings to the JWT authenticator as bearer
// tokens. It must never panic; an empty token is ErrNoCredentials; any other
// refusal is Unauthenticated without echoing the token; and a token it
// accepts must verify with a trusted key and carry valid claims.
func FuzzJWTToken(f *testing.F) {
	es := newHandKey(f, certs.ECP256, jose.ES256, "es")
	rs := newHandKey(f, certs.RSA2048, jose.RS256, "rs")
	foreign := newHandKey(f, certs.ECP256, jose.ES256, "es") // same kid, untrusted key
	j := fuzzJWT(f, es, rs)
	valid := es.sign(f, stdClaims(t0, nil), k8sBound)
	for _, tok := range []string{
		valid,
		rs.sign(f, stdClaims(t0, nil), k8sLegacy),
		es.sign(f, stdClaims(t0, func(c *jwt.Claims) { c.Expiry = jwt.NewNumericDate(t0.Add(-time.Hour)) }), k8sBound),
		es.sign(f, stdClaims(t0, func(c *jwt.Claims) { c.Audience = jwt.Audience{"other"} }), k8sBound),
		es.sign(f, stdClaims(t0, func(c *jwt.Claims) { c.Subject = "system:serviceaccount:prod:other" }), k8sBound),
		foreign.sign(f, stdClaims(t0, nil), k8sBound),
		valid[:len(valid)-4] + "AAAA",         // tampered signature
		valid[:strings.LastIndex(valid, ".")], // no signature
		base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + strings.Split(valid, ".")[1] + ".",
		"", "a.b.c", "...", "Bearer " + valid,
	} {
		f.Add(tok)
	}
	if _, err := j.Authenticate(context.Background(), authn.Credentials{Token: valid}); err != nil {
		f.Fatalf("the valid seed is refused: %v", err)
	}
	f.Fuzz(func(t *testing.T, token string) {
		c, err := j.Authenticate(context.Background(), authn.Credentials{Token: token})
		if token == "" {
			if !errors.Is(err, authn.ErrNoCredentials) {
				t.Fatalf("empty token: %v, want ErrNoCredentials", err)
			}
			return
		}
		if err != nil {
			checkRefused(t, err, token)
			return
		}
		checkAccepted(t, c, token, es, rs)
	})
}

// FuzzJWTClaims signs arbitrary payloads with a trusted key, so that the
// claim checks themselves are attacked: iss, aud, exp, nbf, iat, sub and
// the kubernetes.io claims in every shape JSON allows. Properties as for
// FuzzJWTToken; in particular a correctly signed token is never accepted
// with claims that do not name our issuer and audience, a live exp and a
// service account.
func FuzzJWTClaims(f *testing.F) {
	es := newHandKey(f, certs.ECP256, jose.ES256, "es")
	j := fuzzJWT(f, es)
	claims := func(mod func(map[string]any)) []byte {
		m := map[string]any{
			"iss": testIssuer, "sub": "system:serviceaccount:prod:api", "aud": []string{"istio-ca"},
			"iat": t0.Unix(), "nbf": t0.Unix(), "exp": t0.Add(time.Hour).Unix(),
			"kubernetes.io": k8sBound["kubernetes.io"],
		}
		if mod != nil {
			mod(m)
		}
		b, _ := json.Marshal(m)
		return b
	}
	for _, p := range [][]byte{
		claims(nil),
		claims(func(m map[string]any) { delete(m, "kubernetes.io"); maps(m, k8sLegacy) }),
		claims(func(m map[string]any) { m["aud"] = "istio-ca" }),
		claims(func(m map[string]any) { delete(m, "exp") }),
		claims(func(m map[string]any) { m["exp"] = int64(1) << 62 }),
		claims(func(m map[string]any) { m["exp"] = 253402300799 }), // 9999-12-31
		claims(func(m map[string]any) { m["exp"] = "tomorrow" }),
		claims(func(m map[string]any) { m["nbf"] = t0.Add(time.Hour).Unix() }),
		claims(func(m map[string]any) { m["iat"] = t0.Add(time.Hour).Unix() }),
		claims(func(m map[string]any) { m["iss"] = "https://evil.test" }),
		claims(func(m map[string]any) { m["sub"] = "system:serviceaccount:kube-system:admin" }),
		claims(func(m map[string]any) { m["kubernetes.io"] = map[string]any{"namespace": "prod"} }),
		claims(func(m map[string]any) { m["kubernetes.io"] = "prod" }),
		claims(func(m map[string]any) {
			m["kubernetes.io"] = map[string]any{"namespace": "a/b", "serviceaccount": map[string]any{"name": "../x"}}
			delete(m, "sub")
		}),
		[]byte(`{}`), []byte(`null`), []byte(`[]`), []byte(`not json`), {},
	} {
		f.Add(p)
	}
	if _, err := j.Authenticate(context.Background(), authn.Credentials{Token: es.signPayload(f, claims(nil))}); err != nil {
		f.Fatalf("the valid seed is refused: %v", err)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		tok := es.signPayload(t, payload)
		c, err := j.Authenticate(context.Background(), authn.Credentials{Token: tok})
		if err != nil {
			checkRefused(t, err, tok)
			return
		}
		checkAccepted(t, c, tok, es)
	})
}

// FuzzParseJWKS parses arbitrary key sets, as read from --jwks-file or an
// issuer's jwks_uri. It must never panic, and a set it accepts holds only
// valid public asymmetric signing keys: never a private half, a symmetric
// key, or an encryption key.
func FuzzParseJWKS(f *testing.F) {
	es := newHandKey(f, certs.ECP256, jose.ES256, "es")
	rs := newHandKey(f, certs.RSA2048, jose.RS256, "rs")
	ed := newHandKey(f, certs.Ed25519, jose.EdDSA, "ed")
	pub, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{es.jwk, rs.jwk, ed.jwk}})
	priv, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: es.key, KeyID: "p", Algorithm: "ES256"}}})
	for _, s := range [][]byte{
		pub, priv,
		[]byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"s"}]}`),
		[]byte(`{"keys":[{"kty":"EC","crv":"P-256","x":"AA","y":"AA","use":"enc"}]}`),
		[]byte(`{"keys":[]}`), []byte(`{"keys":`), []byte(`{}`), {},
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := authn.ParseJWKS(data)
		if err != nil {
			if set != nil {
				t.Fatalf("error %v with a key set", err)
			}
			return
		}
		if len(set.Keys) == 0 {
			t.Fatal("accepted an empty key set")
		}
		for _, k := range set.Keys {
			if !k.IsPublic() || !k.Valid() || k.Use == "enc" {
				t.Fatalf("accepted key %q: public=%v valid=%v use=%q (%T)", k.KeyID, k.IsPublic(), k.Valid(), k.Use, k.Key)
			}
			if _, sym := k.Key.([]byte); sym {
				t.Fatalf("accepted a symmetric key %q", k.KeyID)
			}
		}
	})
}

// maps copies src into dst.
func maps(dst, src map[string]any) {
	for k, v := range src {
		dst[k] = v
	}
}
