// Package podcert makes the CA a Kubernetes pod certificate signer
// (certificates.k8s.io/v1, KEP-4317): it signs the PodCertificateRequests
// the kubelet creates for a pod's podCertificate projected volume, and
// publishes the CA's roots as the ClusterTrustBundle a clusterTrustBundle
// projected volume mounts.
//
// A Controller campaigns for its own Lease (DefaultLeaseName); only the
// leader signs and publishes, so that each request is signed once and the
// bundle has one writer. While leading it runs:
//
//   - the signer: an informer of the PodCertificateRequests whose
//     spec.signerName is Config.SignerName (a field selector: requests of
//     other signers are never listed) feeds a rate-limited workqueue of
//     Config.Workers workers. A request is judged against the live cluster,
//     never its own spec alone (verdict.go): no unverifiedUserAnnotations
//     (meshid documents none), a key type the CA signs, and a pod with
//     spec.podUID, on node spec.nodeName with spec.nodeUID, running as
//     spec.serviceAccountName with spec.serviceAccountUID and mounting a
//     podCertificate volume of this signer. Those objects come from
//     slimmed informers (objects.go), read from the API server only on a
//     cache miss. An accepted request is signed through the one signing
//     path of the CA (ca.Authority.Sign: the leaf template, policy, metrics
//     and audit line of every certificate) for
//     spiffe://<trust domain>/ns/<namespace>/sa/<service account>, and its
//     status is written once, with the times the API server demands
//     (status.go). A failure that may pass (the CA not ready, a conflict,
//     the API server unreachable) is retried with backoff; only a
//     permanent one is written as Failed.
//   - the trust bundle (trustbundle.go): the ClusterTrustBundle
//     "<signer name with / as :>:<BundleSuffix>" with spec.signerName set,
//     holding exactly the roots the CA hands out with every certificate
//     (the union during a rotation), followed by polling the root source
//     and repaired when someone deletes or edits it.
package podcert
