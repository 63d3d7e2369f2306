package identity_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/identity"
)

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

func TestServiceAccountID(t *testing.T) {
	tests := []struct {
		sa   identity.ServiceAccount
		want string // "" = error
	}{
		{identity.ServiceAccount{"prod", "frontend"}, "spiffe://cluster.local/ns/prod/sa/frontend"},
		{identity.ServiceAccount{"kube-system", "a.b_c-d"}, "spiffe://cluster.local/ns/kube-system/sa/a.b_c-d"},
		{identity.ServiceAccount{"", "sa"}, ""},
		{identity.ServiceAccount{"ns", ""}, ""},
		{identity.ServiceAccount{"..", "sa"}, ""},
		{identity.ServiceAccount{"ns", "."}, ""},
		{identity.ServiceAccount{"a/b", "sa"}, ""},
		{identity.ServiceAccount{"ns", "../../admin"}, ""},
		{identity.ServiceAccount{"ns", "sa?x=1"}, ""},
		{identity.ServiceAccount{"ns", "sa#frag"}, ""},
		{identity.ServiceAccount{"ns", "Ünïcode"}, ""},
		{identity.ServiceAccount{"ns", "a b"}, ""},
		{identity.ServiceAccount{"ns", "sa%2F"}, ""},
	}
	for _, tc := range tests {
		id, err := tc.sa.ID(td)
		if tc.want == "" {
			if err == nil {
				t.Errorf("%+v.ID = %v, want an error", tc.sa, id)
			}
			continue
		}
		if err != nil || id.String() != tc.want {
			t.Errorf("%+v.ID = %v, %v; want %s", tc.sa, id, err, tc.want)
			continue
		}
		back, err := identity.FromID(id)
		if err != nil || back != tc.sa {
			t.Errorf("FromID(%v) = %+v, %v; want %+v", id, back, err, tc.sa)
		}
	}
	if _, err := (identity.ServiceAccount{"ns", "sa"}).ID(spiffeid.TrustDomain{}); err == nil {
		t.Error("ID accepted a zero trust domain")
	}
}

