package jwtkeys_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/meshid/meshid/ca/jwtkeys"
)

func TestEncodeParseRoundTrip(t *testing.T) {
	s, _ := rotate(t, nil, t0)
	b, err := jwtkeys.Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := jwtkeys.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	for n, k := range got.Keys {
		w := s.Keys[n]
		if k.ID != w.ID || !k.Private.Equal(w.Private) || !k.From.Equal(w.From) || !k.Until.Equal(w.Until) {
			t.Errorf("key %d: %s %s-%s, want %s %s-%s", n, k.ID, k.From, k.Until, w.ID, w.From, w.Until)
		}
	}
	if len(b) > jwtkeys.MaxEncodedSize/4 {
		t.Errorf("a Set of %d keys takes %d bytes: the limit %d is too tight", len(s.Keys), len(b), jwtkeys.MaxEncodedSize)
	}
}

// encoded builds an encoded Set of one key from raw parts.
func encoded(t *testing.T, jwk any, from, until time.Time) []byte {
	t.Helper()
	raw, err := json.Marshal(jwk)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(map[string]any{"version": 1, "keys": []any{
		map[string]any{"from": from, "until": until, "jwk": json.RawMessage(raw)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseRefusesWhatCannotSign(t *testing.T) {
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	kid, _ := jwtkeys.KeyID(&p256.PublicKey)
	jwk := func(k any, kid string) jose.JSONWebKey { return jose.JSONWebKey{Key: k, KeyID: kid} }
	// A private scalar that does not give the public point.
	mismatched := *p256
	mismatched.D = other.D
	s, _ := rotate(t, nil, t0)
	good, _ := jwtkeys.Encode(s)
	tooMany := `{"version":1,"keys":[` + strings.Repeat(`{"from":"2026-01-01T00:00:00Z","until":"2026-01-02T00:00:00Z","jwk":{}},`, jwtkeys.MaxKeys) +
		`{"from":"2026-01-01T00:00:00Z","until":"2026-01-02T00:00:00Z","jwk":{}}]}`
	for name, b := range map[string][]byte{
		"empty":             nil,
		"garbage":           []byte("\x00\xffnot json"),
		"oversized":         append(good, make([]byte, jwtkeys.MaxEncodedSize)...),
		"wrong version":     []byte(`{"version":2,"keys":[]}`),
		"no keys":           []byte(`{"version":1,"keys":[]}`),
		"unknown field":     []byte(`{"version":1,"keys":[],"extra":1}`),
		"too many keys":     []byte(tooMany),
		"symmetric key":     encoded(t, jwk([]byte("0123456789abcdef0123456789abcdef"), "k"), t0, t0.Add(life)),
		"public key only":   encoded(t, jwk(&p256.PublicKey, kid), t0, t0.Add(life)),
		"RSA key":           encoded(t, jwk(rsaKey, "r"), t0, t0.Add(life)),
		"P-384 key":         encoded(t, jwk(p384, "p"), t0, t0.Add(life)),
		"kid not thumbnail": encoded(t, jwk(p256, "chosen-by-attacker"), t0, t0.Add(life)),
		"halves mismatch":   encoded(t, jwk(&mismatched, kid), t0, t0.Add(life)),
		"empty interval":    encoded(t, jwk(p256, kid), t0, t0),
		"endless key":       encoded(t, jwk(p256, kid), t0, t0.Add(jwtkeys.MaxLifetime+time.Hour)),
		"HS256 alg":         encoded(t, jose.JSONWebKey{Key: p256, KeyID: kid, Algorithm: "HS256"}, t0, t0.Add(life)),
	} {
		if _, err := jwtkeys.Parse(b); err == nil {
			t.Errorf("%s: accepted", name)
		} else if d := p256.D.String(); strings.Contains(err.Error(), d) {
			t.Errorf("%s: the error holds the private key", name)
		}
	}
	if _, err := jwtkeys.Parse(encoded(t, jwk(p256, kid), t0, t0.Add(life))); err != nil {
		t.Errorf("a valid key: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	s, _, _ := jwtkeys.Rotate(nil, t0, life, ttl)
	b, _ := jwtkeys.Encode(s)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := jwtkeys.Parse(b)
		if err != nil {
			return
		}
		for _, k := range s.Keys {
			if kid, _ := jwtkeys.KeyID(&k.Private.PublicKey); kid != k.ID || !k.From.Before(k.Until) {
				t.Fatalf("accepted key %s", k.ID)
			}
		}
	})
}
