package jwtkeys

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Limits of an encoded Set: what Parse accepts from a file or a Secret.
const (
	// MaxEncodedSize bounds an encoded Set. Rotate keeps at most three
	// keys of about 300 bytes each; the bound leaves room and no more.
	MaxEncodedSize = 16 << 10
	// MaxKeys bounds the keys of an encoded Set.
	MaxKeys = 8
)

// version is the encoding's version; Parse refuses others.
const version = 1

type encodedSet struct {
	Version int          `json:"version"`
	Keys    []encodedKey `json:"keys"`
}

type encodedKey struct {
	From  time.Time       `json:"from"`
	Until time.Time       `json:"until"`
	JWK   json.RawMessage `json:"jwk"` // a private EC JWK
}

// Encode returns s with its private keys: store it as a secret (a 0600
// file, a Kubernetes Secret), never log it.
func Encode(s *Set) ([]byte, error) {
	e := encodedSet{Version: version, Keys: make([]encodedKey, 0, len(s.Keys))}
	for _, k := range s.Keys {
		jwk, err := json.Marshal(jose.JSONWebKey{Key: k.Private, KeyID: k.ID, Algorithm: string(jose.ES256), Use: "sig"})
		if err != nil {
			return nil, fmt.Errorf("jwtkeys: encode key %s: %w", k.ID, err)
		}
		e.Keys = append(e.Keys, encodedKey{From: k.From.UTC(), Until: k.Until.UTC(), JWK: jwk})
	}
	return json.Marshal(e)
}

// Parse decodes an encoded Set and checks every key: at most MaxKeys
// ES256 keys on P-256 with their private part, each matching its public
// part and named by its thumbprint, with From before Until, in at most
// MaxEncodedSize bytes. It never returns key material in an error.
func Parse(b []byte) (*Set, error) {
	if len(b) > MaxEncodedSize {
		return nil, fmt.Errorf("jwtkeys: encoded key set is %d bytes, more than the limit of %d", len(b), MaxEncodedSize)
	}
	var e encodedSet
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return nil, errors.New("jwtkeys: the key set is not valid JSON of the expected shape")
	}
	switch {
	case e.Version != version:
		return nil, fmt.Errorf("jwtkeys: key set version %d, want %d", e.Version, version)
	case len(e.Keys) == 0:
		return nil, errors.New("jwtkeys: the key set has no key")
	case len(e.Keys) > MaxKeys:
		return nil, fmt.Errorf("jwtkeys: the key set has %d keys, more than the limit of %d", len(e.Keys), MaxKeys)
	}
	s := &Set{Keys: make([]Key, 0, len(e.Keys))}
	for n, ek := range e.Keys {
		k, err := parseKey(ek)
		if err != nil {
			return nil, fmt.Errorf("jwtkeys: key %d: %w", n, err)
		}
		if slices.ContainsFunc(s.Keys, func(o Key) bool { return o.ID == k.ID }) {
			return nil, fmt.Errorf("jwtkeys: key %d: key ID %s appears twice", n, k.ID)
		}
		s.Keys = append(s.Keys, k)
	}
	slices.SortStableFunc(s.Keys, func(a, b Key) int { return a.From.Compare(b.From) })
	return s, nil
}

// parseKey checks one key; see Parse.
func parseKey(ek encodedKey) (Key, error) {
	var jwk jose.JSONWebKey
	if err := jwk.UnmarshalJSON(ek.JWK); err != nil {
		return Key{}, errors.New("not a valid JWK")
	}
	priv, ok := jwk.Key.(*ecdsa.PrivateKey)
	switch {
	case !ok:
		return Key{}, fmt.Errorf("a %T, want an EC private key (a public, symmetric, RSA or OKP key cannot sign ES256)", jwk.Key)
	case priv.Curve != elliptic.P256():
		return Key{}, errors.New("not on the P-256 curve")
	case jwk.Algorithm != "" && jwk.Algorithm != string(jose.ES256):
		return Key{}, fmt.Errorf("algorithm %q, want ES256", jwk.Algorithm)
	case !ek.From.Before(ek.Until):
		return Key{}, errors.New("its interval is empty (from is not before until)")
	case ek.Until.Sub(ek.From) > MaxLifetime:
		return Key{}, fmt.Errorf("it signs for %s, more than the limit of %s", ek.Until.Sub(ek.From), MaxLifetime)
	}
	// The private scalar must give the public point: a key whose halves
	// disagree would sign tokens that its own JWKS entry rejects.
	ecdhPriv, err := priv.ECDH()
	if err != nil {
		return Key{}, errors.New("an invalid private key")
	}
	ecdhPub, err := priv.PublicKey.ECDH()
	if err != nil || !ecdhPriv.PublicKey().Equal(ecdhPub) {
		return Key{}, errors.New("its private part does not match its public part")
	}
	kid, err := KeyID(&priv.PublicKey)
	if err != nil {
		return Key{}, err
	}
	if jwk.KeyID != kid {
		return Key{}, fmt.Errorf("key ID %q is not its thumbprint %s", jwk.KeyID, kid)
	}
	return Key{ID: kid, Private: priv, From: ek.From, Until: ek.Until}, nil
}
