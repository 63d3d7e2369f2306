// Package e2e holds the end-to-end suite that runs meshid against a real
// etcd and kube-apiserver (see package harness). It has only tests.
package e2e
