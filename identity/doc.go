// Package identity is meshid's identity vocabulary, shared by the CA, the
// agent and the CLI: a Kubernetes ServiceAccount and its SPIFFE ID
// (spiffe://<trust-domain>/ns/<namespace>/sa/<name>), the claims of a
// Kubernetes service-account token read without verification, the JWS
// algorithms meshid accepts, and the TLS server name under which Istio's
// agent verifies the CA.
//
// It is a leaf package on go-spiffe's spiffeid and go-jose: the agent links
// it, so it must never import client-go or the CA side (ca/...).
package identity
