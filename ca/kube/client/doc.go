// Package client builds the meshid CA's Kubernetes clients from a kubeconfig
// file or the in-cluster config.
//
// It returns two clients with separate client-side rate limits:
//
//   - Auth, for TokenReview (and SubjectAccessReview): the CA's request
//     path, one call per fresh token. After a mass restart every pod
//     presents a fresh token at once, so this client's limits are sized for
//     the CA to absorb that burst (see DefaultQPS and DefaultBurst).
//   - Controllers, for leader election, the root ConfigMap publisher and
//     informers. A namespace re-list or a root rotation writing a ConfigMap
//     per namespace spends this client's budget, never the one that
//     authenticates workloads.
//
// client-go's own default (QPS 5, burst 10, used when a rest.Config leaves
// them zero) capped the CA at 5 fresh-token certificates per second; the
// API server itself, with API Priority and Fairness (deploy/), is what
// protects the cluster from the CA, not a client-side bucket.
//
// When that flow control rejects a review (HTTP 429 with a Retry-After),
// client-go waits and retries it within the review's context, and reports
// nothing of it: a review that runs out of time fails with "context
// deadline exceeded" alone. The Auth client's transport therefore reports
// every 429 to the function the request's context carries (OnThrottled);
// ca/authn's TokenReview counts them (meshid_ca_tokenreview_throttled_total)
// and names them in a failed review's message.
package client
