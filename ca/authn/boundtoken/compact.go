package boundtoken

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"math/big"
	"strings"

	"github.com/go-jose/go-jose/v4/jwt"
)

// Why this file hand-parses tokens: in a restart storm every token is cold
// (never seen by the CA). Through go-jose a cold ES256 token costs 115–152
// CPU-µs (BenchmarkAuthenticate/cold-gojose), of which the P-256 verify is
// about 90; the rest is go-jose's generic parse (the header into a map of
// raw messages, the claims through its reflection-based JSON, the
// kubernetes.io claims again through encoding/json: 193 allocations).
// Parsed here: 87–107 CPU-µs and 57 allocations, the verify 82% of it.
//
// parseCompact reads only the one shape the API server writes
// (pkg/serviceaccount: compact JWS, protected header {"alg","kid"}, Go's
// json.Marshal of the claims) and declines anything else, which is then
// parsed by go-jose exactly as before (slowToken). Declining is always
// safe: it costs time, never a verdict. What is accepted here must give
// the verdict go-jose's path gives; TestCompactMatchesGoJOSE and
// FuzzCompactMatchesGoJOSE compare the two on every input.
//
// The accepted shape:
//   - three base64url segments without padding, canonical (Strict: no
//     stray bits in the last character) and without CR or LF, which
//     go-jose's decoder would skip: then the signing input go-jose
//     rebuilds from the decoded bytes is the token's own text;
//   - a header object whose members are only "alg" (ES256 or RS256, the
//     API server's algorithms for EC and RSA keys), "kid" and "typ";
//   - a claims object whose members are only iss, sub, aud (a string or a
//     non-empty array of strings), exp, nbf, iat (non-negative integers of
//     at most 15 digits, which a float64 holds exactly, as go-jose parses
//     them), jti and kubernetes.io; kubernetes.io's only namespace,
//     serviceaccount, pod, secret, node (objects of name and uid) and
//     warnafter (an integer);
//   - JSON without whitespace, escapes, null, repeated members, or bytes
//     outside printable ASCII in strings (so that a string's bytes are
//     its value).

// b64 decodes the segments; Strict refuses non-canonical final characters.
var b64 = base64.RawURLEncoding.Strict()

// compactToken is a token parseCompact accepted.
type compactToken struct {
	alg, kid     string
	signingInput string // header.payload, as received
	sig          []byte
	claims       jwt.Claims
	kube         kubeClaims
}

// parseCompact parses token when it has the API server's shape; ok is
// false for anything else (see above).
func parseCompact(token string) (t *compactToken, ok bool) {
	if strings.ContainsAny(token, "\r\n") {
		return nil, false
	}
	h, rest, ok1 := strings.Cut(token, ".")
	p, s, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || strings.IndexByte(s, '.') >= 0 {
		return nil, false
	}
	// One buffer for the three decoded segments.
	buf := make([]byte, b64.DecodedLen(len(h))+b64.DecodedLen(len(p))+b64.DecodedLen(len(s)))
	hb, ok1 := decode(buf, h)
	pb, ok2 := decode(buf[len(hb):], p)
	sb, ok3 := decode(buf[len(hb)+len(pb):], s)
	if !ok1 || !ok2 || !ok3 {
		return nil, false
	}
	t = &compactToken{signingInput: token[:len(h)+1+len(p)], sig: sb}
	if !t.parseHeader(hb) || (t.alg != "ES256" && t.alg != "RS256") || !t.parseClaims(pb) {
		return nil, false
	}
	return t, true
}

// decode decodes segment into the start of dst and returns that part.
func decode(dst []byte, segment string) ([]byte, bool) {
	n, err := b64.Decode(dst, []byte(segment))
	return dst[:n], err == nil
}

func (t *compactToken) parseHeader(b []byte) bool {
	s := scanner{b: b}
	var seen bits
	return s.object(func(key []byte) bool {
		switch string(key) {
		case "alg":
			return seen.first(0) && s.str(&t.alg)
		case "kid":
			return seen.first(1) && s.str(&t.kid)
		case "typ":
			var typ string
			return seen.first(2) && s.str(&typ)
		}
		return false
	}) && s.end()
}

func (t *compactToken) parseClaims(b []byte) bool {
	s := scanner{b: b}
	var seen bits
	c, k := &t.claims, &t.kube
	return s.object(func(key []byte) bool {
		switch string(key) {
		case "iss":
			return seen.first(0) && s.str(&c.Issuer)
		case "sub":
			return seen.first(1) && s.str(&c.Subject)
		case "aud":
			return seen.first(2) && s.audience(&c.Audience)
		case "exp":
			return seen.first(3) && s.date(&c.Expiry)
		case "nbf":
			return seen.first(4) && s.date(&c.NotBefore)
		case "iat":
			return seen.first(5) && s.date(&c.IssuedAt)
		case "jti":
			return seen.first(6) && s.str(&c.ID)
		case "kubernetes.io":
			return seen.first(7) && s.kube(k)
		}
		return false
	}) && s.end()
}

