package boundtoken

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/meshid/meshid/certs"
)

// compactEnv is a Verifier without a cache (every token is verified) whose
// JWKS holds the ES256 key and an RS256 key.
func compactEnv(t testing.TB) (*env, *rsa.PrivateKey) {
	e := newEnv(t, func(c *Config) { c.CacheSize = -1 })
	rk := e.api.addRSAKey(t)
	if err := e.v.Refresh(e.ctx); err != nil {
		t.Fatal(err)
	}
	return e, rk
}

// verdict is what verify returns, comparable.
type verdict struct {
	b      *binding
	keyset bool
	err    string
}

func (e *env) verdict(token string, goJOSEOnly bool) verdict {
	e.v.goJOSEOnly = goJOSEOnly
	defer func() { e.v.goJOSEOnly = false }()
	b, ks, err := e.v.verify(e.ctx, token, e.v.keys.Load())
	v := verdict{b: b, keyset: ks != nil}
	if err != nil {
		v.err = err.Error()
	}
	return v
}

// sameVerdict fails unless parseCompact's path and go-jose's give the same
// verdict on token.
func (e *env) sameVerdict(t testing.TB, token string) (compact bool) {
	t.Helper()
	_, compact = parseCompact(token)
	fast, slow := e.verdict(token, false), e.verdict(token, true)
	if !reflect.DeepEqual(fast, slow) {
		t.Fatalf("token %q (parsed here: %v):\nthis package's parse: %+v %+v\ngo-jose:              %+v %+v",
			token, compact, fast, fast.b, slow, slow.b)
	}
	return compact
}

// signRaw signs header and payload as given, byte for byte.
func signRaw(t testing.TB, key crypto.Signer, header, payload string) string {
	t.Helper()
	in := base64.RawURLEncoding.EncodeToString([]byte(header)) + "." + base64.RawURLEncoding.EncodeToString([]byte(payload))
	h := sha256.Sum256([]byte(in))
	var sig []byte
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		r, s, err := ecdsa.Sign(rand.Reader, k, h[:])
		if err != nil {
			t.Fatal(err)
		}
		sig = append(r.FillBytes(make([]byte, 32)), s.FillBytes(make([]byte, 32))...)
	case *rsa.PrivateKey:
		var err error
		if sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, h[:]); err != nil {
			t.Fatal(err)
		}
	}
	return in + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// claimVariants are claims around a genuine token's: every member
// missing, of another type, null, or with values at the edges.
func claimVariants() []map[string]any {
	var out []map[string]any
	add := func(mod func(c, k map[string]any)) {
		c := tokenClaims(t0)
		mod(c, c["kubernetes.io"].(map[string]any))
		out = append(out, c)
	}
	add(func(c, k map[string]any) {})
	for _, name := range []string{"iss", "sub", "aud", "exp", "nbf", "iat", "jti", "kubernetes.io"} {
		for _, v := range []any{nil, 1, "x", []any{}, []any{"istio-ca", 2}, map[string]any{}, 1.5, -1} {
			add(func(c, k map[string]any) { c[name] = v })
		}
		add(func(c, k map[string]any) { delete(c, name) })
	}
	for _, name := range []string{"namespace", "serviceaccount", "pod", "secret", "node", "warnafter", "unknown"} {
		for _, v := range []any{nil, 1, "x", "", map[string]any{}, map[string]any{"name": "cart-0"},
			map[string]any{"name": "cart", "uid": "sa-uid"}, map[string]any{"Name": "cart", "UID": "sa-uid"},
			map[string]any{"name": "cart", "uid": "sa-uid", "extra": true}, map[string]any{"name": 1, "uid": "x"}} {
			add(func(c, k map[string]any) { k[name] = v })
		}
		add(func(c, k map[string]any) { delete(k, name) })
	}
	add(func(c, k map[string]any) { c["aud"] = "istio-ca" })
	add(func(c, k map[string]any) { c["aud"] = []string{"vault", "istio-ca"} })
	add(func(c, k map[string]any) { c["aud"] = []string{"vault"} })
	add(func(c, k map[string]any) { c["iss"] = "https://other.example" })
	add(func(c, k map[string]any) { c["extra"] = "claim" })
	add(func(c, k map[string]any) { c["exp"] = t0.Add(-time.Second).Unix() })
	add(func(c, k map[string]any) { c["exp"] = t0.Add(-2 * DefaultLeeway).Unix() })
	add(func(c, k map[string]any) { c["nbf"] = t0.Add(2 * DefaultLeeway).Unix() })
	add(func(c, k map[string]any) { c["iat"] = t0.Add(2 * DefaultLeeway).Unix() })
	add(func(c, k map[string]any) { c["exp"] = int64(1) << 53 })
	add(func(c, k map[string]any) { c["exp"] = 1e20 })
	add(func(c, k map[string]any) { c["exp"] = 0 })
	add(func(c, k map[string]any) { k["namespace"] = "shöp" })   // non-ASCII
	add(func(c, k map[string]any) { k["namespace"] = "<shop>" }) // json.Marshal escapes < and >
	add(func(c, k map[string]any) { k["pod"] = map[string]any{"name": "cart-0", "uid": "other"} })
	add(func(c, k map[string]any) { delete(k, "pod"); k["secret"] = map[string]any{"name": "s", "uid": "u"} })
	add(func(c, k map[string]any) { delete(k, "pod") })                            // bound to a node only
	add(func(c, k map[string]any) { delete(k, "pod"); delete(k, "node") })         // kubectl create token
	add(func(c, k map[string]any) { k["warnafter"] = t0.Add(time.Minute).Unix() }) // the API server's own
	return out
}

