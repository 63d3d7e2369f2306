// Package kube wires the meshid CA's Kubernetes-native features into one
// Controller for `meshid server` with a Kubernetes client (in-cluster or
// --kubeconfig), whatever holds the CA key:
//
//   - election: replicas elect a leader with a Lease; all of them sign;
//   - rootpublisher: the leader keeps the "istio-ca-root-cert" ConfigMap in
//     every selected namespace (default: all but kube-system, kube-public
//     and kube-node-lease), repairs it and follows root changes; failures
//     show in Ready and in meshid_ca_root_configmap_failing_namespaces;
//   - with the key in a Secret (Config.Roots nil): secretstore, where every
//     replica loads and watches the CA Secret ("cacerts" if present, else
//     the self-signed "meshid-ca") and hot-swaps the Authority's bundle,
//     and secretstore.Bootstrap, where the leader creates the self-signed
//     root Secret when none exists;
//   - with the key elsewhere (Config.Roots, e.g. the Authority of a
//     --state-dir or --ca-dir CA): the leader publishes the Authority's
//     roots and follows its bundle.
//
// client builds the two clients the CA uses: one for TokenReview, one for
// these controllers, each with its own rate limits.
//
// The RBAC the Controller uses, and no more:
//
//   - Role in the CA's namespace: secrets get, list, watch, create (list and
//     watch are limited by a field selector to "cacerts" and "meshid-ca";
//     only with the key in a Secret); leases (coordination.k8s.io) get,
//     create, update.
//   - ClusterRole: configmaps list, watch, create, update (the informer is
//     limited to the name "istio-ca-root-cert"); namespaces list, watch.
//
// TokenReview authentication (ca/authn) adds create on tokenreviews.
package kube
