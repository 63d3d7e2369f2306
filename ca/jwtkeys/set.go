package jwtkeys

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"slices"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Defaults and limits of a key lifetime.
const (
	// DefaultLifetime is how long one signing key signs (and how long it
	// is published before it does).
	DefaultLifetime = 24 * time.Hour
	// MinLifetime is the shortest lifetime: validators must have time to
	// fetch a key before it signs.
	MinLifetime = 10 * time.Minute
	// MaxLifetime is the longest: a key that signs for longer is worth
	// more to a thief.
	MaxLifetime = 30 * 24 * time.Hour
)

// Key is one ES256 signing key and the interval [From, Until) in which it
// signs.
type Key struct {
	ID          string // RFC 7638 thumbprint, base64url
	Private     *ecdsa.PrivateKey
	From, Until time.Time
}

// Set is the CA's signing keys, oldest first. A Set is not modified once
// built: Rotate returns a new one.
type Set struct {
	Keys []Key
}

// Signing returns the key that signs at now: the newest one whose interval
// holds now.
func (s *Set) Signing(now time.Time) (Key, bool) {
	if s == nil {
		return Key{}, false
	}
	for _, k := range slices.Backward(s.Keys) {
		if !now.Before(k.From) && now.Before(k.Until) {
			return k, true
		}
	}
	return Key{}, false
}

// Published returns the keys a bundle must hold at now: the keys that sign
// now or later, and the retired ones whose last token (signed before
// Until, valid for ttl) may not have expired.
func (s *Set) Published(now time.Time, ttl time.Duration) []Key {
	if s == nil {
		return nil
	}
	var out []Key
	for _, k := range s.Keys {
		if now.Before(k.Until.Add(ttl)) {
			out = append(out, k)
		}
	}
	return out
}

// Rotate returns the Set right for now, and whether it differs from s
// (nil s is an empty Set): a key that signs at now, the next one already
// published, and the retired keys still needed for their tokens (see
// Published). A Set with no key valid at now (new, or left alone for more
// than a lifetime) starts over with fresh keys.
func Rotate(s *Set, now time.Time, lifetime, ttl time.Duration) (*Set, bool, error) {
	keys := s.Published(now, ttl)
	changed := s == nil || len(keys) != len(s.Keys)
	cur, ok := (&Set{Keys: keys}).Signing(now)
	if !ok {
		k, err := NewKey(now, now.Add(lifetime))
		if err != nil {
			return nil, false, err
		}
		keys, cur, changed = append(keys, k), k, true
	}
	if last := keys[len(keys)-1]; last.ID == cur.ID { // no next key yet
		k, err := NewKey(cur.Until, cur.Until.Add(lifetime))
		if err != nil {
			return nil, false, err
		}
		keys, changed = append(keys, k), true
	}
	if !changed {
		return s, false, nil
	}
	return &Set{Keys: keys}, true, nil
}

// NextChange returns when Rotate will next change s: when a key stops
// signing (a new next key is due) or a retired key leaves the bundle.
func (s *Set) NextChange(now time.Time, ttl time.Duration) time.Time {
	var next time.Time
	for _, k := range s.Keys {
		for _, t := range []time.Time{k.Until, k.Until.Add(ttl)} {
			if t.After(now) && (next.IsZero() || t.Before(next)) {
				next = t
			}
		}
	}
	return next
}

// NewKey generates a P-256 key that signs in [from, until).
func NewKey(from, until time.Time) (Key, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Key{}, fmt.Errorf("jwtkeys: generate key: %w", err)
	}
	kid, err := KeyID(&priv.PublicKey)
	if err != nil {
		return Key{}, err
	}
	return Key{ID: kid, Private: priv, From: from, Until: until}, nil
}

// KeyID is the RFC 7638 thumbprint of pub, base64url: the "kid" of its
// tokens and of its JWKS entry.
func KeyID(pub *ecdsa.PublicKey) (string, error) {
	jwk := jose.JSONWebKey{Key: pub}
	tp, err := jwk.Thumbprint(crypto.SHA256)
	if err != nil {
		return "", fmt.Errorf("jwtkeys: key thumbprint: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(tp), nil
}
