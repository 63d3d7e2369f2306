// Package secretstore keeps the meshid CA's signing bundle in Kubernetes
// Secrets of the CA's own namespace, and hot-swaps it when they change.
//
// Two Secrets are read, both in Istio's plugged-in layout (ca-cert.pem,
// ca-key.pem, cert-chain.pem, root-cert.pem):
//
//   - "cacerts", an operator-provided CA, which takes precedence whenever it
//     exists;
//   - "meshid-ca" (type istio.io/ca-root, like Istio's istio-ca-secret), a
//     self-signed root that the leader replica creates when neither Secret
//     exists.
//
// Every replica runs a Store: it watches both Secrets with informers limited
// to the namespace and to each Secret's name, loads the preferred one with
// keystore.LoadFiles, and tells its subscribers (for example
// ca.Authority.SetBundle) about every new bundle, without a restart. Content
// that does not load or validate is logged and ignored: the last good bundle
// stays in use. Only the leader calls Bootstrap, which creates the
// self-signed Secret.
package secretstore
