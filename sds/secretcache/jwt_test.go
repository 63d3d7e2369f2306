package secretcache_test

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/sds/secretcache"
	"github.com/meshid/meshid/testkit"
)

// countingJWT counts the CA calls of a testkit.JWTSigner.
type countingJWT struct {
	testkit.JWTSigner
	mints, fetches atomic.Int64
}

func (c *countingJWT) MintJWTSVID(ctx context.Context, id spiffeid.ID, aud []string) (string, error) {
	c.mints.Add(1)
	return c.JWTSigner.MintJWTSVID(ctx, id, aud)
}

func (c *countingJWT) FetchJWTBundles(ctx context.Context) (map[string][]byte, error) {
	c.fetches.Add(1)
	return c.JWTSigner.FetchJWTBundles(ctx)
}

// jwtFixture is a Manager whose JWT signer is a real jwtissuer on the
// fixture's fake clock.
func jwtFixture(t *testing.T, mod func(*secretcache.Config)) (*fixture, *countingJWT) {
	t.Helper()
	var signer *countingJWT
	f := newFixture(t, func(cfg *secretcache.Config) {
		iss, err := jwtissuer.New(jwtissuer.Config{TrustDomain: testTD, Clock: cfg.Clock})
		if err != nil {
			t.Fatal(err)
		}
		signer = &countingJWT{JWTSigner: testkit.JWTSigner{Issuer: iss}}
		cfg.JWTSigner = signer
		if mod != nil {
			mod(cfg)
		}
	})
	return f, signer
}

func TestJWTSVIDCachedPerAudienceSetUntilHalfLife(t *testing.T) {
	f, ca := jwtFixture(t, nil)
	ctx := t.Context()
	first, err := f.m.JWTSVID(ctx, []string{"orders", "payments"})
	if err != nil {
		t.Fatal(err)
	}
	if first.ID != testID || first.Expiry.Sub(f.clock.Now()) != jwtissuer.DefaultTTL {
		t.Fatalf("svid %s expires %s", first.ID, first.Expiry)
	}
	// The same set in another order, with a duplicate: the cached token.
	again, err := f.m.JWTSVID(ctx, []string{"payments", "orders", "orders"})
	if err != nil || again.Token != first.Token || ca.mints.Load() != 1 {
		t.Fatalf("same set: %v, same token %v, %d CA calls", err, again.Token == first.Token, ca.mints.Load())
	}
	if _, err := f.m.JWTSVID(ctx, []string{"orders"}); err != nil || ca.mints.Load() != 2 {
		t.Fatalf("another set: %v, %d CA calls", err, ca.mints.Load())
	}
	f.clock.Add(jwtissuer.DefaultTTL/2 - time.Second)
	if s, _ := f.m.JWTSVID(ctx, []string{"orders", "payments"}); s.Token != first.Token {
		t.Error("renewed before half its life")
	}
	f.clock.Add(time.Second)
	renewed, err := f.m.JWTSVID(ctx, []string{"orders", "payments"})
	if err != nil || renewed.Token == first.Token {
		t.Fatalf("not renewed at half its life: %v", err)
	}
}

