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
// The RBAC the Controller uses, and no more:
//
//   - Role in the CA's namespace: secrets get, list, watch, create (list and
//     watch are limited by a field selector to "cacerts" and "meshid-ca");
//     leases (coordination.k8s.io) get, create, update.
//   - ClusterRole: configmaps list, watch, create, update (the informer is
//     limited to the name "istio-ca-root-cert"); namespaces list, watch.
//
// TokenReview authentication (ca/authn) adds create on tokenreviews.
package kube
