// Package nodeauth authorizes node agents (Istio's ztunnel in ambient mode)
// to ask the CA for the certificates of the pods on their node: a request
// that names another workload in its ImpersonatedIdentity metadata.
//
// Authorize allows an impersonation only when all of these hold, each
// refusal naming the condition that failed (PermissionDenied):
//
//  1. the caller authenticated with a Kubernetes service-account token
//     (TokenReview or offline JWT; never a client certificate) of one of
//     Config.TrustedAccounts;
//  2. the token is bound to a pod, that pod exists with the token's UID, is
//     not terminated, and its node is known (the pod's spec.nodeName, which
//     must agree with the token's node claim when it has one);
//  3. a pod of the impersonated namespace and service account is scheduled
//     on that same node and not terminated;
//  4. the impersonated identity is spiffe://<Config.TrustDomain>/ns/<ns>/sa/<sa>.
//
// (The CA handler checks the rest of condition 4: the CSR's URI SAN is the
// impersonated identity.)
//
// Pods are seen through a client-go shared informer indexed by node,
// namespace and service account, whose transform keeps only a pod's name,
// namespace, UID, service account, node and phase (about 460 heap bytes
// per pod against 7.4 KB for whole pods; docs/benchmarks.md). Until it has synced,
// Authorize asks the API server directly, and answers Unavailable when the
// API server cannot answer either. It is as strict as Istio's
// NodeAuthorizer, and stricter: the caller's pod is checked even when the
// token names its node, a terminated pod proves nothing, and the trust
// domain is checked here.
package nodeauth