// rawPayloads are claims JSON the API server would not write: whitespace,
// escapes, repeated members, numbers in every notation, invalid JSON.
func rawPayloads() []string {
	kube := `"kubernetes.io":{"namespace":"shop","serviceaccount":{"name":"cart","uid":"sa-uid"},"pod":{"name":"cart-0","uid":"pod-uid"}}`
	reg := func(exp string) string {
		return `{"aud":["istio-ca"],"exp":` + exp + `,"iat":1772366400,"iss":"` + testIssuer + `",` + kube + `,"nbf":1772366400,"sub":"s"}`
	}
	out := []string{
		reg("1772370000"), reg("1772370000.0"), reg("1.77237e9"), reg("1772370000e0"), reg("01772370000"), reg("-1"),
		reg("1772370000 "), reg(`"1772370000"`), reg("null"), reg("true"), reg("9999999999999999"), reg("1e400"), reg(""),
		strings.Replace(reg("1772370000"), `"iss"`, `"ISS"`, 1),
		strings.Replace(reg("1772370000"), `"iss"`, `"\u0069ss"`, 1),
		strings.Replace(reg("1772370000"), `"shop"`, `"sh\u006fp"`, 1),
		strings.Replace(reg("1772370000"), `"shop"`, `"sh\/op"`, 1),
		strings.Replace(reg("1772370000"), `{"aud"`, `{ "aud"`, 1),
		strings.Replace(reg("1772370000"), `,"sub"`, `,"sub":"t","sub"`, 1),
		strings.Replace(reg("1772370000"), `,"sub"`, `,"iss":"https://other.example","sub"`, 1),
		strings.Replace(reg("1772370000"), `"namespace":"shop"`, `"namespace":"shop","namespace":"other"`, 1),
		strings.Replace(reg("1772370000"), `"uid":"pod-uid"`, `"uid":"pod-uid","uid":"x"`, 1),
		strings.Replace(reg("1772370000"), `"name":"cart-0"`, `"Name":"cart-0"`, 1),
		strings.Replace(reg("1772370000"), `"pod":{`, `"pod":null,"x":{`, 1),
		strings.Replace(reg("1772370000"), `"sub":"s"`, "\"sub\":\"s\x01\"", 1),
		strings.Replace(reg("1772370000"), `"sub":"s"`, "\"sub\":\"s\xff\"", 1),
		strings.Replace(reg("1772370000"), `"shop"`, "\"sh\xffop\"", 1),
		strings.Replace(reg("1772370000"), `["istio-ca"]`, `[]`, 1),
		strings.Replace(reg("1772370000"), `["istio-ca"]`, `["istio-ca",]`, 1),
		strings.Replace(reg("1772370000"), `["istio-ca"]`, `["a","istio-ca"]`, 1),
		reg("1772370000") + " ", reg("1772370000") + "{}", reg("1772370000")[:40], "{}", "[]", "null", "", `{"iss":"` + testIssuer + `"}`,
	}
	return out
}

// headers are protected headers around the API server's {"alg","kid"}.
func headers(ecKid, rsaKid string) []string {
	h := func(alg, kid string) string { return `{"alg":"` + alg + `","kid":"` + kid + `"}` }
	return []string{
		h("ES256", ecKid), h("RS256", rsaKid), h("ES256", rsaKid), h("RS256", ecKid), h("ES256", "unknown"),
		h("ES384", ecKid), h("PS256", rsaKid), h("HS256", ecKid), h("none", ecKid),
		`{"alg":"ES256"}`, `{"alg":"RS256"}`, `{"kid":"` + ecKid + `"}`, `{}`, ``, `[]`, `null`,
		`{"alg":"ES256","kid":"` + ecKid + `","typ":"JWT"}`,
		`{"alg":"ES256","kid":"` + ecKid + `","typ":1}`,
		`{"alg":"ES256","kid":"` + ecKid + `","alg":"RS256"}`,
		`{"alg":"ES256","kid":null}`,
		`{"alg":"ES256","kid":"` + ecKid + `","crit":["b64"],"b64":false}`,
		`{"alg":"ES256","kid":"` + ecKid + `","crit":["exp"]}`,
		`{"alg":"ES256","kid":"` + ecKid + `","jwk":{"kty":"oct","k":"AAAA"}}`,
		`{"alg":"ES256","kid":"` + ecKid + `","nonce":"n"}`,
		`{"alg":"ES\u0032\u0035\u0036","kid":"` + ecKid + `"}`,
		`{ "alg":"ES256","kid":"` + ecKid + `"}`,
		`{"alg":"ES256","kid":"` + ecKid + `"} `,
	}
}

