// Package chart tests the Helm chart deploy/charts/meshid with the real
// Helm CLI (helm.sh/helm/v4, built once by hack/build-helm.sh): helm lint,
// helm template for several value sets (the rendered objects asserted), and
// helm install, upgrade and uninstall against the real kube-apiserver of
// the harness (a cluster of its own, so the releases never meet the objects
// the e2e suite applies from deploy/). The API server runs no controllers
// or kubelet: the tests assert objects, not pods.
package chart
