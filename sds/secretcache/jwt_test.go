package secretcache_test

import (
	"context"
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
	"github.com/meshid/meshid/internal/testkit"
	"github.com/meshid/meshid/sds/secretcache"
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
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithHeader("kid", kid))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(signer).Claims(svid.Claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
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