// compactCorpus is the differential corpus: genuine tokens and their
// variants in every part, signed by the right keys, the wrong ones and
// none.
func compactCorpus(t testing.TB, e *env, rk *rsa.PrivateKey) []string {
	ek := e.api.key()
	stranger, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, cl := range claimVariants() {
		p, err := json.Marshal(cl)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out,
			signRaw(t, ek, `{"alg":"ES256","kid":"`+kid(ek)+`"}`, string(p)),
			signRaw(t, rk, `{"alg":"RS256","kid":"`+rsaKid(rk)+`"}`, string(p)),
			sign(t, ek, jose.ES256, "", cl), // typ JWT, no kid
			signRaw(t, stranger, `{"alg":"ES256","kid":"`+kid(ek)+`"}`, string(p)),
			noneToken(t, cl))
	}
	payloads := rawPayloads()
	for _, p := range payloads {
		out = append(out, signRaw(t, ek, `{"alg":"ES256","kid":"`+kid(ek)+`"}`, p))
	}
	for _, h := range headers(kid(ek), rsaKid(rk)) {
		for _, key := range []crypto.Signer{ek, rk} {
			out = append(out, signRaw(t, key, h, payloads[0]))
		}
	}
	// Every truncation, and every character replaced, of two genuine
	// tokens; CR, LF and padding added; the signature's last character
	// made non-canonical.
	for _, tok := range out[:2] {
		for i := range len(tok) {
			out = append(out, tok[:i], tok[:i]+string(otherB64(tok[i]))+tok[i+1:])
		}
		dot, dot2 := strings.IndexByte(tok, '.'), strings.LastIndexByte(tok, '.')
		out = append(out, nonCanonical(tok, dot), nonCanonical(tok, dot2), tok[:dot]+"\n"+tok[dot:], tok+"\r\n", tok+"==", tok[:dot]+"=="+tok[dot:], tok+".", "."+tok,
			tok[:len(tok)-1]+string(tok[len(tok)-1]+1))
	}
	return out
}

// nonCanonical sets the unused low bits of the base64 character before
// tok[end]: the same bytes to a lenient decoder, another text.
func nonCanonical(tok string, end int) string {
	c := tok[end-1]
	return tok[:end-1] + string(otherB64(c)) + tok[end:]
}

// otherB64 is another base64url character than c.
func otherB64(c byte) byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, c)
	return alphabet[(i+1+len(alphabet))%len(alphabet)]
}

// TestCompactMatchesGoJOSE is the proof that parseCompact changes no
// verdict: on every token of the corpus the verifier answers the same
// (binding, key set, error) with parseCompact as with go-jose alone, and
// parseCompact takes every genuine token.
func TestCompactMatchesGoJOSE(t *testing.T) {
	e, rk := compactEnv(t)
	corpus := compactCorpus(t, e, rk)
	compact, accepted := 0, 0
	for _, tok := range corpus {
		if e.sameVerdict(t, tok) {
			compact++
		}
		if v := e.verdict(tok, false); v.err == "" {
			accepted++
		}
	}
	t.Logf("%d tokens: %d parsed here, %d accepted", len(corpus), compact, accepted)
	// The API server's own shapes must take the fast path.
	for _, tok := range []string{
		signRaw(t, e.api.key(), `{"alg":"ES256","kid":"`+kid(e.api.key())+`"}`, mustJSON(t, tokenClaims(t0))),
		signRaw(t, rk, `{"alg":"RS256","kid":"`+rsaKid(rk)+`"}`, mustJSON(t, tokenClaims(t0))),
		e.genuine(t, tokenClaims(t0)),
	} {
		if _, ok := parseCompact(tok); !ok {
			t.Fatalf("a genuine token is not parsed here: %s", tok)
		}
		if v := e.verdict(tok, false); v.err != "" || v.b == nil || v.b.pod == nil || v.b.pod.UID != "pod-uid" {
			t.Fatalf("a genuine token: %+v", v)
		}
	}
	if compact < 200 || accepted < 5 {
		t.Fatalf("the corpus is too weak: %d parsed here, %d accepted", compact, accepted)
	}
}

func mustJSON(t testing.TB, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// FuzzCompactMatchesGoJOSE compares the two parses on arbitrary tokens, and
// on arbitrary headers and claims signed with the cluster's key (so that
// the claims, not only the signature, are reached).
func FuzzCompactMatchesGoJOSE(f *testing.F) {
	e, rk := compactEnv(f)
	ek := e.api.key()
	for _, p := range rawPayloads() {
		f.Add("", `{"alg":"ES256","kid":"`+kid(ek)+`"}`, p)
	}
	for _, h := range headers(kid(ek), rsaKid(rk)) {
		f.Add("", h, rawPayloads()[0])
	}
	for _, cl := range claimVariants()[:20] {
		f.Add(e.genuine(f, cl), "", "")
	}
	f.Fuzz(func(t *testing.T, token, header, payload string) {
		e.sameVerdict(t, token)
		e.sameVerdict(t, signRaw(t, ek, header, payload))
		e.sameVerdict(t, signRaw(t, rk, header, payload))
	})
}
