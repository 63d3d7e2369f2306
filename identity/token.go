package identity

import (
	"errors"
	"fmt"
	"strings"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// MaxTokenSize bounds a bearer token meshid reads or parses (64 KiB;
// Kubernetes service-account tokens are about 1 KiB).
const MaxTokenSize = 64 << 10

// SignatureAlgorithms are the JWS algorithms meshid accepts: every
// asymmetric algorithm Kubernetes and common OIDC issuers use. HMAC and
// "none" are never accepted.
var SignatureAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512,
	jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512,
	jose.EdDSA,
}

// Claims are the claims of a Kubernetes service-account token: the
// registered ones (iss, sub, aud, exp, nbf, iat, jti) and the kubernetes.io
// ones, in both the bound-token form ("kubernetes.io": {...}) and the legacy
// flat form. It decodes from the token's JSON payload, verified or not.
type Claims struct {
	jwt.Claims
	Kubernetes *Kubernetes `json:"kubernetes.io,omitempty"`

	LegacyNamespace      string `json:"kubernetes.io/serviceaccount/namespace,omitempty"`
	LegacyServiceAccount string `json:"kubernetes.io/serviceaccount/service-account.name,omitempty"`
	LegacyUID            string `json:"kubernetes.io/serviceaccount/service-account.uid,omitempty"`
}

// Kubernetes is the "kubernetes.io" claim of a bound service-account token.
type Kubernetes struct {
	Namespace      string  `json:"namespace"`
	ServiceAccount *Object `json:"serviceaccount,omitempty"`
	Pod            *Object `json:"pod,omitempty"` // nil unless the token is bound to a pod
	Node           *Object `json:"node,omitempty"`
}

// Object names a Kubernetes object a token is bound to.
type Object struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// ServiceAccount returns the service account the kubernetes.io claims name
// (the bound form, else the legacy flat form); ok is false when the
// namespace or the name is missing. The subject is not consulted: see
// SubjectServiceAccount.
func (c *Claims) ServiceAccount() (sa ServiceAccount, ok bool) {
	if k := c.Kubernetes; k != nil {
		sa.Namespace = k.Namespace
		if k.ServiceAccount != nil {
			sa.Name = k.ServiceAccount.Name
		}
	}
	if sa.Namespace == "" && sa.Name == "" {
		sa = ServiceAccount{Namespace: c.LegacyNamespace, Name: c.LegacyServiceAccount}
	}
	return sa, sa.Namespace != "" && sa.Name != ""
}

// SubjectServiceAccount returns the service account of a subject of the
// form system:serviceaccount:<namespace>:<name>.
func (c *Claims) SubjectServiceAccount() (ServiceAccount, bool) { return FromUsername(c.Subject) }

// Pod returns the pod the token is bound to, or a zero Object.
func (c *Claims) Pod() Object {
	if c.Kubernetes == nil || c.Kubernetes.Pod == nil {
		return Object{}
	}
	return *c.Kubernetes.Pod
}

// ParseUnverified decodes the claims of a compact JWS token WITHOUT checking
// its signature. Use it only where the token's holder, not the token, is
// trusted (the agent choosing which identity to ask for) or where another
// party already verified it (bounding a TokenReview cache by exp); never to
// decide whether a token is valid. Surrounding white space is ignored.
// Tokens over MaxTokenSize, other algorithms than SignatureAlgorithms and
// malformed input are errors, which never contain the token.
func ParseUnverified(token string) (*Claims, error) {
	token = strings.TrimSpace(token)
	if len(token) > MaxTokenSize {
		return nil, fmt.Errorf("identity: token is larger than %d bytes", MaxTokenSize)
	}
	tok, err := jwt.ParseSigned(token, SignatureAlgorithms)
	if err != nil {
		return nil, errors.New("identity: not a JWT signed with a supported algorithm")
	}
	var c Claims
	if err := tok.UnsafeClaimsWithoutVerification(&c); err != nil {
		return nil, errors.New("identity: malformed token claims")
	}
	return &c, nil
}

// ServiceAccountFromToken returns the service account an unverified token
// names: its kubernetes.io claims, else its subject
// system:serviceaccount:<namespace>:<name>. It tells an agent which identity
// to ask for; the CA verifies the token. Errors never contain the token.
func ServiceAccountFromToken(token string) (ServiceAccount, error) {
	c, err := ParseUnverified(token)
	if err != nil {
		return ServiceAccount{}, err
	}
	if sa, ok := c.ServiceAccount(); ok {
		return sa, nil
	}
	if sa, ok := c.SubjectServiceAccount(); ok {
		return sa, nil
	}
	return ServiceAccount{}, errors.New("identity: the token has no kubernetes.io namespace and service account claims")
}

// IDFromToken is ServiceAccountFromToken followed by ServiceAccount.ID: the
// SPIFFE ID in td that an unverified token names.
func IDFromToken(token string, td spiffeid.TrustDomain) (spiffeid.ID, error) {
	sa, err := ServiceAccountFromToken(token)
	if err != nil {
		return spiffeid.ID{}, err
	}
	return sa.ID(td)
}
