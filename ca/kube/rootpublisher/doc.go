// Package rootpublisher distributes the CA's root bundle to workloads: it
// keeps the ConfigMap "istio-ca-root-cert" (key "root-cert.pem") in every
// namespace, as Istio's namespace controller does, so that pods can mount
// the roots that their proxies trust.
//
// A Publisher is the leader's task. Namespace and ConfigMap informers feed a
// rate-limited workqueue keyed by namespace; each item is reconciled by
// creating the ConfigMap when it is missing and updating it when its root
// PEM or its managed-by label differ. Namespaces created later, ConfigMaps
// edited or deleted by someone else, and a new root (SetRoots) all lead to
// a reconcile. It writes only when the content differs, so it does not
// fight itself or other writers that agree with it, and it leaves other
// keys of the ConfigMap alone.
package rootpublisher
