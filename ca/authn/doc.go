// Package authn authenticates callers of the CA. An Authenticator turns the
// credentials presented on a request (a bearer token or a client
// certificate) into a Caller: the Kubernetes namespace and service account
// it proved.
//
//   - TokenReview asks the Kubernetes API server (TokenReview API) and caches
//     the answer, keyed by the token's SHA-256, for at most a minute.
//   - JWT verifies service-account JWTs offline against a JSON Web Key Set
//     (a file, a URL, or the issuer's OIDC discovery document).
//   - ClientCert lets a workload renew its own identity with a still-valid
//     certificate this CA issued.
//
// NewChain tries several in order. TokenReview's answer on a token of an
// issuer it owns (TokenReviewConfig.Issuers, default all) is final: the
// offline JWT check never accepts a token the API server rejected or could
// not review. Errors are *ca.Error values whose
// messages never contain the token: Unauthenticated for a bad credential,
// Unavailable when a dependency could not decide.
package authn
