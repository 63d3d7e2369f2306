package jwtissuer_test

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/jwtsvid"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/ca/jwtkeys"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

var (
	td = spiffeid.RequireTrustDomainFromString("cluster.local")
	id = spiffeid.RequireFromString("spiffe://cluster.local/ns/shop/sa/cart")
)

// newIssuer runs on a fake clock at the real time: go-spiffe's validator
// reads time.Now.
func newIssuer(t *testing.T, cfg jwtissuer.Config) (*jwtissuer.Issuer, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Now())
	cfg.TrustDomain, cfg.Clock = td, clk
	i, err := jwtissuer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return i, clk
}

func bundle(t *testing.T, i *jwtissuer.Issuer) *jwtbundle.Bundle {
	t.Helper()
	raw, err := i.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	b, err := jwtbundle.Parse(td, raw)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestIssuedTokenValidatesWithGoSpiffe(t *testing.T) {
	reg := prometheus.NewRegistry()
	i, clk := newIssuer(t, jwtissuer.Config{Registerer: reg})
	tok, err := i.Issue(id, []string{"orders", "payments"})
	if err != nil {
		t.Fatal(err)
	}
	svid, err := jwtsvid.ParseAndValidate(tok.Token, bundle(t, i), []string{"payments"})
	if err != nil {
		t.Fatal(err)
	}
	if svid.ID != id || !slices.Equal(svid.Audience, []string{"orders", "payments"}) {
		t.Errorf("svid = %s %v", svid.ID, svid.Audience)
	}
	if want := clk.Now().Add(jwtissuer.DefaultTTL).Truncate(time.Second); !svid.Expiry.Equal(want) || !tok.Expiry.Equal(want) {
		t.Errorf("expiry %s / %s, want %s", svid.Expiry, tok.Expiry, want)
	}
	parsed, err := jwt.ParseSigned(tok.Token, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	if h := parsed.Headers[0]; h.Algorithm != "ES256" || h.KeyID != tok.KeyID || h.ExtraHeaders["typ"] != "JWT" {
		t.Errorf("header %+v", h)
	}
	if _, err := jwtsvid.ParseAndValidate(tok.Token, bundle(t, i), []string{"inventory"}); err == nil {
		t.Error("a token for orders,payments validated for the audience inventory")
	}
	if got := testkit.Metric(t, reg, "meshid_ca_jwtsvid_issued_total"); got != 1 {
		t.Errorf("issued = %v", got)
	}
}

func TestKeysRotateAndStayPublishedForTheirTokens(t *testing.T) {
	const life = time.Hour
	i, clk := newIssuer(t, jwtissuer.Config{KeyLifetime: life})
	first, err := i.Issue(id, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	kids := keyIDs(t, i)
	if len(kids) != 2 || !slices.Contains(kids, first.KeyID) {
		t.Fatalf("JWKS %v: want the signing key %s and the next one", kids, first.KeyID)
	}
	next := kids[1]
	clk.Add(life)
	second, err := i.Issue(id, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	if second.KeyID != next {
		t.Errorf("after a lifetime the key %s signs, want the pre-published %s", second.KeyID, next)
	}
	if got := keyIDs(t, i); !slices.Contains(got, first.KeyID) || len(got) != 3 {
		t.Errorf("JWKS %v: the retired key %s must stay while its tokens live", got, first.KeyID)
	}
	clk.Add(jwtissuer.DefaultTTL)
	if got := keyIDs(t, i); slices.Contains(got, first.KeyID) || len(got) != 2 {
		t.Errorf("JWKS %v still publishes %s after its last token expired", got, first.KeyID)
	}
	// A clock that jumps many lifetimes ahead gets fresh keys, not a
	// backlog of them.
	clk.Add(100 * life)
	third, err := i.Issue(id, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := keyIDs(t, i); len(got) > 3 || !slices.Contains(got, third.KeyID) {
		t.Errorf("after a jump: JWKS %v, signing key %s", got, third.KeyID)
	}
}

func keyIDs(t *testing.T, i *jwtissuer.Issuer) []string {
	t.Helper()
	raw, err := i.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(raw, &set); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, k := range set.Keys {
		if k.IsPublic() != true || k.Algorithm != "ES256" {
			t.Errorf("key %s: public %v, alg %s", k.KeyID, k.IsPublic(), k.Algorithm)
		}
		out = append(out, k.KeyID)
	}
	return out
}

func TestAudienceLimits(t *testing.T) {
	i, _ := newIssuer(t, jwtissuer.Config{})
	many := make([]string, jwtissuer.DefaultMaxAudiences+1)
	for n := range many {
		many[n] = "a"
	}
	for name, aud := range map[string][]string{
		"none":         nil,
		"empty":        {"a", ""},
		"too many":     many,
		"huge":         {strings.Repeat("x", jwtissuer.DefaultMaxAudienceLength+1)},
		"invalid utf8": {"\xff"},
	} {
		if _, err := i.Issue(id, aud); ca.KindOf(err) != ca.KindInvalidArgument {
			t.Errorf("%s: err = %v, want InvalidArgument", name, err)
		}
	}
	if _, err := i.Issue(id, many[:jwtissuer.DefaultMaxAudiences]); err != nil {
		t.Errorf("the maximum number of audiences: %v", err)
	}
	other := spiffeid.RequireFromString("spiffe://other.example/ns/a/sa/b")
	if _, err := i.Issue(other, []string{"a"}); ca.KindOf(err) != ca.KindPermissionDenied {
		t.Errorf("foreign trust domain: err = %v, want PermissionDenied", err)
	}
}

func TestConfigValidation(t *testing.T) {
	for name, cfg := range map[string]jwtissuer.Config{
		"no trust domain":  {},
		"ttl over max":     {TrustDomain: td, TTL: jwtissuer.MaxTTL + time.Second},
		"short key life":   {TrustDomain: td, KeyLifetime: time.Minute},
		"negative ttl":     {TrustDomain: td, TTL: -time.Second},
		"negative max aud": {TrustDomain: td, MaxAudiences: -1},
	} {
		if _, err := jwtissuer.New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	i, err := jwtissuer.New(jwtissuer.Config{TrustDomain: td})
	if err != nil || i.TTL() != jwtissuer.DefaultTTL {
		t.Errorf("defaults: %v, TTL %v", err, i.TTL())
	}
}

// keySource is a KeySource of a fixed Set (or error): what a replica that
// only reads a shared Set sees.
type keySource struct {
	set *jwtkeys.Set
	err error
}

func (k keySource) Keys() (*jwtkeys.Set, error) { return k.set, k.err }

func TestIssuersSharingKeysValidateEachOther(t *testing.T) {
	set, _, err := jwtkeys.Rotate(nil, time.Now(), time.Hour, jwtissuer.DefaultTTL)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := newIssuer(t, jwtissuer.Config{Keys: keySource{set: set}})
	b, _ := newIssuer(t, jwtissuer.Config{Keys: keySource{set: set}})
	tok, err := a.Issue(id, []string{"orders"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jwtsvid.ParseAndValidate(tok.Token, bundle(t, b), []string{"orders"}); err != nil {
		t.Errorf("a token of one issuer against the other's bundle: %v", err)
	}
	// A replica whose keys are not loaded (or all retired) refuses with
	// Unavailable, a code the agent retries.
	for name, src := range map[string]keySource{
		"not loaded": {err: errors.New("not yet")},
		"stale":      {set: &jwtkeys.Set{Keys: set.Keys[:1]}},
	} {
		i, clk := newIssuer(t, jwtissuer.Config{Keys: src})
		clk.Add(2 * time.Hour)
		if _, err := i.Issue(id, []string{"a"}); ca.KindOf(err) != ca.KindUnavailable {
			t.Errorf("%s: err = %v, want Unavailable", name, err)
		}
	}
}

// TestIssueForCapsAtTheCredential: IssueFor's token expires with the
// caller's credential when it ends before the TTL (the exp go-spiffe
// reads), at the TTL otherwise; an expired credential gets no token
// (Unauthenticated) and counts no issue.
func TestIssueForCapsAtTheCredential(t *testing.T) {
	reg := prometheus.NewRegistry()
	i, clk := newIssuer(t, jwtissuer.Config{Registerer: reg})
	now := clk.Now()
	for name, tc := range map[string]struct {
		cred ca.Credential
		want time.Time
	}{
		"token ends first":       {ca.Credential{TokenExpiry: now.Add(time.Minute)}, now.Add(time.Minute)},
		"certificate ends first": {ca.Credential{Certificate: &x509.Certificate{NotAfter: now.Add(2 * time.Minute)}}, now.Add(2 * time.Minute)},
		"token outlives the TTL": {ca.Credential{TokenExpiry: now.Add(time.Hour)}, now.Add(jwtissuer.DefaultTTL)},
	} {
		tok, err := i.IssueFor(id, []string{"orders"}, tc.cred)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		svid, err := jwtsvid.ParseAndValidate(tok.Token, bundle(t, i), []string{"orders"})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want := tc.want.Truncate(time.Second); !svid.Expiry.Equal(want) || !tok.Expiry.Equal(want) {
			t.Errorf("%s: exp %s (Token.Expiry %s), want %s", name, svid.Expiry, tok.Expiry, want)
		}
	}
	_, err := i.IssueFor(id, []string{"orders"}, ca.Credential{TokenExpiry: now.Add(-time.Second)})
	if ca.KindOf(err) != ca.KindUnauthenticated || !strings.Contains(err.Error(), "the token expired at") {
		t.Errorf("expired token: %v, want Unauthenticated naming the expiry", err)
	}
	if n := testkit.Metric(t, reg, "meshid_ca_jwtsvid_issued_total"); n != 3 {
		t.Errorf("issued = %v, want 3", n)
	}
}
