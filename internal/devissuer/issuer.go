package devissuer

import (
	"cmp"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/identity"
)

// File names in the state directory, and the default issuer URL.
const (
	KeyFile       = "jwt-key.pem"
	JWKSFile      = "jwks.json"
	DefaultIssuer = "https://meshid.dev.local"
)

// Issuer mints service-account JWTs.
type Issuer struct {
	issuer string
	signer jose.Signer
	jwks   *jose.JSONWebKeySet
}

// ErrNoKey is returned by Load for a directory that holds no signing key
// (<dir>/jwt-key.pem): no issuer was ever created there.
var ErrNoKey = errors.New("devissuer: no issuer key")

// Load loads the issuer whose signing key is <dir>/jwt-key.pem, and writes
// nothing: a directory without that key is refused with an error wrapping
// ErrNoKey (and os.ErrNotExist). An empty issuer means DefaultIssuer.
func Load(dir string, issuer string) (*Issuer, error) {
	keyPath := filepath.Join(dir, KeyFile)
	data, err := os.ReadFile(keyPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s does not exist (%w)", ErrNoKey, keyPath, os.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("devissuer: %w", err)
	}
	key, err := certs.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("devissuer: %s: %w", keyPath, err)
	}
	i, err := New(key, issuer)
	if err != nil {
		return nil, fmt.Errorf("%w (key %s)", err, keyPath)
	}
	return i, nil
}

// LoadOrCreate loads the signing key from <dir>/jwt-key.pem, or creates an
// ECDSA P-256 key there (mode 0600, written atomically) when there is none,
// and (re)writes the public key set to <dir>/jwks.json (mode 0644). An empty
// issuer means DefaultIssuer.
func LoadOrCreate(dir string, issuer string) (*Issuer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("devissuer: %w", err)
	}
	i, err := Load(dir, issuer)
	if errors.Is(err, ErrNoKey) {
		i, err = create(dir, issuer)
	}
	if err != nil {
		return nil, err
	}
	jwks, err := json.MarshalIndent(i.jwks, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("devissuer: encode JWKS: %w", err)
	}
	if err := certs.WriteFileAtomic(filepath.Join(dir, JWKSFile), append(jwks, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("devissuer: %w", err)
	}
	return i, nil
}

// create generates an ECDSA P-256 signing key and writes it to
// <dir>/jwt-key.pem (mode 0600, atomically).
func create(dir, issuer string) (*Issuer, error) {
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		return nil, fmt.Errorf("devissuer: generate key: %w", err)
	}
	pemKey, err := certs.EncodePrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("devissuer: %w", err)
	}
	if err := certs.WriteFileAtomic(filepath.Join(dir, KeyFile), pemKey, 0o600); err != nil {
		return nil, fmt.Errorf("devissuer: %w", err)
	}
	return New(key, issuer)
}

// New returns an in-memory Issuer that signs with key (ECDSA P-256/P-384,
// RSA or Ed25519). An empty issuer means DefaultIssuer.
func New(key crypto.Signer, issuer string) (*Issuer, error) {
	issuer = cmp.Or(issuer, DefaultIssuer)
	alg, err := algorithmFor(key)
	if err != nil {
		return nil, err
	}
	pub := jose.JSONWebKey{Key: key.Public(), Algorithm: string(alg), Use: "sig"}
	thumb, err := pub.Thumbprint(crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("devissuer: key thumbprint: %w", err)
	}
	pub.KeyID = base64.RawURLEncoding.EncodeToString(thumb)
	signer, err := jose.NewSigner(
		jose.SigningKey{Algorithm: alg, Key: jose.JSONWebKey{Key: key, KeyID: pub.KeyID, Algorithm: string(alg)}},
		(&jose.SignerOptions{}).WithType("JWT"),
	)
	if err != nil {
		return nil, fmt.Errorf("devissuer: signer: %w", err)
	}
	return &Issuer{issuer: issuer, signer: signer, jwks: &jose.JSONWebKeySet{Keys: []jose.JSONWebKey{pub}}}, nil
}

func algorithmFor(key crypto.Signer) (jose.SignatureAlgorithm, error) {
	switch k := key.Public().(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return jose.ES256, nil
		case elliptic.P384():
			return jose.ES384, nil
		}
	case *rsa.PublicKey:
		return jose.RS256, nil
	case ed25519.PublicKey:
		return jose.EdDSA, nil
	}
	return "", fmt.Errorf("devissuer: unsupported signing key %s", certs.KeyTypeOf(key.Public()))
}

// Issuer returns the iss claim of minted tokens.
func (i *Issuer) Issuer() string { return i.issuer }

// JWKS returns the public key set that verifies minted tokens.
func (i *Issuer) JWKS() *jose.JSONWebKeySet {
	return &jose.JSONWebKeySet{Keys: append([]jose.JSONWebKey(nil), i.jwks.Keys...)}
}

// Mint returns a service-account JWT for namespace/serviceAccount, shaped
// like a Kubernetes projected token: iss, sub system:serviceaccount:ns:sa,
// aud, iat, nbf = now, exp = now+ttl, and kubernetes.io{namespace,
// serviceaccount{name, uid}}. The uid is derived from the name, so it is
// stable across runs.
func (i *Issuer) Mint(namespace, serviceAccount string, audiences []string, ttl time.Duration, now time.Time) (string, error) {
	if namespace == "" || serviceAccount == "" {
		return "", errors.New("devissuer: namespace and service account are required")
	}
	if len(audiences) == 0 {
		return "", errors.New("devissuer: at least one audience is required")
	}
	if ttl <= 0 {
		return "", fmt.Errorf("devissuer: token TTL must be positive, got %s", ttl)
	}
	sa := identity.ServiceAccount{Namespace: namespace, Name: serviceAccount}
	claims := identity.Claims{Claims: jwt.Claims{
		Issuer:    i.issuer,
		Subject:   sa.Username(),
		Audience:  jwt.Audience(audiences),
		IssuedAt:  jwt.NewNumericDate(now),
		NotBefore: jwt.NewNumericDate(now),
		Expiry:    jwt.NewNumericDate(now.Add(ttl)),
	}, Kubernetes: &identity.Kubernetes{
		Namespace:      namespace,
		ServiceAccount: &identity.Object{Name: serviceAccount, UID: uid("serviceaccount", namespace, serviceAccount)},
	}}
	tok, err := jwt.Signed(i.signer).Claims(claims).Serialize()
	if err != nil {
		return "", fmt.Errorf("devissuer: sign token: %w", err)
	}
	return tok, nil
}

// uid returns a UUID-shaped identifier derived from the parts.
func uid(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	b := h.Sum(nil)[:16]
	b[6] = b[6]&0x0f | 0x50 // version 5-style (name based)
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
