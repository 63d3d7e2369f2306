// Package harness runs a real Kubernetes control plane for tests: an etcd and
// a kube-apiserver, both built from their upstream Go modules by
// hack/build-binaries.sh, listening on loopback ports with temporary
// directories.
//
// Every key and certificate (serving, client CA, admin client, service
// account signing key) is generated when the cluster is created, so
// TokenRequest and TokenReview work for real: audiences are enforced, tokens
// can be bound to pods, and a token bound to a deleted pod is rejected.
//
// The harness does not depend on the meshid module, so it builds even while
// the code under test does not.
package harness
