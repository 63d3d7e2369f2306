// Package podcert proves meshid's pod certificate signer
// (ca/kube/podcert, `meshid server --pod-certificate-signer`) against a
// real kube-apiserver v1.37.2 running the Node authorizer and
// NodeRestriction: the test plays a node's kubelet (its client
// certificate) to create PodCertificateRequests, and an admin to create
// the ones NodeRestriction would refuse. The CA runs through its assembly
// (ca/caserver, testkit.CA) as the ServiceAccount of deploy/, with exactly
// the RBAC of deploy/pod-certificates/.
package podcert