// verifiedBy reports whether key verifies the signature, as go-jose's
// verifiers do for these two algorithms (asymmetric.go verifyPayload):
// ES256 needs a P-256 key and a 64-byte r||s, RS256 an RSA key and
// PKCS #1 v1.5.
func (t *compactToken) verifiedBy(key any) bool {
	switch t.alg {
	case "ES256":
		pub, ok := key.(*ecdsa.PublicKey)
		if !ok || pub == nil || pub.Curve != elliptic.P256() || len(t.sig) != 64 {
			return false
		}
		h := sha256.Sum256([]byte(t.signingInput))
		r, s := new(big.Int).SetBytes(t.sig[:32]), new(big.Int).SetBytes(t.sig[32:])
		return ecdsa.Verify(pub, h[:], r, s)
	case "RS256":
		pub, ok := key.(*rsa.PublicKey)
		if !ok || pub == nil {
			return false
		}
		h := sha256.Sum256([]byte(t.signingInput))
		return rsa.VerifyPKCS1v15(pub, crypto.SHA256, h[:], t.sig) == nil
	}
	return false
}

// bits records which members of an object were seen.
type bits uint16

// first marks member i and reports whether it was not seen before.
func (b *bits) first(i uint) bool {
	if *b&(1<<i) != 0 {
		return false
	}
	*b |= 1 << i
	return true
}

// scanner reads the JSON subset described at the top of this file. Every
// method reports false for input outside it.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) next(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end reports whether everything was read.
func (s *scanner) end() bool { return s.i == len(s.b) }

// raw reads a string of printable ASCII without escapes.
func (s *scanner) raw() ([]byte, bool) {
	if !s.next('"') {
		return nil, false
	}
	for j := s.i; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			v := s.b[s.i:j]
			s.i = j + 1
			return v, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

func (s *scanner) str(dst *string) bool {
	v, ok := s.raw()
	*dst = string(v)
	return ok
}

// object reads an object, calling member after each key to read its value.
func (s *scanner) object(member func(key []byte) bool) bool {
	if !s.next('{') {
		return false
	}
	if s.next('}') {
		return true
	}
	for {
		key, ok := s.raw()
		if !ok || !s.next(':') || !member(key) {
			return false
		}
		if s.next('}') {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// date reads a non-negative integer of at most 15 digits (exact in the
// float64 go-jose's NumericDate parses through).
func (s *scanner) date(dst **jwt.NumericDate) bool {
	var n int64
	if !s.int(&n) {
		return false
	}
	d := jwt.NumericDate(n)
	*dst = &d
	return true
}

func (s *scanner) int(dst *int64) bool {
	j := s.i
	for j < len(s.b) && s.b[j] >= '0' && s.b[j] <= '9' {
		j++
	}
	digits := s.b[s.i:j]
	if len(digits) == 0 || len(digits) > 15 || (digits[0] == '0' && len(digits) > 1) {
		return false
	}
	var n int64
	for _, c := range digits {
		n = n*10 + int64(c-'0')
	}
	*dst, s.i = n, j
	return true
}

// audience reads a string or a non-empty array of strings.
func (s *scanner) audience(dst *jwt.Audience) bool {
	if !s.next('[') {
		var a string
		ok := s.str(&a)
		*dst = jwt.Audience{a}
		return ok
	}
	for {
		var a string
		if !s.str(&a) {
			return false
		}
		*dst = append(*dst, a)
		if s.next(']') {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

func (s *scanner) kube(k *kubeClaims) bool {
	var seen bits
	return s.object(func(key []byte) bool {
		switch string(key) {
		case "namespace":
			return seen.first(0) && s.str(&k.namespace)
		case "serviceaccount":
			return seen.first(1) && s.ref(&k.serviceAccount)
		case "pod":
			k.pod = new(ref)
			return seen.first(2) && s.ref(k.pod)
		case "secret":
			k.secret = new(ref)
			return seen.first(3) && s.ref(k.secret)
		case "node":
			k.node = new(ref)
			return seen.first(4) && s.ref(k.node)
		case "warnafter":
			var n int64
			return seen.first(5) && s.int(&n)
		}
		return false
	})
}

func (s *scanner) ref(r *ref) bool {
	var seen bits
	return s.object(func(key []byte) bool {
		switch string(key) {
		case "name":
			return seen.first(0) && s.str(&r.Name)
		case "uid":
			return seen.first(1) && s.str(&r.UID)
		}
		return false
	})
}
