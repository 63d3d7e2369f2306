package step

// The one-time token is written here with go-jose (already meshid's JOSE
// library) rather than with smallstep's client packages: their ca and
// token packages import step-ca's authority and its KMS and cloud
// clients (about 490 non-standard packages by `go list -deps`), which
// would more than double what the meshid binary links, for one signed
// JSON object and two HTTP calls.

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/meshid/meshid/ca/upstream"
)

// provisionerKey is the JWK provisioner's private key and what signs with
// it.
type provisionerKey struct {
	id     string // kid: step-ca finds the provisioner by name and kid
	signer jose.Signer
}

// readProvisionerKey reads a private JSON Web Key (RFC 7517) from path. An
// encrypted key (step's default JWE) is refused with what to do: the
// password would have to sit beside it, which protects nothing. Errors
// never quote the file.
func readProvisionerKey(path string) (*provisionerKey, error) {
	data, err := upstream.ReadSecretFile(path)
	if err != nil {
		return nil, err
	}
	data = bytes.TrimSpace(data)
	var probe map[string]json.RawMessage
	if json.Unmarshal(data, &probe) != nil {
		if bytes.Count(data, []byte(".")) == 4 {
			return nil, fmt.Errorf("step-ca: %s: an encrypted key (JWE): decrypt it (`step crypto jwe decrypt`) into a file of mode 0600", path)
		}
		return nil, fmt.Errorf("step-ca: %s: not a JSON Web Key", path)
	}
	if _, ok := probe["ciphertext"]; ok {
		return nil, fmt.Errorf("step-ca: %s: an encrypted key (JWE): decrypt it (`step crypto jwe decrypt`) into a file of mode 0600", path)
	}
	var jwk jose.JSONWebKey
	if err := json.Unmarshal(data, &jwk); err != nil {
		return nil, fmt.Errorf("step-ca: %s: not a JSON Web Key", path) // the decoder's error could quote the key
	}
	if jwk.IsPublic() || !jwk.Valid() {
		return nil, fmt.Errorf("step-ca: %s: not a private JSON Web Key (the provisioner's public key is in ca.json; meshid needs its private half)", path)
	}
	alg, err := algorithm(jwk.Key)
	if err != nil {
		return nil, fmt.Errorf("step-ca: %s: %w", path, err)
	}
	if jwk.Algorithm != "" && jwk.Algorithm != string(alg) {
		return nil, fmt.Errorf("step-ca: %s: alg %q does not fit the key (want %s)", path, jwk.Algorithm, alg)
	}
	if jwk.KeyID == "" {
		// step's own kid: the key's SHA-256 thumbprint.
		tp, err := jwk.Thumbprint(crypto.SHA256)
		if err != nil {
			return nil, fmt.Errorf("step-ca: %s: %w", path, err)
		}
		jwk.KeyID = base64.RawURLEncoding.EncodeToString(tp)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: jwk.Key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), jwk.KeyID))
	if err != nil {
		return nil, fmt.Errorf("step-ca: %s: %w", path, err)
	}
	return &provisionerKey{id: jwk.KeyID, signer: s}, nil
}

// algorithm is the JWS algorithm step uses for a key.
func algorithm(k any) (jose.SignatureAlgorithm, error) {
	switch k := k.(type) {
	case *ecdsa.PrivateKey:
		switch k.Curve {
		case elliptic.P256():
			return jose.ES256, nil
		case elliptic.P384():
			return jose.ES384, nil
		case elliptic.P521():
			return jose.ES512, nil
		}
	case ed25519.PrivateKey:
		return jose.EdDSA, nil
	case *rsa.PrivateKey:
		if k.N.BitLen() >= 2048 {
			return jose.RS256, nil
		}
		return "", fmt.Errorf("an RSA key of %d bits, want at least 2048", k.N.BitLen())
	}
	return "", fmt.Errorf("a %T key: want EC, OKP (Ed25519) or RSA", k)
}

// tokenClaims are the claims step's JWK provisioner reads beside the
// registered ones: the names the CSR may hold, and the root's fingerprint
// (as step's CLI sends).
type tokenClaims struct {
	SANs []string `json:"sans"`
	SHA  string   `json:"sha"`
}

// token is a one-time token for req: issuer the provisioner, audience
// step-ca's sign endpoint, subject the CSR's common name (step-ca wants it
// to be the subject or a SAN), sans exactly the CSR's SANs (step-ca wants
// the same set), a random jti (step-ca refuses a token used twice).
func (k *provisionerKey) token(provisioner, audience, rootSHA string, req *x509.CertificateRequest, now time.Time) (string, error) {
	sans := make([]string, 0, len(req.DNSNames)+len(req.IPAddresses)+len(req.EmailAddresses)+len(req.URIs))
	sans = append(sans, req.DNSNames...)
	for _, ip := range req.IPAddresses {
		sans = append(sans, ip.String())
	}
	sans = append(sans, req.EmailAddresses...)
	for _, u := range req.URIs {
		sans = append(sans, u.String())
	}
	sub := req.Subject.CommonName
	if sub == "" && len(sans) > 0 {
		sub = sans[0]
	}
	if sub == "" {
		return "", errors.New("step-ca: the CSR has neither a common name nor a SAN for the token's subject")
	}
	jti := make([]byte, 16)
	if _, err := rand.Read(jti); err != nil {
		return "", err
	}
	tok, err := jwt.Signed(k.signer).Claims(jwt.Claims{
		Issuer:    provisioner,
		Subject:   sub,
		Audience:  jwt.Audience{audience},
		NotBefore: jwt.NewNumericDate(now),
		IssuedAt:  jwt.NewNumericDate(now),
		Expiry:    jwt.NewNumericDate(now.Add(TokenLifetime)),
		ID:        hex.EncodeToString(jti),
	}).Claims(tokenClaims{SANs: sans, SHA: rootSHA}).Serialize()
	if err != nil {
		return "", fmt.Errorf("step-ca: token: %w", err)
	}
	return tok, nil
}
