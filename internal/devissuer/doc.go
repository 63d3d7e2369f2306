// Package devissuer is the offline service-account token issuer of
// `meshid dev`: it keeps an ES256 signing key in a state directory,
// publishes the matching JWKS, and mints Kubernetes-shaped service-account
// JWTs that the CA's JWT authenticator accepts. It stands in for a
// cluster's API server so that meshid can be tried without one.
package devissuer
