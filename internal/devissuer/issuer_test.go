package devissuer_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/devissuer"
)

func TestLoadOrCreateKeepsKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	a, err := devissuer.LoadOrCreate(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if a.Issuer() != devissuer.DefaultIssuer {
		t.Fatalf("issuer %q", a.Issuer())
	}
	for file, mode := range map[string]os.FileMode{devissuer.KeyFile: 0o600, devissuer.JWKSFile: 0o644} {
		st, err := os.Stat(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s mode %v, want %v", file, st.Mode().Perm(), mode)
		}
	}
	jwks1, _ := os.ReadFile(filepath.Join(dir, devissuer.JWKSFile))
	if bytes.Contains(jwks1, []byte(`"d"`)) {
		t.Fatal("jwks.json contains a private key")
	}
	os.Remove(filepath.Join(dir, devissuer.JWKSFile))
	b, err := devissuer.LoadOrCreate(dir, "https://other")
	if err != nil {
		t.Fatal(err)
	}
	jwks2, _ := os.ReadFile(filepath.Join(dir, devissuer.JWKSFile))
	if !bytes.Equal(jwks1, jwks2) || a.JWKS().Keys[0].KeyID != b.JWKS().Keys[0].KeyID {
		t.Fatal("reload did not reuse the key")
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(jwks2, &set); err != nil || len(set.Keys) != 1 || !set.Keys[0].IsPublic() {
		t.Fatalf("jwks.json: %v %+v", err, set)
	}
}

func TestLoadOrCreateRejectsBadKey(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, devissuer.KeyFile), []byte("not a key"), 0o600)
	if _, err := devissuer.LoadOrCreate(dir, ""); err == nil {
		t.Fatal("corrupt key accepted")
	}
}

func TestMint(t *testing.T) {
	now := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	for _, kt := range []certs.KeyType{certs.ECP256, certs.ECP384, certs.RSA2048, certs.Ed25519} {
		t.Run(string(kt), func(t *testing.T) {
			key, err := certs.GenerateKey(kt)
			if err != nil {
				t.Fatal(err)
			}
			iss, err := devissuer.New(key, "https://dev")
			if err != nil {
				t.Fatal(err)
			}
			tok, err := iss.Mint("shop", "cart", []string{"istio-ca", "x"}, time.Hour, now)
			if err != nil {
				t.Fatal(err)
			}
			parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.ES256, jose.ES384, jose.RS256, jose.EdDSA})
			if err != nil {
				t.Fatal(err)
			}
			if kid := parsed.Headers[0].KeyID; kid == "" || kid != iss.JWKS().Keys[0].KeyID {
				t.Fatalf("kid %q does not name the JWKS key", kid)
			}
			var std jwt.Claims
			var k8s struct {
				K struct {
					Namespace      string `json:"namespace"`
					ServiceAccount struct {
						Name string `json:"name"`
						UID  string `json:"uid"`
					} `json:"serviceaccount"`
				} `json:"kubernetes.io"`
			}
			if err := parsed.Claims(iss.JWKS().Keys[0].Key, &std, &k8s); err != nil {
				t.Fatal(err)
			}
			if err := std.ValidateWithLeeway(jwt.Expected{Issuer: "https://dev", Subject: "system:serviceaccount:shop:cart", AnyAudience: jwt.Audience{"istio-ca"}, Time: now}, 0); err != nil {
				t.Fatal(err)
			}
			if !std.Expiry.Time().Equal(now.Add(time.Hour)) || !std.NotBefore.Time().Equal(now) {
				t.Fatalf("exp %v nbf %v", std.Expiry.Time(), std.NotBefore.Time())
			}
			if k8s.K.Namespace != "shop" || k8s.K.ServiceAccount.Name != "cart" || len(k8s.K.ServiceAccount.UID) != 36 {
				t.Fatalf("kubernetes.io claims %+v", k8s.K)
			}
		})
	}
}

func TestMintRejects(t *testing.T) {
	key, _ := certs.GenerateKey(certs.ECP256)
	iss, err := devissuer.New(key, "")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tests := []struct {
		name   string
		ns, sa string
		aud    []string
		ttl    time.Duration
	}{
		{"no namespace", "", "sa", []string{"a"}, time.Hour},
		{"no service account", "ns", "", []string{"a"}, time.Hour},
		{"no audience", "ns", "sa", nil, time.Hour},
		{"zero ttl", "ns", "sa", []string{"a"}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := iss.Mint(tc.ns, tc.sa, tc.aud, tc.ttl, now); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
