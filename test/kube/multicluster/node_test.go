package multicluster_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/test/kube/harness"
)

// podOn creates a pod of sa in ns of cluster c, "scheduled" on node.
func podOn(t *testing.T, c *harness.Cluster, ns, name, sa, node string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	if err := c.CreateServiceAccount(ctx, ns, sa); err != nil {
		t.Fatal(err)
	}
	pod, err := c.CreatePodOnNode(ctx, ns, name, sa, node)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// TestRemoteNodeAuthorization: B's node agent (ztunnel) impersonates the
// pods on its node, judged against B's pods, never A's, even when A has a
// pod of the same name on a node of the same name.
func TestRemoteNodeAuthorization(t *testing.T) {
	ctx := context.Background()
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	}
	path := filepath.Join(t.TempDir(), "b.kubeconfig")
	if err := os.WriteFile(path, kubeconfigFor(t, clusterB, "meshid-reader-pods", rules...), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCA(t, func(cfg *caserver.Config) {
		cfg.Clusters.RemoteKubeconfigs = map[string]string{idB: path}
		cfg.Authn.TrustedNodeAccounts = []identity.ServiceAccount{{Namespace: caNamespace, Name: "ztunnel"}}
	})
	const node = "node-1"
	ztunnel := podOn(t, clusterB, caNamespace, "ztunnel-b", "ztunnel", node)
	podOn(t, clusterB, "nodeauth", "app-0", "app", node)
	podOn(t, clusterA, "nodeauth", "far-0", "far", node) // in A only
	tok, err := clusterB.Token(ctx, harness.TokenSpec{Namespace: caNamespace, ServiceAccount: "ztunnel", Audiences: []string{"istio-ca"}, Pod: ztunnel})
	if err != nil {
		t.Fatal(err)
	}
	app := workload{ns: "nodeauth", sa: "app"}.id()
	far := workload{ns: "nodeauth", sa: "far"}.id()

	if err := c.request(ctx, tok, map[string]any{"ClusterID": idB, "ImpersonatedIdentity": app.String()}, app); err != nil {
		t.Fatalf("B's ztunnel for a pod on its node in B: %v", err)
	}
	err = c.request(ctx, tok, map[string]any{"ClusterID": idB, "ImpersonatedIdentity": far.String()}, far)
	wantCode(t, "B's ztunnel for a pod on a node of that name in A", err, codes.PermissionDenied, "condition 3")
	err = c.request(ctx, tok, map[string]any{"ImpersonatedIdentity": app.String()}, app)
	wantCode(t, "B's ztunnel token without ClusterID", err, codes.Unauthenticated)
}
