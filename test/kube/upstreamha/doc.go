// Package upstreamha proves the upstream CA in high availability (issue 32,
// `meshid server --upstream … --kube-ca-secret`, docs/upstream.md): two
// CA replicas, assembled by ca/caserver as the ServiceAccount of deploy/
// with its RBAC, against a real kube-apiserver and etcd and the real
// `cfssl serve` (testkit.StartCFSSL), on one fake clock. Only the
// elected replica mints; every replica signs with the intermediate it
// keeps in the Secret meshid-ca-upstream.
package upstreamha
