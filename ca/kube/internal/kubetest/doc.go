// Package kubetest holds test helpers shared by the ca/kube packages: CA
// Secret contents created at run time and condition polling.
package kubetest
