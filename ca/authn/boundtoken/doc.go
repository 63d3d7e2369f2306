// Package boundtoken verifies the cluster's bound service-account tokens
// locally, with the guarantees of a TokenReview, so that a mass restart
// costs the Kubernetes API server almost nothing.
//
// The issuer and its public keys come from the API server itself
// (/.well-known/openid-configuration and the JWKS it names, read through
// the CA's authenticated client), refreshed periodically and, rate
// limited, when a token names an unknown key. A token of that issuer is
// verified here: signature (identity.SignatureAlgorithms only), iss, aud,
// exp, nbf and iat with the injected clock (the API server's own token
// shape parsed by hand, compact.go, anything else by go-jose; the verdict
// is the same either way). Then what a TokenReview adds
// (k8s.io/kubernetes pkg/serviceaccount, validator.Validate): the service
// account, and the pod or secret the token is bound to, exist with the
// UIDs the token names and were not deleted more than a minute ago. Those
// objects are read from metadata-only informers, never from the API
// server per request.
//
// What is not certain here is left to TokenReview (the Verifier answers
// authn.ErrNoCredentials and the next authenticator of the chain judges):
// a token of another issuer, one with no kubernetes.io claims, one bound
// to a node or a webhook configuration, one signed by a key the JWKS does
// not hold even after a refresh, and one whose bound object the informers
// do not hold or hold with another UID (informer lag on a new pod must not
// refuse it; a deleted or recreated pod is then refused by the live
// review). SECURITY.md gives the equivalence argument.
package boundtoken
