package authn

import (
	"time"

	"github.com/meshid/meshid/identity"
)

// callerFromClaims returns the caller the kubernetes.io claims of a
// verified token name, or ok=false when they lack a namespace or service
// account.
func callerFromClaims(c *identity.Claims) (Caller, bool) {
	sa, ok := c.ServiceAccount()
	pod := c.Pod()
	caller := Caller{Namespace: sa.Namespace, ServiceAccount: sa.Name, PodName: pod.Name, PodUID: pod.UID}
	if c.Kubernetes != nil && c.Kubernetes.Node != nil {
		caller.NodeName = c.Kubernetes.Node.Name
	}
	return caller, ok
}

// unverifiedExpiry reads the exp claim of a JWT WITHOUT checking its
// signature. It is used only to bound how long a result that another party
// (the Kubernetes API server) vouched for may be cached; never to decide
// whether a token is valid.
func unverifiedExpiry(token string) (time.Time, bool) {
	c, err := identity.ParseUnverified(token)
	if err != nil || c.Expiry == nil {
		return time.Time{}, false
	}
	return c.Expiry.Time(), true
}

// unverifiedIssuer reads the iss claim of a JWT WITHOUT checking its
// signature, to choose which authenticator judges the token; never to
// decide whether it is valid.
func unverifiedIssuer(token string) (string, bool) {
	c, err := identity.ParseUnverified(token)
	if err != nil || c.Issuer == "" {
		return "", false
	}
	return c.Issuer, true
}
