package authn

import (
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// signatureAlgorithms are the JWS algorithms meshid accepts: every
// asymmetric algorithm Kubernetes and common OIDC issuers use. HMAC and
// "none" are never accepted.
var signatureAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512,
	jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512,
	jose.EdDSA,
}

// k8sClaims are the claims Kubernetes puts in service-account tokens, both
// the bound-token form ("kubernetes.io": {...}) and the legacy flat form.
type k8sClaims struct {
	Kubernetes *struct {
		Namespace      string `json:"namespace"`
		ServiceAccount *struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"serviceaccount"`
		Pod *struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"pod"`
	} `json:"kubernetes.io"`
	LegacyNamespace      string `json:"kubernetes.io/serviceaccount/namespace"`
	LegacyServiceAccount string `json:"kubernetes.io/serviceaccount/service-account.name"`
}

// caller returns the identity the claims name, or ok=false when they lack
// a namespace or service account.
func (k *k8sClaims) caller() (c Caller, ok bool) {
	if k.Kubernetes != nil {
		c.Namespace = k.Kubernetes.Namespace
		if k.Kubernetes.ServiceAccount != nil {
			c.ServiceAccount = k.Kubernetes.ServiceAccount.Name
		}
		if k.Kubernetes.Pod != nil {
			c.PodName, c.PodUID = k.Kubernetes.Pod.Name, k.Kubernetes.Pod.UID
		}
	}
	if c.Namespace == "" && c.ServiceAccount == "" {
		c.Namespace, c.ServiceAccount = k.LegacyNamespace, k.LegacyServiceAccount
	}
	return c, c.Namespace != "" && c.ServiceAccount != ""
}

// serviceAccountUserPrefix starts the Kubernetes user name of a service
// account: system:serviceaccount:<namespace>:<name>.
const serviceAccountUserPrefix = "system:serviceaccount:"

// parseServiceAccountUser splits "system:serviceaccount:<ns>:<sa>".
func parseServiceAccountUser(user string) (ns, sa string, ok bool) {
	rest, found := strings.CutPrefix(user, serviceAccountUserPrefix)
	if !found {
		return "", "", false
	}
	ns, sa, found = strings.Cut(rest, ":")
	if !found || ns == "" || sa == "" || strings.Contains(sa, ":") {
		return "", "", false
	}
	return ns, sa, true
}

// unverifiedExpiry reads the exp claim of a JWT WITHOUT checking its
// signature. It is used only to bound how long a result that another party
// (the Kubernetes API server) vouched for may be cached; never to decide
// whether a token is valid.
func unverifiedExpiry(token string) (time.Time, bool) {
	tok, err := jwt.ParseSigned(token, signatureAlgorithms)
	if err != nil {
		return time.Time{}, false
	}
	var c jwt.Claims
	if err := tok.UnsafeClaimsWithoutVerification(&c); err != nil || c.Expiry == nil {
		return time.Time{}, false
	}
	return c.Expiry.Time(), true
}

// unverifiedIssuer reads the iss claim of a JWT WITHOUT checking its
// signature, to choose which authenticator judges the token; never to
// decide whether it is valid.
func unverifiedIssuer(token string) (string, bool) {
	tok, err := jwt.ParseSigned(token, signatureAlgorithms)
	if err != nil {
		return "", false
	}
	var c jwt.Claims
	if err := tok.UnsafeClaimsWithoutVerification(&c); err != nil || c.Issuer == "" {
		return "", false
	}
	return c.Issuer, true
}
