// Package kubeclient is the CA's Kubernetes client: typed clients for the
// few API groups meshid uses (core/v1, authentication/v1 TokenReview,
// coordination/v1 Lease, certificates/v1 PodCertificateRequest and
// ClusterTrustBundle) and shared informers over them, built on
// client-go's rest, gentype, tools/cache and listers packages.
//
// Why not client-go's kubernetes.Clientset: its typed clients all import
// k8s.io/client-go/kubernetes/scheme, which registers every one of the 56
// API groups of k8s.io/api, and kubernetes.Interface keeps every group's
// client (with client-go's apply configurations and discovery) reachable.
// Moving the CA off it roughly halved the meshid binary and its image
// (the measured sizes: docs/benchmarks.md, "Kubernetes client narrowed"),
// for six resources. Here the scheme holds
// only the groups above, and the typed clients are client-go's own
// generic ones (gentype), so the requests, protobuf negotiation, rate
// limiting and watch handling are client-go's.
//
// Interface has the method sets of kubernetes.Interface for the resources
// it has, less Apply and the resource-specific extras (pod logs, eviction,
// token requests): CoreV1().Secrets(ns).Get(...) reads the same, so code
// moves from one to the other by changing the type. Informers come from an
// InformerFactory shaped like client-go's SharedInformerFactory; its
// listers are client-go's listers/core/v1. The fake sub-package is the
// kubernetes/fake equivalent for unit tests (client-go's object tracker,
// reactors and recorded actions); test/kube/e2e's kubeclient_test.go runs
// the real one against a real API server.
//
// Keep k8s.io/client-go/kubernetes, .../informers, .../tools/leaderelection
// and .../metadata/metadatainformer out of production packages: any one of
// them brings every API group back (TestNarrowScheme in this package
// checks cmd/meshid's dependencies; test/image bounds the image).
//
// NewClients builds the CA's two clients from a kubeconfig file or the
// in-cluster config, with separate client-side rate limits:
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
package kubeclient