func TestFromID(t *testing.T) {
	tests := []struct {
		id   string
		want identity.ServiceAccount // zero = error
	}{
		{"spiffe://cluster.local/ns/default/sa/default", identity.ServiceAccount{"default", "default"}},
		{"spiffe://other.example/ns/a/sa/b", identity.ServiceAccount{"a", "b"}},
		{"spiffe://cluster.local", identity.ServiceAccount{}},
		{"spiffe://cluster.local/ns/default", identity.ServiceAccount{}},
		{"spiffe://cluster.local/ns/default/sa", identity.ServiceAccount{}},
		{"spiffe://cluster.local/ns/default/sa/default/extra", identity.ServiceAccount{}},
		{"spiffe://cluster.local/sa/default/ns/default", identity.ServiceAccount{}},
		{"spiffe://cluster.local/namespace/a/sa/b", identity.ServiceAccount{}},
		{"spiffe://cluster.local/ns/a/serviceaccount/b", identity.ServiceAccount{}},
	}
	for _, tc := range tests {
		got, err := identity.FromID(spiffeid.RequireFromString(tc.id))
		if tc.want == (identity.ServiceAccount{}) {
			if err == nil {
				t.Errorf("FromID(%s) = %+v, want an error", tc.id, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("FromID(%s) = %+v, %v; want %+v", tc.id, got, err, tc.want)
		}
	}
	// Non-SPIFFE URIs never become IDs in the first place.
	for _, s := range []string{"https://cluster.local/ns/a/sa/b", "spiffe://cluster.local/ns/../sa/b", "spiffe://cluster.local/ns//sa/b", "spiffe://user@cluster.local/ns/a/sa/b", "spiffe://cluster.local:8080/ns/a/sa/b", "SPIFFE://cluster.local/ns/a/sa/b"} {
		if id, err := spiffeid.FromString(s); err == nil {
			if sa, err := identity.FromID(id); err == nil {
				t.Errorf("%s gave service account %+v", s, sa)
			}
		}
	}
}

func TestFromUsername(t *testing.T) {
	tests := []struct {
		user string
		want identity.ServiceAccount
		ok   bool
	}{
		{"system:serviceaccount:prod:frontend", identity.ServiceAccount{"prod", "frontend"}, true},
		{"system:serviceaccount:prod", identity.ServiceAccount{}, false},
		{"system:serviceaccount::frontend", identity.ServiceAccount{}, false},
		{"system:serviceaccount:prod:", identity.ServiceAccount{}, false},
		{"system:serviceaccount:prod:a:b", identity.ServiceAccount{}, false},
		{"system:node:worker-1", identity.ServiceAccount{}, false},
		{"alice", identity.ServiceAccount{}, false},
		{"", identity.ServiceAccount{}, false},
	}
	for _, tc := range tests {
		got, ok := identity.FromUsername(tc.user)
		if ok != tc.ok || got != tc.want {
			t.Errorf("FromUsername(%q) = %+v, %v; want %+v, %v", tc.user, got, ok, tc.want, tc.ok)
		}
		if ok && got.Username() != tc.user {
			t.Errorf("Username() = %q, want %q", got.Username(), tc.user)
		}
	}
}

func signToken(t *testing.T, claims any) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(sig).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// hs256Token is a token signed with HMAC, which meshid never accepts.
func hs256Token(claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	head := enc([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc([]byte(claims))
	m := hmac.New(sha256.New, []byte("secret"))
	m.Write([]byte(head))
	return head + "." + enc(m.Sum(nil))
}

func TestParseUnverified(t *testing.T) {
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	bound := map[string]any{
		"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:prod:frontend",
		"aud": []string{"istio-ca", "api"}, "exp": exp.Unix(), "iat": exp.Add(-time.Hour).Unix(), "nbf": exp.Add(-time.Hour).Unix(),
		"kubernetes.io": map[string]any{
			"namespace":      "prod",
			"serviceaccount": map[string]any{"name": "frontend", "uid": "sa-uid"},
			"pod":            map[string]any{"name": "frontend-1", "uid": "pod-uid"},
			"node":           map[string]any{"name": "worker-1", "uid": "node-uid"},
		},
	}
	c, err := identity.ParseUnverified(signToken(t, bound) + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.Issuer != "https://kubernetes.default.svc" || !c.Audience.Contains("istio-ca") || !c.Audience.Contains("api") {
		t.Errorf("iss/aud = %q %v", c.Issuer, c.Audience)
	}
	if !c.Expiry.Time().Equal(exp) || !c.IssuedAt.Time().Equal(exp.Add(-time.Hour)) || !c.NotBefore.Time().Equal(exp.Add(-time.Hour)) {
		t.Errorf("exp/iat/nbf = %v %v %v", c.Expiry.Time(), c.IssuedAt.Time(), c.NotBefore.Time())
	}
	if sa, ok := c.ServiceAccount(); !ok || sa != (identity.ServiceAccount{"prod", "frontend"}) {
		t.Errorf("ServiceAccount = %+v, %v", sa, ok)
	}
	k := c.Kubernetes
	if k.ServiceAccount.UID != "sa-uid" || c.Pod() != (identity.Object{Name: "frontend-1", UID: "pod-uid"}) || *k.Node != (identity.Object{Name: "worker-1", UID: "node-uid"}) {
		t.Errorf("kubernetes.io = %+v sa %+v pod %+v node %+v", k, k.ServiceAccount, c.Pod(), k.Node)
	}

	legacy, err := identity.ParseUnverified(signToken(t, map[string]any{
		"kubernetes.io/serviceaccount/namespace":            "old",
		"kubernetes.io/serviceaccount/service-account.name": "builder",
		"kubernetes.io/serviceaccount/service-account.uid":  "u",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if sa, ok := legacy.ServiceAccount(); !ok || sa != (identity.ServiceAccount{"old", "builder"}) || legacy.LegacyUID != "u" {
		t.Errorf("legacy ServiceAccount = %+v, %v", sa, ok)
	}
	if legacy.Pod() != (identity.Object{}) {
		t.Errorf("legacy token bound to pod %+v", legacy.Pod())
	}
	// Half of the bound form does not fall back to the legacy form.
	half, err := identity.ParseUnverified(signToken(t, map[string]any{
		"kubernetes.io":                          map[string]any{"namespace": "prod"},
		"kubernetes.io/serviceaccount/namespace": "old", "kubernetes.io/serviceaccount/service-account.name": "builder",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if sa, ok := half.ServiceAccount(); ok {
		t.Errorf("half claims gave %+v", sa)
	}
}

func TestParseUnverifiedHostile(t *testing.T) {
	valid := signToken(t, map[string]any{"sub": "system:serviceaccount:a:b"})
	parts := strings.Split(valid, ".")
	huge := signToken(t, map[string]any{"sub": "system:serviceaccount:a:b", "pad": strings.Repeat("x", identity.MaxTokenSize)})
	tests := []struct{ name, token string }{
		{"empty", ""},
		{"not a JWT", "not-a-jwt-secret-value"},
		{"two parts", parts[0] + "." + parts[1]},
		{"bad base64 header", "!!!." + parts[1] + "." + parts[2]},
		{"bad base64 payload", parts[0] + ".%%%." + parts[2]},
		{"payload not JSON", parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte("secret-not-json")) + "." + parts[2]},
		{"claims of the wrong type", parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"kubernetes.io":"secret-string"}`)) + "." + parts[2]},
		{"exp not a number", parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"exp":"tomorrow-secret"}`)) + "." + parts[2]},
		{"alg none", base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none"}`)) + "." + parts[1] + "."},
		{"alg HS256", hs256Token(`{"sub":"system:serviceaccount:a:b"}`)},
		{"JWE form", valid + ".x.y"},
		{"huge", huge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := identity.ParseUnverified(tc.token)
			if err == nil {
				t.Fatalf("parsed %+v", c)
			}
			if len(tc.token) > 8 && strings.Contains(err.Error(), tc.token[len(tc.token)/2:]) || strings.Contains(err.Error(), "secret") {
				t.Fatalf("the error %q contains the token", err)
			}
		})
	}
}

func TestServiceAccountFromToken(t *testing.T) {
	k8s := func(ns, sa string) map[string]any {
		return map[string]any{"namespace": ns, "serviceaccount": map[string]any{"name": sa, "uid": "1234"}}
	}
	tests := []struct {
		name   string
		claims map[string]any
		want   identity.ServiceAccount // zero = error
	}{
		{"kubernetes.io claims win over the subject", map[string]any{"sub": "system:serviceaccount:ignored:ignored", "kubernetes.io": k8s("prod", "frontend")}, identity.ServiceAccount{"prod", "frontend"}},
		{"subject fallback", map[string]any{"sub": "system:serviceaccount:default:default"}, identity.ServiceAccount{"default", "default"}},
		{"legacy claims", map[string]any{"kubernetes.io/serviceaccount/namespace": "a", "kubernetes.io/serviceaccount/service-account.name": "b"}, identity.ServiceAccount{"a", "b"}},
		{"empty namespace, subject fallback", map[string]any{"sub": "system:serviceaccount:x:y", "kubernetes.io": k8s("", "sa")}, identity.ServiceAccount{"x", "y"}},
		{"no identity", map[string]any{"sub": "alice"}, identity.ServiceAccount{}},
		{"empty namespace", map[string]any{"kubernetes.io": k8s("", "sa")}, identity.ServiceAccount{}},
		{"colon in subject name", map[string]any{"sub": "system:serviceaccount:a:b:c"}, identity.ServiceAccount{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := identity.ServiceAccountFromToken(signToken(t, tc.claims))
			if tc.want == (identity.ServiceAccount{}) {
				if err == nil {
					t.Fatalf("got %+v, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	// Names that are not SPIFFE path segments come back as they are and
	// fail in ID.
	sa, err := identity.ServiceAccountFromToken(signToken(t, map[string]any{"kubernetes.io": k8s("..", "a/b")}))
	if err != nil {
		t.Fatal(err)
	}
	if id, err := sa.ID(td); err == nil {
		t.Fatalf("hostile names became %v", id)
	}
}

func TestCAServerName(t *testing.T) {
	tests := []struct{ addr, want string }{
		{"localhost:15012", "istiod.istio-system.svc"},
		{"127.0.0.1:15012", "127.0.0.1"},
		{"istiod.istio-system.svc:15012", "istiod.istio-system.svc"},
		{"dns:///istiod.istio-system.svc:15012", "istiod.istio-system.svc"},
		{"dns:///localhost:15012", "istiod.istio-system.svc"},
		{"[::1]:15012", "::1"},
		{"ca.example.com", "ca.example.com"},
		{"my-localhost-proxy:443", "istiod.istio-system.svc"},
		{"my.localhost.test:15012", "istiod.istio-system.svc"},
		{"meshid.istio-system.svc:15012", "meshid.istio-system.svc"},
		{"no-port", "no-port"},
		{"", ""},
	}
	for _, tc := range tests {
		if got := identity.CAServerName(tc.addr); got != tc.want {
			t.Errorf("CAServerName(%q) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}

func TestIDFromToken(t *testing.T) {
	tok := signToken(t, map[string]any{"kubernetes.io": map[string]any{"namespace": "prod", "serviceaccount": map[string]any{"name": "web"}}})
	id, err := identity.IDFromToken(tok, td)
	if err != nil || id.String() != "spiffe://cluster.local/ns/prod/sa/web" {
		t.Fatalf("IDFromToken = %v, %v", id, err)
	}
	if _, err := identity.IDFromToken(tok, spiffeid.TrustDomain{}); err == nil {
		t.Fatal("accepted a zero trust domain")
	}
	if _, err := identity.IDFromToken("garbage", td); err == nil {
		t.Fatal("accepted garbage")
	}
}
