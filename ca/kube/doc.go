// Package kube wires the meshid CA's Kubernetes-native features into one
// Controller for `meshid server --kubeconfig`:
//
//   - secretstore: every replica loads and watches the CA Secret ("cacerts"
//     if present, else the self-signed "meshid-ca") and hot-swaps the
//     Authority's bundle;
//   - election: replicas elect a leader with a Lease; all of them sign;
//   - rootpublisher and secretstore.Bootstrap: the leader creates the
//     self-signed root Secret when none exists, and keeps the
//     "istio-ca-root-cert" ConfigMap in every namespace.
//
// The RBAC the Controller needs: in the CA's namespace, get/list/watch/
// create/update on secrets and on leases (coordination.k8s.io);
// cluster-wide, get/list/watch/create/update on configmaps and list/watch on
// namespaces. (TokenReview authentication, elsewhere, needs create on
// tokenreviews.)
package kube
