// Package authn authenticates callers of the CA. An Authenticator turns the
// credentials presented on a request (a bearer token or a client
// certificate) into a Caller: the Kubernetes namespace and service account
// it proved. Chain tries several authenticators in order.
package authn
