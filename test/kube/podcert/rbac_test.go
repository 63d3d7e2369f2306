package podcert_test

import (
	"context"
	"fmt"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSignerRBACIsMinimal asks the real authorizer what the CA's
// ServiceAccount may do with deploy/pod-certificates/ applied (the other
// tests show it is enough: the CA runs as that account): its signer's
// requests and bundle, no other signer's, no request of its own making,
// no writes to pods, nodes or service accounts.
func TestSignerRBACIsMinimal(t *testing.T) {
	const certs = "certificates.k8s.io"
	for _, tc := range []struct {
		verb, group, resource, sub, ns, name string
		allow                                bool
	}{
		{"list", certs, "podcertificaterequests", "", "", "", true},
		{"watch", certs, "podcertificaterequests", "", "", "", true},
		{"update", certs, "podcertificaterequests", "status", "default", "x", true},
		{"sign", certs, "signers", "", "", signerName, true},
		{"attest", certs, "signers", "", "", signerName, true},
		{"update", certs, "clustertrustbundles", "", "", bundleName, true},
		{"create", certs, "clustertrustbundles", "", "", "", true},
		{"list", "", "pods", "", "", "", true},
		{"get", "", "nodes", "", "", "node-a", true},
		{"get", "", "serviceaccounts", "", "default", "default", true},
		{"update", "coordination.k8s.io", "leases", "", caNamespace, "meshid-pod-certificates", true},

		{"create", certs, "podcertificaterequests", "", "default", "", false},
		{"delete", certs, "podcertificaterequests", "", "default", "x", false},
		{"update", certs, "podcertificaterequests", "", "default", "x", false},
		{"sign", certs, "signers", "", "", "example.com/other", false},
		{"sign", certs, "signers", "", "", "kubernetes.io/kube-apiserver-client-pod", false},
		{"attest", certs, "signers", "", "", "example.com/other", false},
		{"update", certs, "clustertrustbundles", "", "", "example.com:other:roots", false},
		{"delete", certs, "clustertrustbundles", "", "", "example.com:other:roots", false},
		{"update", certs, "certificatesigningrequests", "approval", "", "x", false},
		{"update", "", "pods", "", "default", "x", false},
		{"update", "", "nodes", "", "", "node-a", false},
		{"create", "", "serviceaccounts", "token", "default", "default", false},
		{"update", "coordination.k8s.io", "leases", "", caNamespace, "kube-scheduler", false},
	} {
		name := fmt.Sprintf("%s %s/%s %s/%s", tc.verb, tc.resource, tc.sub, tc.ns, tc.name)
		t.Run(name, func(t *testing.T) {
			sar, err := cluster.Client().AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User:   "system:serviceaccount:" + caNamespace + ":" + caAccount,
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + caNamespace, "system:authenticated"},
					ResourceAttributes: &authorizationv1.ResourceAttributes{
						Verb: tc.verb, Group: tc.group, Resource: tc.resource, Subresource: tc.sub, Namespace: tc.ns, Name: tc.name,
					},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if sar.Status.Allowed != tc.allow {
				t.Fatalf("allowed %v, want %v (%s)", sar.Status.Allowed, tc.allow, sar.Status.Reason)
			}
		})
	}
}
