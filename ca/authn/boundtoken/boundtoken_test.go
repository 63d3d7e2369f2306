package boundtoken

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	metadatafake "k8s.io/client-go/metadata/fake"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/certs"
)

func (e *env) auth(token string) (*authn.Caller, error) {
	return e.v.Authenticate(context.Background(), authn.Credentials{Token: token})
}

func (e *env) result(t *testing.T, r string) float64 {
	return testutil.ToFloat64(e.v.results.WithLabelValues(r))
}

// wantRefused fails unless err is a final verdict of kind k that does not
// echo the token.
func wantRefused(t *testing.T, err error, k ca.Kind, token string) {
	t.Helper()
	var e *ca.Error
	if !errors.As(err, &e) || e.Kind != k {
		t.Fatalf("error %v, want a %v *ca.Error", err, k)
	}
	if len(token) > 20 && strings.Contains(err.Error(), token) {
		t.Fatalf("the error echoes the token: %v", err)
	}
	// Final: an offline check after it must not see the token.
	c, err2 := authn.NewChain(errAuth{e}, acceptAll{}).Authenticate(context.Background(), authn.Credentials{Token: token})
	if c != nil || err2 == nil {
		t.Fatalf("the verdict is not final: a later authenticator accepted the token")
	}
}

type errAuth struct{ err error }

func (a errAuth) Authenticate(context.Context, authn.Credentials) (*authn.Caller, error) {
	return nil, authn.FinalForToken(a.err)
}

type acceptAll struct{}

func (acceptAll) Authenticate(_ context.Context, c authn.Credentials) (*authn.Caller, error) {
	if c.Token == "" {
		return nil, authn.ErrNoCredentials
	}
	return &authn.Caller{Namespace: "x", ServiceAccount: "y"}, nil
}

func TestAcceptsPodBoundToken(t *testing.T) {
	e := newEnv(t, nil)
	if !e.v.Active() {
		t.Fatal("not active after discovery and sync")
	}
	n, err := testutil.GatherAndCount(e.reg, "meshid_ca_bound_token_informer_objects")
	if err != nil || n != 2 {
		t.Fatalf("informer object gauges: %d, %v; want pods and serviceaccounts", n, err)
	}
	for res, want := range map[string]int64{"pods": 1, "serviceaccounts": 1} {
		if got := e.v.objects.counts[res].Load(); got != want {
			t.Fatalf("%s held: %d, want %d", res, got, want)
		}
	}
	tok := e.genuine(t, tokenClaims(t0))
	for range 2 { // the second from the cache of verified signatures
		c, err := e.auth(tok)
		if err != nil {
			t.Fatal(err)
		}
		if c.Namespace != "shop" || c.ServiceAccount != "cart" || c.PodName != "cart-0" || c.PodUID != "pod-uid" ||
			c.NodeName != "node-a" || c.Method != authn.MethodJWT || !c.Expiry.Equal(t0.Add(time.Hour)) {
			t.Fatalf("caller %+v", c)
		}
	}
	if got := e.result(t, resultAccepted); got != 2 {
		t.Fatalf("accepted = %v, want 2", got)
	}
	// A token bound to the service account only (kubectl create token).
	cl := tokenClaims(t0)
	k := cl["kubernetes.io"].(map[string]any)
	delete(k, "pod")
	delete(k, "node")
	if c, err := e.auth(e.genuine(t, cl)); err != nil || c.PodName != "" {
		t.Fatalf("service-account token: %+v, %v", c, err)
	}
}

