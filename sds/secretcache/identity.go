package secretcache

import (
	"errors"
	"fmt"
	"strings"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// tokenAlgorithms are the signature algorithms a Kubernetes service-account
// token may use. The signature is not checked here (the CA checks it); the
// list only lets go-jose parse the token.
var tokenAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA,
}

// IdentityFromToken returns spiffe://<td>/ns/<namespace>/sa/<service-account>
// from a Kubernetes service-account token's kubernetes.io claims (namespace,
// serviceaccount.name), falling back to the subject
// system:serviceaccount:<ns>:<sa>. The token is NOT verified: it only tells
// the agent which identity to ask for, and the CA verifies it. Errors never
// contain the token.
func IdentityFromToken(token string, td spiffeid.TrustDomain) (spiffeid.ID, error) {
	if td.IsZero() {
		return spiffeid.ID{}, errors.New("secretcache: token identity: trust domain is required")
	}
	tok, err := jwt.ParseSigned(strings.TrimSpace(token), tokenAlgorithms)
	if err != nil {
		return spiffeid.ID{}, errors.New("secretcache: token identity: not a signed JWT")
	}
	var claims struct {
		Subject    string `json:"sub"`
		Kubernetes *struct {
			Namespace      string `json:"namespace"`
			ServiceAccount *struct {
				Name string `json:"name"`
			} `json:"serviceaccount"`
		} `json:"kubernetes.io"`
	}
	if err := tok.UnsafeClaimsWithoutVerification(&claims); err != nil {
		return spiffeid.ID{}, errors.New("secretcache: token identity: malformed claims")
	}
	var ns, sa string
	if k := claims.Kubernetes; k != nil {
		ns = k.Namespace
		if k.ServiceAccount != nil {
			sa = k.ServiceAccount.Name
		}
	}
	if ns == "" || sa == "" {
		if rest, ok := strings.CutPrefix(claims.Subject, "system:serviceaccount:"); ok {
			ns, sa, _ = strings.Cut(rest, ":")
		}
	}
	if ns == "" || sa == "" || strings.Contains(sa, ":") {
		return spiffeid.ID{}, errors.New("secretcache: token identity: no kubernetes.io namespace and service account claims")
	}
	id, err := spiffeid.FromSegments(td, "ns", ns, "sa", sa)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("secretcache: token identity: %w", err)
	}
	return id, nil
}
