// Package leaderelection is client-go's Lease leader election
// (k8s.io/client-go/tools/leaderelection and its resourcelock.LeaseLock,
// v0.37.2), copied because importing either package links client-go's
// kubernetes.Clientset and informers, and with them every API group of
// k8s.io/api (about 12 MB of the CA binary; docs/benchmarks.md).
//
// Changes from upstream, and nothing else: the LeaseLock's client is
// kubeclient's Lease client; the alpha coordinated election (LeaseCandidate),
// the healthz adaptor, RunOrDie, the Prometheus adapter hooks, the
// ConfigMap/Endpoints/multi locks and resourcelock.New are left out; the
// resourcelock types live in this package. The election algorithm
// (acquire, renew, release, observed-time expiry) is upstream's, unchanged;
// ca/kube/election's tests and test/kube's leader tests run it against a
// real API server.
package leaderelection