func TestRefusesInvalidTokens(t *testing.T) {
	e := newEnv(t, nil)
	other, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	with := func(mod func(map[string]any)) map[string]any {
		c := tokenClaims(t0)
		mod(c)
		return c
	}
	k := e.api.key()
	cases := map[string]string{
		"wrong audience": e.genuine(t, with(func(c map[string]any) { c["aud"] = []string{"vault"} })),
		"expired":        e.genuine(t, with(func(c map[string]any) { c["exp"] = t0.Add(-time.Minute).Unix() })),
		"not yet valid":  e.genuine(t, with(func(c map[string]any) { c["nbf"] = t0.Add(time.Hour).Unix() })),
		"no expiry":      e.genuine(t, with(func(c map[string]any) { delete(c, "exp") })),
		"bad signature":  sign(t, other, jose.ES256, kid(k), tokenClaims(t0)),
		"HS256":          sign(t, []byte("0123456789abcdef0123456789abcdef"), jose.HS256, kid(k), tokenClaims(t0)),
		"alg none":       noneToken(t, tokenClaims(t0)),
		"malformed kubernetes.io": e.genuine(t, with(func(c map[string]any) {
			c["kubernetes.io"].(map[string]any)["pod"] = "cart-0"
		})),
	}
	for name, tok := range cases {
		t.Run(name, func(t *testing.T) {
			c, err := e.auth(tok)
			if c != nil {
				t.Fatalf("accepted: %+v", c)
			}
			wantRefused(t, err, ca.KindUnauthenticated, tok)
		})
	}
}

// noneToken is an unsigned token (alg none), which go-jose cannot make.
func noneToken(t testing.TB, claims map[string]any) string {
	signed := sign(t, []byte("0123456789abcdef0123456789abcdef"), jose.HS256, "", claims)
	parts := strings.Split(signed, ".")
	return "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0." + parts[1] + "."
}

func TestFallsBackToTokenReview(t *testing.T) {
	e := newEnv(t, nil)
	with := func(mod func(map[string]any, map[string]any)) string {
		c := tokenClaims(t0)
		mod(c, c["kubernetes.io"].(map[string]any))
		return e.genuine(t, c)
	}
	other, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, token, reason string }{
		{"other issuer", sign(t, other, jose.ES256, "x", func() map[string]any {
			c := tokenClaims(t0)
			c["iss"] = "https://accounts.google.com"
			return c
		}()), fallbackIssuer},
		{"other issuer, HS256", sign(t, []byte("0123456789abcdef0123456789abcdef"), jose.HS256, "", map[string]any{"iss": "https://dex"}), fallbackIssuer},
		{"legacy token", with(func(c, k map[string]any) {
			c["iss"] = "kubernetes/serviceaccount"
			delete(c, "kubernetes.io")
		}), fallbackIssuer},
		{"no kubernetes.io claims", with(func(c, k map[string]any) { delete(c, "kubernetes.io") }), fallbackUnbound},
		{"no audience", with(func(c, k map[string]any) { delete(c, "aud") }), fallbackUnbound},
		{"bound to a node", with(func(c, k map[string]any) { delete(k, "pod") }), fallbackUnbound},
		{"bound to a webhook", with(func(c, k map[string]any) {
			k["validatingwebhookconfiguration"] = map[string]any{"name": "w", "uid": "u"}
		}), fallbackUnbound},
		{"bound to a secret", with(func(c, k map[string]any) {
			delete(k, "pod")
			k["secret"] = map[string]any{"name": "cart-secret", "uid": "secret-uid"}
		}), fallbackSecretBinding},
		{"pod not in the informer", with(func(c, k map[string]any) {
			k["pod"] = map[string]any{"name": "cart-1", "uid": "pod-uid-1"}
		}), fallbackObject},
		{"pod recreated (other UID)", with(func(c, k map[string]any) {
			k["pod"] = map[string]any{"name": "cart-0", "uid": "old-pod-uid"}
		}), fallbackObject},
		{"service account recreated", with(func(c, k map[string]any) {
			k["serviceaccount"] = map[string]any{"name": "cart", "uid": "old-sa-uid"}
		}), fallbackObject},
		{"unknown key id", sign(t, other, jose.ES256, "rotated-away", tokenClaims(t0)), fallbackKey},
		{"no key id, not our key (another cluster, same issuer name)", sign(t, other, jose.ES256, "", tokenClaims(t0)), fallbackKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.result(t, tc.reason)
			c, err := e.auth(tc.token)
			if c != nil || !errors.Is(err, authn.ErrNoCredentials) {
				t.Fatalf("got %+v, %v; want authn.ErrNoCredentials", c, err)
			}
			if got := e.result(t, tc.reason); got != before+1 {
				t.Fatalf("%s = %v, want %v", tc.reason, got, before+1)
			}
		})
	}
}

