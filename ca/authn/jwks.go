package authn

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/go-jose/go-jose/v4"
)

// maxJWKSBytes bounds a JWKS or discovery document, from a file or a URL.
const maxJWKSBytes = 1 << 20

// ParseJWKS parses a JSON Web Key Set and keeps only the public part of its
// asymmetric signing keys. A set with no usable key is an error.
func ParseJWKS(data []byte) (*jose.JSONWebKeySet, error) {
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("authn: parse JWKS: %w", err)
	}
	return publicSigningKeys(&set)
}

// publicSigningKeys returns the public halves of the asymmetric signing
// keys in set.
func publicSigningKeys(set *jose.JSONWebKeySet) (*jose.JSONWebKeySet, error) {
	out := &jose.JSONWebKeySet{}
	for _, k := range set.Keys {
		if k.Use == "enc" {
			continue
		}
		switch k.Key.(type) {
		case *ecdsa.PublicKey, *ecdsa.PrivateKey, *rsa.PublicKey, *rsa.PrivateKey, ed25519.PublicKey, ed25519.PrivateKey:
		default:
			continue // symmetric or unknown: never trusted for signatures
		}
		pub := k.Public()
		if !pub.Valid() {
			continue
		}
		out.Keys = append(out.Keys, pub)
	}
	if len(out.Keys) == 0 {
		return nil, errors.New("authn: JWKS holds no asymmetric signing key")
	}
	return out, nil
}

// readJWKSFile reads and parses a JWKS file.
func readJWKSFile(path string) (*jose.JSONWebKeySet, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("authn: read JWKS: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("authn: read JWKS %s: %w", path, err)
	}
	if len(data) > maxJWKSBytes {
		return nil, fmt.Errorf("authn: JWKS %s is larger than %d bytes", path, maxJWKSBytes)
	}
	set, err := ParseJWKS(data)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return set, nil
}

// discoverJWKSURL reads <issuer>/.well-known/openid-configuration and
// returns its jwks_uri. The document's issuer must equal issuer (OpenID
// Connect Discovery 1.0, section 4.3).
func discoverJWKSURL(ctx context.Context, hc *http.Client, issuer string) (string, error) {
	u := strings.TrimSuffix(issuer, "/") + "/.well-known/openid-configuration"
	data, err := httpGet(ctx, hc, u)
	if err != nil {
		return "", err
	}
	var doc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return "", fmt.Errorf("authn: parse %s: %w", u, err)
	}
	if doc.Issuer != issuer {
		return "", fmt.Errorf("authn: %s names issuer %q, want %q", u, doc.Issuer, issuer)
	}
	if doc.JWKSURI == "" {
		return "", fmt.Errorf("authn: %s has no jwks_uri", u)
	}
	return doc.JWKSURI, nil
}

// fetchJWKS downloads and parses a JWKS.
func fetchJWKS(ctx context.Context, hc *http.Client, u string) (*jose.JSONWebKeySet, error) {
	data, err := httpGet(ctx, hc, u)
	if err != nil {
		return nil, err
	}
	set, err := ParseJWKS(data)
	if err != nil {
		return nil, fmt.Errorf("%w (from %s)", err, u)
	}
	return set, nil
}

func httpGet(ctx context.Context, hc *http.Client, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("authn: GET %s: %w", u, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("authn: GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("authn: GET %s: %s", u, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("authn: GET %s: %w", u, err)
	}
	if len(data) > maxJWKSBytes {
		return nil, fmt.Errorf("authn: GET %s: body larger than %d bytes", u, maxJWKSBytes)
	}
	return data, nil
}
