// Package multicluster tests one meshid CA serving the proxies of two
// clusters: two real etcd + kube-apiserver pairs from the harness, each
// with its own service-account issuer and key. The CA runs in cluster A;
// cluster B is a remote cluster, from --remote-kubeconfig or an Istio
// remote secret, and reviews its own tokens.
package multicluster
