// Package restartstorm measures and checks the meshid CA against a real
// kube-apiserver (with API Priority and Fairness on, as in a real cluster)
// the way a cluster restart looks to it: many pods, each presenting a fresh
// pod-bound token once, authenticated by TokenReview through the CA's own
// Kubernetes client (ca/kubeclient) as the meshid service account of
// deploy/, with deploy/'s FlowSchema applied.
package restartstorm