func TestSecretBoundWithWatchSecrets(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WatchSecrets = true })
	cl := tokenClaims(t0)
	k := cl["kubernetes.io"].(map[string]any)
	delete(k, "pod")
	delete(k, "node")
	k["secret"] = map[string]any{"name": "cart-secret", "uid": "secret-uid"}
	if _, err := e.auth(e.genuine(t, cl)); err != nil {
		t.Fatal(err)
	}
	k["secret"] = map[string]any{"name": "cart-secret", "uid": "other"}
	if _, err := e.auth(e.genuine(t, cl)); !errors.Is(err, authn.ErrNoCredentials) {
		t.Fatalf("secret with another UID: %v, want a fallback", err)
	}
}

// A bound object marked for deletion keeps its tokens valid for a minute,
// as on the API server; after that they are refused here.
func TestDeletionTimestamp(t *testing.T) {
	pod := meta("Pod", "shop", "cart-0", "pod-uid")
	deleted := metav1.NewTime(t0.Add(-30 * time.Second))
	pod.DeletionTimestamp = &deleted
	e := newEnv(t, nil, meta("ServiceAccount", "shop", "cart", "sa-uid"), pod)
	tok := e.genuine(t, tokenClaims(t0))
	if _, err := e.auth(tok); err != nil {
		t.Fatalf("30s after deletion: %v", err)
	}
	e.clk.Add(31 * time.Second)
	_, err := e.auth(tok)
	wantRefused(t, err, ca.KindUnauthenticated, tok)
	if !strings.Contains(err.Error(), "pod has been deleted") {
		t.Fatalf("error %v does not name the deleted pod", err)
	}
}

func TestModes(t *testing.T) {
	for _, m := range []Mode{ModeAuto, ModeLocal} {
		t.Run(string(m), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.Mode = m })
			e.api.mu.Lock()
			e.api.forbidden = true
			e.api.mu.Unlock()
			// A fresh Verifier whose discovery is denied (RBAC).
			v, err := New(Config{REST: e.api.rest(t), Metadata: e.md, Mode: m, Clock: e.clk})
			if err != nil {
				t.Fatal(err)
			}
			if err := v.Refresh(context.Background()); err == nil || !strings.Contains(err.Error(), "openid-configuration") {
				t.Fatalf("Refresh = %v, want its failure", err)
			}
			if v.Active() {
				t.Fatal("active without keys")
			}
			tok := e.genuine(t, tokenClaims(t0))
			_, err = v.Authenticate(context.Background(), authn.Credentials{Token: tok})
			if m == ModeAuto {
				if !errors.Is(err, authn.ErrNoCredentials) {
					t.Fatalf("auto, not ready: %v, want a fallback to TokenReview", err)
				}
				return
			}
			wantRefused(t, err, ca.KindUnavailable, tok)
		})
	}
}

