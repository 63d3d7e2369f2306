package secretcache_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/sds/secretcache"
)

func signToken(t *testing.T, claims map[string]any) string {
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

func TestIdentityFromToken(t *testing.T) {
	k8s := func(ns, sa string) map[string]any {
		return map[string]any{"namespace": ns, "serviceaccount": map[string]any{"name": sa, "uid": "1234"}}
	}
	tests := []struct {
		name   string
		claims map[string]any
		raw    string // used instead of claims when set
		want   string // "" = error
	}{
		{"kubernetes.io claims", map[string]any{"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:ignored:ignored", "kubernetes.io": k8s("prod", "frontend")}, "", "spiffe://cluster.local/ns/prod/sa/frontend"},
		{"subject fallback", map[string]any{"sub": "system:serviceaccount:default:default"}, "", "spiffe://cluster.local/ns/default/sa/default"},
		{"trailing newline", nil, "NEWLINE", "spiffe://cluster.local/ns/default/sa/default"},
		{"no identity", map[string]any{"sub": "alice"}, "", ""},
		{"empty namespace", map[string]any{"kubernetes.io": k8s("", "sa")}, "", ""},
		{"bad segment", map[string]any{"kubernetes.io": k8s("a/b", "sa")}, "", ""},
		{"not a JWT", nil, "not-a-jwt-secret-value", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := tc.raw
			switch tok {
			case "":
				tok = signToken(t, tc.claims)
			case "NEWLINE":
				tok = signToken(t, map[string]any{"kubernetes.io": k8s("default", "default")}) + "\n"
			}
			id, err := secretcache.IdentityFromToken(tok, testTD)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("got %v, want an error", id)
				}
				if strings.Contains(err.Error(), strings.TrimSpace(tok)) || (len(tok) > 20 && strings.Contains(err.Error(), tok[:20])) {
					t.Fatal("the error contains the token")
				}
				return
			}
			if err != nil || id.String() != tc.want {
				t.Fatalf("got %v, %v; want %s", id, err, tc.want)
			}
		})
	}
	if _, err := secretcache.IdentityFromToken(signToken(t, map[string]any{"kubernetes.io": k8s("a", "b")}), spiffeid.TrustDomain{}); err == nil {
		t.Fatal("accepted a zero trust domain")
	}
}