// TestJWTSVIDCacheBounded: 10,000 distinct audiences leave at most
// DefaultMaxJWTSVIDs tokens cached.
func TestJWTSVIDCacheBounded(t *testing.T) {
	f, ca := jwtFixture(t, nil)
	for n := range 10_000 {
		if _, err := f.m.JWTSVID(t.Context(), []string{fmt.Sprint("aud-", n)}); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.m.JWTSVIDsCached(); got != secretcache.DefaultMaxJWTSVIDs {
		t.Errorf("%d cached, want the cap %d", got, secretcache.DefaultMaxJWTSVIDs)
	}
	// The most recent is still cached, the oldest was dropped.
	before := ca.mints.Load()
	f.m.JWTSVID(t.Context(), []string{"aud-9999"})
	f.m.JWTSVID(t.Context(), []string{"aud-0"})
	if got := ca.mints.Load() - before; got != 1 {
		t.Errorf("%d CA calls for the newest and the oldest, want 1 (the oldest)", got)
	}
}

func TestJWTSVIDAudienceLimits(t *testing.T) {
	f, ca := jwtFixture(t, nil)
	for name, aud := range map[string][]string{
		"none":     nil,
		"empty":    {""},
		"huge":     {strings.Repeat("a", 1<<20)},
		"too many": strings.Split(strings.Repeat("a,", secretcache.MaxJWTAudiences), ","),
		"not utf8": {"\xff"},
	} {
		if _, err := f.m.JWTSVID(t.Context(), aud); !errors.Is(err, secretcache.ErrInvalidAudience) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	if ca.mints.Load() != 0 {
		t.Errorf("%d CA calls for refused audiences", ca.mints.Load())
	}
}

// TestJWTSVIDWrongAnswerRefused: a CA answer for other audiences, or for
// another identity, is neither cached nor returned.
func TestJWTSVIDWrongAnswerRefused(t *testing.T) {
	var iss *jwtissuer.Issuer
	other := spiffeid.RequireFromPath(testTD, "/ns/kube-system/sa/admin")
	answer := func(id spiffeid.ID, aud []string) (string, error) { return "", nil }
	f, _ := jwtFixture(t, func(cfg *secretcache.Config) {
		s := cfg.JWTSigner.(*countingJWT)
		iss = s.Issuer
		s.JWTSigner.Mint = func(id spiffeid.ID, aud []string) (string, error) { return answer(id, aud) }
	})
	for name, a := range map[string]func(spiffeid.ID, []string) (string, error){
		"other audience": func(id spiffeid.ID, _ []string) (string, error) {
			tok, err := iss.Issue(id, []string{"elsewhere"})
			return tok.Token, err
		},
		"other identity": func(_ spiffeid.ID, aud []string) (string, error) {
			tok, err := iss.Issue(other, aud)
			return tok.Token, err
		},
		"extra audience": func(id spiffeid.ID, aud []string) (string, error) {
			tok, err := iss.Issue(id, append(aud, "evil"))
			return tok.Token, err
		},
		"garbage": func(spiffeid.ID, []string) (string, error) { return "not.a.jwt", nil },
	} {
		answer = a
		if _, err := f.m.JWTSVID(t.Context(), []string{"orders"}); !errors.Is(err, secretcache.ErrInvalidJWT) {
			t.Errorf("%s: err = %v, want ErrInvalidJWT", name, err)
		}
	}
	if f.m.JWTSVIDsCached() != 0 {
		t.Error("a refused answer was cached")
	}
}

func TestValidateJWTSVID(t *testing.T) {
	f, ca := jwtFixture(t, nil)
	svid, err := f.m.JWTSVID(t.Context(), []string{"orders"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.m.ValidateJWTSVID(t.Context(), svid.Token, "orders")
	if err != nil || got.ID != testID || got.Claims["sub"] != testID.String() {
		t.Fatalf("ValidateJWTSVID = %v, %v", got, err)
	}
	if _, err := f.m.ValidateJWTSVID(t.Context(), svid.Token, "payments"); !errors.Is(err, secretcache.ErrInvalidJWT) {
		t.Errorf("wrong audience: %v", err)
	}
	// Forged: the right key ID and claims, signed by another key.
	forged := forge(t, svid, jose.HeaderKey("kid"))
	if _, err := f.m.ValidateJWTSVID(t.Context(), forged, "orders"); !errors.Is(err, secretcache.ErrInvalidJWT) {
		t.Errorf("forged: %v", err)
	}
	for name, tok := range map[string]string{
		"garbage": "a.b.c",
		"huge":    strings.Repeat("a", secretcache.MaxJWTSize+1),
		"none":    "",
	} {
		if _, err := f.m.ValidateJWTSVID(t.Context(), tok, "orders"); !errors.Is(err, secretcache.ErrInvalidJWT) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Expiry on the fake clock (go-jose's one-minute leeway included).
	f.clock.Add(jwtissuer.DefaultTTL + time.Minute + time.Second)
	if _, err := f.m.ValidateJWTSVID(t.Context(), svid.Token, "orders"); !errors.Is(err, secretcache.ErrInvalidJWT) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired: %v", err)
	}
	// 1,000 forged tokens with unknown key IDs make at most one extra
	// bundle fetch (spaced 30s), not one each.
	before := ca.fetches.Load()
	for n := range 1000 {
		tok := forge(t, svid, "")
		_ = n
		if _, err := f.m.ValidateJWTSVID(t.Context(), tok, "orders"); !errors.Is(err, secretcache.ErrInvalidJWT) {
			t.Fatalf("unknown key: %v", err)
		}
	}
	if got := ca.fetches.Load() - before; got > 1 {
		t.Errorf("%d bundle fetches for 1,000 forged tokens", got)
	}
	// The next fetch is 30s after the last one, not earlier.
	fetchesAfter := func(d time.Duration) int64 {
		t.Helper()
		f.clock.Add(d)
		before := ca.fetches.Load()
		if _, err := f.m.ValidateJWTSVID(t.Context(), forge(t, svid, ""), "orders"); !errors.Is(err, secretcache.ErrInvalidJWT) {
			t.Fatalf("unknown key: %v", err)
		}
		return ca.fetches.Load() - before
	}
	if n := fetchesAfter(30*time.Second - time.Nanosecond); n != 0 {
		t.Errorf("%d bundle fetches for a forged token 30s less 1ns after the last fetch, want 0", n)
	}
	if n := fetchesAfter(time.Nanosecond); n != 1 {
		t.Errorf("%d bundle fetches for a forged token 30s after the last fetch, want 1", n)
	}
}

// forge signs svid's claims with a fresh key: with svid's key ID when
// kidHeader is set, else a random one.
func forge(t *testing.T, svid *secretcache.JWTSVID, kidHeader jose.HeaderKey) string {
	t.Helper()
	key := testkit.Key(t, certs.ECP256)
	kid := "unknown-" + fmt.Sprint(time.Now().UnixNano())
	if kidHeader != "" {
		parsed, err := jwt.ParseSigned(svid.Token, []jose.SignatureAlgorithm{jose.ES256})
		if err != nil {
			t.Fatal(err)
		}
		kid = parsed.Headers[0].KeyID
	}
	return (&keyJWT{key: key}).sign(t, kid, "", svid.Claims)
}

// TestJWTBundleRefreshedAndPushed: once in use, Run refreshes the bundle
// every JWTBundleRefresh and watchers see the CA's key rotation.
func TestJWTBundleRefreshedAndPushed(t *testing.T) {
	f, _ := jwtFixture(t, nil)
	f.run(t)
	first, err := f.m.JWTBundle(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	pushed := make(chan *secretcache.JWTBundle, 4)
	defer f.m.WatchJWTBundle(func(b *secretcache.JWTBundle) { pushed <- b })()
	f.parked(t) // the refresh timer, started by the first use
	f.clock.Add(jwtissuer.DefaultKeyLifetime)
	select {
	case b := <-pushed:
		if b.Version == first.Version || b.Set.Len() != 1 {
			t.Errorf("pushed bundle %s (was %s)", b.Version, first.Version)
		}
	case <-time.After(testkit.Guard):
		t.Fatal("the rotated bundle was not pushed")
	}
}

func TestJWTUnavailableWithoutSigner(t *testing.T) {
	f := newFixture(t, nil)
	if _, err := f.m.JWTSVID(t.Context(), []string{"a"}); !errors.Is(err, secretcache.ErrJWTUnavailable) {
		t.Errorf("JWTSVID: %v", err)
	}
	if _, err := f.m.ValidateJWTSVID(t.Context(), "a.b.c", "a"); !errors.Is(err, secretcache.ErrJWTUnavailable) {
		t.Errorf("ValidateJWTSVID: %v", err)
	}
}

// keyJWT is a JWT signer whose bundle holds keys the test holds (one key
// under several key IDs), so that the test can sign tokens of any shape.
// It mints nothing.
type keyJWT struct {
	key  crypto.Signer
	kids []string
	fail atomic.Bool // FetchJWTBundles fails, as during a CA outage
}

func newKeyJWT(t *testing.T) *keyJWT {
	return &keyJWT{key: testkit.Key(t, certs.ECP256), kids: []string{"k", "kk", "kkk", "kkkk"}}
}

func (k *keyJWT) MintJWTSVID(context.Context, spiffeid.ID, []string) (string, error) {
	return "", errors.New("keyJWT mints nothing")
}

func (k *keyJWT) FetchJWTBundles(context.Context) (map[string][]byte, error) {
	if k.fail.Load() {
		return nil, errors.New("keyJWT: the CA is down")
	}
	var set jose.JSONWebKeySet
	for _, kid := range k.kids {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.key.Public(), KeyID: kid, Algorithm: string(jose.ES256), Use: "jwt-svid"})
	}
	b, err := json.Marshal(set)
	return map[string][]byte{testTD.IDString(): b}, err
}

// sign signs claims with the key under kid, with header typ unless empty.
func (k *keyJWT) sign(t *testing.T, kid, typ string, claims map[string]any) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithHeader("kid", kid)
	if typ != "" {
		opts = opts.WithType(jose.ContentType(typ))
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: k.key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// sized returns a token for testID and audience "orders", valid at now,
// of exactly size bytes (padded with a claim; the key ID's length moves
// the total by one, which base64 of the claims alone cannot always).
func (k *keyJWT) sized(t *testing.T, now time.Time, size int) string {
	t.Helper()
	claims := map[string]any{"sub": testID.String(), "aud": "orders", "exp": now.Add(time.Minute).Unix()}
	for _, kid := range k.kids {
		claims["pad"] = ""
		base := len(k.sign(t, kid, "", claims))
		for n := max(0, (size-base)*3/4-4); n < (size-base)*3/4+4; n++ {
			claims["pad"] = strings.Repeat("p", n)
			if tok := k.sign(t, kid, "", claims); len(tok) == size {
				return tok
			}
		}
	}
	t.Fatalf("no token of %d bytes", size)
	return ""
}

// A token is accepted up to MaxJWTSize bytes exactly, with typ JWT, JOSE
// or none; a byte more, or another typ, is refused.
func TestValidateJWTSVIDSizeAndType(t *testing.T) {
	signer := newKeyJWT(t)
	f := newFixture(t, func(c *secretcache.Config) { c.JWTSigner = signer })
	ctx := t.Context()
	now := f.clock.Now()
	if _, err := f.m.ValidateJWTSVID(ctx, signer.sized(t, now, secretcache.MaxJWTSize), "orders"); err != nil {
		t.Errorf("a token of exactly MaxJWTSize bytes: %v", err)
	}
	_, err := f.m.ValidateJWTSVID(ctx, signer.sized(t, now, secretcache.MaxJWTSize+1), "orders")
	if !errors.Is(err, secretcache.ErrInvalidJWT) || !strings.Contains(err.Error(), "more than the limit") {
		t.Errorf("a token of MaxJWTSize+1 bytes: %v", err)
	}
	claims := map[string]any{"sub": testID.String(), "aud": "orders", "exp": now.Add(time.Minute).Unix()}
	for _, typ := range []string{"", "JWT", "JOSE"} {
		if _, err := f.m.ValidateJWTSVID(ctx, signer.sign(t, "k", typ, claims), "orders"); err != nil {
			t.Errorf("typ %q: %v", typ, err)
		}
	}
	for _, typ := range []string{"jwt", "JWS", "at+jwt"} {
		_, err := f.m.ValidateJWTSVID(ctx, signer.sign(t, "k", typ, claims), "orders")
		if !errors.Is(err, secretcache.ErrInvalidJWT) || !strings.Contains(err.Error(), "typ") {
			t.Errorf("typ %q: %v, want refused for its typ", typ, err)
		}
	}
}

// A CA that cannot serve the JWT bundle: before the first bundle, the JWT
// methods are not ready; after it, the bundle held stays in use (a token
// with an unknown key is refused as such, a valid one accepted).
func TestJWTBundleFetchFails(t *testing.T) {
	signer := newKeyJWT(t)
	signer.fail.Store(true)
	f := newFixture(t, func(c *secretcache.Config) { c.JWTSigner = signer })
	ctx := t.Context()
	if b, err := f.m.JWTBundle(ctx); b != nil || !isNotReady(err) {
		t.Fatalf("JWTBundle while the CA fails = %v, %v, want ErrNotReady", b, err)
	}
	signer.fail.Store(false)
	first, err := f.m.JWTBundle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	signer.fail.Store(true)
	f.clock.Add(time.Minute) // past the 30s between refetches
	claims := map[string]any{"sub": testID.String(), "aud": "orders", "exp": f.clock.Now().Add(time.Minute).Unix()}
	if _, err := f.m.ValidateJWTSVID(ctx, signer.sign(t, "unknown", "", claims), "orders"); !errors.Is(err, secretcache.ErrInvalidJWT) || isNotReady(err) {
		t.Errorf("a token with an unknown key while the refetch fails: %v, want ErrInvalidJWT", err)
	}
	if _, err := f.m.ValidateJWTSVID(ctx, signer.sign(t, "k", "", claims), "orders"); err != nil {
		t.Errorf("a valid token while the CA fails: %v", err)
	}
	if b, err := f.m.JWTBundle(ctx); err != nil || b != first {
		t.Errorf("JWTBundle while the CA fails = %v, %v, want the one held", b, err)
	}
}