func TestNewValidates(t *testing.T) {
	api := newAPIServer(t)
	md := metadatafake.NewSimpleMetadataClient(metadatafake.NewTestScheme())
	for name, cfg := range map[string]Config{
		"no REST":           {Metadata: md},
		"no metadata":       {REST: api.rest(t)},
		"tokenreview mode":  {REST: api.rest(t), Metadata: md, Mode: ModeTokenReview},
		"unknown mode":      {REST: api.rest(t), Metadata: md, Mode: "fast"},
		"empty audience":    {REST: api.rest(t), Metadata: md, Audiences: []string{""}},
		"negative interval": {REST: api.rest(t), Metadata: md, MinRefreshInterval: -1},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
	for _, s := range []string{"tokenreview", "local", "auto"} {
		if m, err := ParseMode(s); err != nil || string(m) != s {
			t.Errorf("ParseMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseMode("Local"); err == nil {
		t.Error("ParseMode accepted Local")
	}
}

// The attacker's tests: made-up key ids, repeated, cost one JWKS read per
// MinRefreshInterval; a key rotation is found by the first token that
// names the new key; a huge token is refused before it is parsed.
func TestUnknownKeyIDFlood(t *testing.T) {
	e := newEnv(t, nil)
	base := e.api.jwksReads.Load() // the initial discovery
	other, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	e.clk.Add(DefaultMinRefreshInterval) // the last read was just now
	forged := sign(t, other, jose.ES256, "made-up", tokenClaims(t0))
	for range 10000 {
		if _, err := e.auth(forged); !errors.Is(err, authn.ErrNoCredentials) {
			t.Fatalf("unknown key id: %v, want a fallback to TokenReview", err)
		}
	}
	if got := e.api.jwksReads.Load() - base; got != 1 {
		t.Fatalf("10,000 tokens with an unknown key id made %d JWKS reads, want 1", got)
	}
	e.clk.Add(DefaultMinRefreshInterval)
	for range 100 {
		e.auth(forged)
	}
	if got := e.api.jwksReads.Load() - base; got != 2 {
		t.Fatalf("after the refresh interval: %d JWKS reads, want 2", got)
	}

	// A rotation: the API server starts signing with a new key.
	e.clk.Add(DefaultMinRefreshInterval)
	nk := e.api.addKey(t)
	tok := sign(t, nk, jose.ES256, kid(nk), tokenClaims(t0))
	if _, err := e.auth(tok); err != nil {
		t.Fatalf("token of a new key: %v", err)
	}
}

func TestKeyRemovedDropsCachedTokens(t *testing.T) {
	e := newEnv(t, nil)
	tok := e.genuine(t, tokenClaims(t0))
	if _, err := e.auth(tok); err != nil {
		t.Fatal(err)
	}
	e.api.addKey(t)
	e.api.mu.Lock()
	e.api.keys = e.api.keys[1:] // the old key retired
	e.api.mu.Unlock()
	if err := e.v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.auth(tok); !errors.Is(err, authn.ErrNoCredentials) {
		t.Fatalf("token of a retired key after refresh: %v, want it no longer verified here", err)
	}
}

func TestHugeToken(t *testing.T) {
	e := newEnv(t, nil)
	huge := e.genuine(t, func() map[string]any {
		c := tokenClaims(t0)
		c["pad"] = strings.Repeat("x", authn.MaxTokenSize)
		return c
	}())
	allocs := testing.AllocsPerRun(100, func() {
		_, err := e.auth(huge)
		var ce *ca.Error
		if !errors.As(err, &ce) || ce.Kind != ca.KindUnauthenticated {
			t.Fatalf("huge token: %v", err)
		}
	})
	// Refused on its length: parsing it would allocate its size again.
	if allocs > 10 {
		t.Fatalf("refusing a %d-byte token made %v allocations; it was parsed", len(huge), allocs)
	}
}

func TestSlimKeepsOnlyWhatChecksRead(t *testing.T) {
	m := meta("Pod", "shop", "cart-0", "pod-uid")
	m.Labels = map[string]string{"app": "cart"}
	m.Annotations = map[string]string{"big": strings.Repeat("x", 4096)}
	m.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	m.ResourceVersion = "7"
	out, err := slim(m)
	if err != nil {
		t.Fatal(err)
	}
	s := out.(*metav1.PartialObjectMetadata)
	if s.Labels != nil || s.Annotations != nil || s.ManagedFields != nil {
		t.Fatalf("slim kept %+v", s.ObjectMeta)
	}
	if s.Name != "cart-0" || s.Namespace != "shop" || s.UID != "pod-uid" || s.ResourceVersion != "7" {
		t.Fatalf("slim lost %+v", s.ObjectMeta)
	}
	var _ runtime.Object = s
}
