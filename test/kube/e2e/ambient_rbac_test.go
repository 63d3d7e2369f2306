package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/ca/nodeauth"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/testkit"
)

// nodeModeDir holds the RBAC that only node mode needs (opt-in).
const nodeModeDir = "ambient/"

// caMay asks the real RBAC authorizer whether the CA's service account may
// do verb on resource.
func caMay(ctx context.Context, t *testing.T, verb, group, resource, sub, ns, name string) bool {
	t.Helper()
	sar, err := cluster.Client().AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:" + caNamespace + ":meshid",
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + caNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: verb, Group: group, Resource: resource, Subresource: sub, Namespace: ns, Name: name,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return sar.Status.Allowed
}

// TestNodeModeRBAC: with deploy/'s RBAC alone the CA cannot see pods, so
// node authorization, running as the CA's service account, never syncs
// and answers Unavailable; with deploy/ambient/ added it syncs and
// authorizes; and those rules grant reading pods and nothing else.
func TestNodeModeRBAC(t *testing.T) {
	ctx := context.Background()
	kubeconfig := deployRBAC(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	asCA, err := kubeclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	zt := scheduledPod(t, "istio-system", "ztunnel-rbac", "ztunnel", "node-r")
	scheduledPod(t, ambientNS, "web-r", "web", "node-r")
	caller := &authn.Caller{Namespace: "istio-system", ServiceAccount: "ztunnel", PodName: zt.Name, PodUID: string(zt.UID), NodeName: "node-r", Method: authn.MethodTokenReview}
	web := workloadID(ambientNS, "web")
	newAuthorizer := func() *nodeauth.Authorizer {
		na, err := nodeauth.New(nodeauth.Config{TrustedAccounts: []identity.ServiceAccount{ztunnelAccount}, Client: asCA, TrustDomain: trustDomain, LookupTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return na
	}

	t.Run("without node-mode RBAC: Unavailable", func(t *testing.T) {
		na := newAuthorizer()
		stop := testkit.Start(t, "node authorizer", na.Run)
		defer stop()
		if err := na.Authorize(ctx, caller, web); ca.KindOf(err) != ca.KindUnavailable {
			t.Fatalf("Authorize = %v, want Unavailable", err)
		}
	})

	var applied []string
	a := newApplier(t, cluster.AdminConfig())
	for _, m := range loadManifests(t) {
		if !strings.HasPrefix(m.file, nodeModeDir) {
			continue
		}
		if err := a.apply(ctx, m.obj, false); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		applied = append(applied, m.obj.GetKind()+"/"+m.obj.GetName())
	}
	if len(applied) != 2 {
		t.Fatalf("deploy/%s holds %v, want a ClusterRole and its binding", nodeModeDir, applied)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		c := cluster.Client().RbacV1()
		if err := c.ClusterRoleBindings().Delete(ctx, "meshid-node-mode", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
		if err := c.ClusterRoles().Delete(ctx, "meshid-node-mode", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
		// The tests after this one see the default RBAC again.
		eventually(t, 30*time.Second, "the node-mode RBAC to be gone", func(ctx context.Context) error {
			if caMay(ctx, t, "list", "", "pods", "", "", "") {
				return fmt.Errorf("the CA may still list pods")
			}
			return nil
		})
	})

	t.Run("with node-mode RBAC: synced and authorized", func(t *testing.T) {
		na := newAuthorizer()
		stop := testkit.Start(t, "node authorizer", na.Run)
		defer stop()
		eventually(t, time.Minute, "the CA's pod informer to sync", func(ctx context.Context) error {
			if !na.HasSynced() {
				return fmt.Errorf("not synced")
			}
			return nil
		})
		if err := na.Authorize(ctx, caller, web); err != nil {
			t.Fatalf("node authorization as the CA: %v", err)
		}
	})

	t.Run("no wider than reading pods", func(t *testing.T) {
		cases := []struct {
			verb, resource, sub string
			allow               bool
		}{
			{"get", "pods", "", true},
			{"list", "pods", "", true},
			{"watch", "pods", "", true},
			{"create", "pods", "", false},
			{"update", "pods", "", false},
			{"patch", "pods", "", false},
			{"delete", "pods", "", false},
			{"deletecollection", "pods", "", false},
			{"update", "pods", "status", false},
			{"get", "pods", "log", false},
			{"create", "pods", "exec", false},
			{"create", "pods", "eviction", false},
			{"get", "nodes", "", false},
			{"list", "secrets", "", false},
			{"list", "serviceaccounts", "", false},
		}
		for _, tc := range cases {
			if got := caMay(ctx, t, tc.verb, "", tc.resource, tc.sub, "default", ""); got != tc.allow {
				t.Errorf("%s %s/%s: allowed = %v, want %v", tc.verb, tc.resource, tc.sub, got, tc.allow)
			}
		}
	})
}
