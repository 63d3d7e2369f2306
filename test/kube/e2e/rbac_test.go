package e2e_test

import (
	"context"
	"fmt"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCARBACIsMinimal asks the real RBAC authorizer what the meshid
// ServiceAccount of deploy/ may do. TestKubeCA shows the rules are enough
// (the CA runs as that ServiceAccount); this shows they are no wider: no
// other Secret, ConfigMap or Lease, no deletes, nothing outside the CA's
// namespace except the root ConfigMap and token reviews.
func TestCARBACIsMinimal(t *testing.T) {
	deployRBAC(t)
	type req struct {
		verb, group, resource, ns, name, sub string
	}
	cases := []struct {
		req   req
		allow bool
	}{
		// What the CA needs.
		{req{"create", "authentication.k8s.io", "tokenreviews", "", "", ""}, true},
		{req{"get", "", "configmaps", "default", rootConfigMap, ""}, true},
		{req{"list", "", "configmaps", "", rootConfigMap, ""}, true},
		{req{"watch", "", "configmaps", "", rootConfigMap, ""}, true},
		{req{"update", "", "configmaps", "kube-system", rootConfigMap, ""}, true},
		{req{"create", "", "configmaps", "default", "", ""}, true},
		{req{"list", "", "namespaces", "", "", ""}, true},
		{req{"watch", "", "namespaces", "", "", ""}, true},
		{req{"get", "", "secrets", caNamespace, caSecret, ""}, true},
		{req{"watch", "", "secrets", caNamespace, pluggedSecret, ""}, true},
		{req{"create", "", "secrets", caNamespace, "", ""}, true},
		{req{"get", "coordination.k8s.io", "leases", caNamespace, "meshid-ca", ""}, true},
		{req{"update", "coordination.k8s.io", "leases", caNamespace, "meshid-ca", ""}, true},
		{req{"create", "coordination.k8s.io", "leases", caNamespace, "", ""}, true},
		{req{"get", "", "secrets", caNamespace, "meshid-jwt-keys", ""}, true},
		{req{"watch", "", "secrets", caNamespace, "meshid-jwt-keys", ""}, true},
		{req{"update", "", "secrets", caNamespace, "meshid-jwt-keys", ""}, true},
		{req{"update", "coordination.k8s.io", "leases", caNamespace, "meshid-jwt-keys", ""}, true},
		// The upstream's intermediate (--upstream --kube-ca-secret): the
		// leader writes it, every replica watches it (test/kube/upstreamha).
		{req{"get", "", "secrets", caNamespace, "meshid-ca-upstream", ""}, true},
		{req{"watch", "", "secrets", caNamespace, "meshid-ca-upstream", ""}, true},
		{req{"update", "", "secrets", caNamespace, "meshid-ca-upstream", ""}, true},
		// What it must not be able to do.
		{req{"get", "", "configmaps", "default", "kube-root-ca.crt", ""}, false},
		{req{"list", "", "configmaps", "default", "", ""}, false},
		{req{"delete", "", "configmaps", "default", rootConfigMap, ""}, false},
		{req{"get", "", "secrets", "default", caSecret, ""}, false},
		{req{"get", "", "secrets", caNamespace, "istio-ca-secret", ""}, false},
		{req{"list", "", "secrets", caNamespace, "", ""}, false},
		{req{"update", "", "secrets", caNamespace, caSecret, ""}, false},
		{req{"update", "", "secrets", caNamespace, pluggedSecret, ""}, false},
		{req{"delete", "", "secrets", caNamespace, caSecret, ""}, false},
		{req{"delete", "", "secrets", caNamespace, "meshid-jwt-keys", ""}, false},
		{req{"delete", "", "secrets", caNamespace, "meshid-ca-upstream", ""}, false},
		{req{"update", "", "secrets", "default", "meshid-ca-upstream", ""}, false},
		{req{"update", "", "secrets", caNamespace, "meshid-jwt-keys-other", ""}, false},
		{req{"update", "", "secrets", "default", "meshid-jwt-keys", ""}, false},
		{req{"create", "", "secrets", "default", "", ""}, false},
		{req{"update", "coordination.k8s.io", "leases", caNamespace, "kube-scheduler", ""}, false},
		{req{"create", "coordination.k8s.io", "leases", "default", "", ""}, false},
		{req{"create", "", "serviceaccounts", "default", "default", "token"}, false},
		{req{"create", "", "pods", caNamespace, "", ""}, false},
		{req{"get", "", "nodes", "", "", ""}, false},
		// Pods only in node mode (deploy/ambient/, TestNodeModeRBAC).
		{req{"list", "", "pods", "", "", ""}, false},
		{req{"watch", "", "pods", "", "", ""}, false},
		{req{"get", "", "pods", "default", "web", ""}, false},
		{req{"impersonate", "", "serviceaccounts", "default", "default", ""}, false},
	}
	ctx := context.Background()
	for _, tc := range cases {
		r := tc.req
		name := fmt.Sprintf("%s %s/%s %s/%s", r.verb, r.resource, r.sub, r.ns, r.name)
		t.Run(name, func(t *testing.T) {
			sar, err := cluster.Client().AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{
					User:   "system:serviceaccount:" + caNamespace + ":meshid",
					Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + caNamespace, "system:authenticated"},
					ResourceAttributes: &authorizationv1.ResourceAttributes{
						Verb: r.verb, Group: r.group, Resource: r.resource, Subresource: r.sub, Namespace: r.ns, Name: r.name,
					},
				},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if sar.Status.Allowed != tc.allow {
				t.Fatalf("allowed = %v (%s), want %v", sar.Status.Allowed, sar.Status.Reason, tc.allow)
			}
		})
	}
}
