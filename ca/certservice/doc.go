// Package certservice serves the CA's certificate signing API,
// istio.v1.auth.IstioCertificateService/CreateCertificate from
// istio.io/api/security/v1alpha1, over gRPC and TLS, so that unmodified
// Istio agents can use it.
//
// Before any request, a connection is admitted under a global and a
// per-peer-IP limit and must begin a request within a short timeout; its
// headers are bounded (64 KiB). A request is then handled in this order:
// the TTL is checked, a token over 16 KiB is refused, the caller is
// authenticated (bearer token or client certificate, see ca/authn), its
// per-identity rate limit is applied, the CSR is parsed and its key and
// signature checked, and the Authority signs a leaf for the proven
// identity, never outliving the client certificate of a renewal. Every
// error becomes a gRPC status in one place, Code.
//
// A node agent (Istio's ztunnel in ambient mode) names the workload it asks
// for in the request metadata ImpersonatedIdentity. The CSR's one URI SAN
// must then be that identity, and Config.NodeAuthorizer (ca/nodeauth) must
// allow the caller to impersonate it; without a NodeAuthorizer every
// impersonation is refused. The audit line names both.
//
// The serving certificate is signed by the CA itself, kept in memory only,
// and reissued before it expires or when the CA changes.
package certservice
