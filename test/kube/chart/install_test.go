package chart_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// releaseObjects is what the release's current revision manages, from
// `helm get manifest`.
func releaseObjects(t *testing.T, release, ns string) rendered {
	t.Helper()
	return decode(t, mustHelm(t, "get", "manifest", release, "--namespace", ns))
}

// assertLive: every object exists on the API server, labelled as this
// release's.
func assertLive(t *testing.T, objs rendered, release string) {
	t.Helper()
	for k, o := range objs {
		live, err := cluster.Get(context.Background(), o)
		if err != nil {
			t.Errorf("%s: %v", k, err)
			continue
		}
		if live.GetLabels()["app.kubernetes.io/managed-by"] != "Helm" || live.GetAnnotations()["meta.helm.sh/release-name"] != release {
			t.Errorf("%s: labels %v annotations %v, want this release's", k, live.GetLabels(), live.GetAnnotations())
		}
	}
}

// assertGone: no object is left on the API server.
func assertGone(t *testing.T, objs rendered) {
	t.Helper()
	for k, o := range objs {
		if _, err := cluster.Get(context.Background(), o); !apierrors.IsNotFound(err) {
			t.Errorf("%s still there after uninstall (%v)", k, err)
		}
	}
}

// preexisting creates what lives in the CA's namespace without belonging
// to the chart: the operator's cacerts Secret, and what the running CA
// creates (the meshid-ca Secret and Lease, the istio-ca-root-cert
// ConfigMaps). Uninstall must leave them, and the namespace.
func preexisting(t *testing.T, ns string) []func() error {
	t.Helper()
	ctx := context.Background()
	c := cluster.Client()
	if err := cluster.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := cluster.EnsureNamespace(ctx, "shop"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cacerts", "meshid-ca"} {
		if _, err := c.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string][]byte{"root-cert.pem": []byte("x")}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "meshid-ca"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{ns, "shop"} {
		if _, err := c.CoreV1().ConfigMaps(n).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert"}, Data: map[string]string{"root-cert.pem": "x"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return []func() error{
		func() error { _, err := c.CoreV1().Secrets(ns).Get(ctx, "cacerts", metav1.GetOptions{}); return err },
		func() error { _, err := c.CoreV1().Secrets(ns).Get(ctx, "meshid-ca", metav1.GetOptions{}); return err },
		func() error {
			_, err := c.CoordinationV1().Leases(ns).Get(ctx, "meshid-ca", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := c.CoreV1().ConfigMaps(ns).Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := c.CoreV1().ConfigMaps("shop").Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
			return err
		},
	}
}

// TestInstallUpgradeUninstall: helm install, upgrade and uninstall of the
// chart in istio-system on the real API server (every object validated
// and stored by it), and what uninstall leaves: the namespace and what the
// operator and the running CA created there.
func TestInstallUpgradeUninstall(t *testing.T) {
	const ns, release = "istio-system", "helmtest"
	ctx := context.Background()
	survivors := preexisting(t, ns)

	mustHelm(t, "install", release, chartDir, "--namespace", ns, "--set", "image.tag=v1")
	v1 := releaseObjects(t, release, ns)
	if len(v1) != 13 {
		t.Errorf("release holds %q, want the 13 default objects", v1.keys())
	}
	assertLive(t, v1, release)
	dep, err := cluster.Client().AppsV1().Deployments(ns).Get(ctx, "helmtest-meshid", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *dep.Spec.Replicas != 2 || dep.Spec.Template.Spec.Containers[0].Image != "meshid:v1" {
		t.Errorf("installed Deployment: replicas %d image %s", *dep.Spec.Replicas, dep.Spec.Template.Spec.Containers[0].Image)
	}

	mustHelm(t, "upgrade", release, chartDir, "--namespace", ns, "--set", "image.tag=v2", "--set", "replicaCount=3",
		"--set", "server.trustedNodeAccounts={istio-system/ztunnel}", "--set", "networkPolicy.enabled=false")
	v2 := releaseObjects(t, release, ns)
	assertLive(t, v2, release)
	dep, err = cluster.Client().AppsV1().Deployments(ns).Get(ctx, "helmtest-meshid", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *dep.Spec.Replicas != 3 || dep.Spec.Template.Spec.Containers[0].Image != "meshid:v2" ||
		!slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--trusted-node-accounts=istio-system/ztunnel") {
		t.Errorf("upgraded Deployment: replicas %d image %s args %q", *dep.Spec.Replicas, dep.Spec.Template.Spec.Containers[0].Image, dep.Spec.Template.Spec.Containers[0].Args)
	}
	if _, err := cluster.Client().RbacV1().ClusterRoleBindings().Get(ctx, "helmtest-meshid-node-mode", metav1.GetOptions{}); err != nil {
		t.Errorf("node-mode binding after the upgrade: %v", err)
	}
	if _, err := cluster.Client().NetworkingV1().NetworkPolicies(ns).Get(ctx, "helmtest-meshid", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("NetworkPolicy after the upgrade disabled it: %v", err)
	}
	if out := mustHelm(t, "history", release, "--namespace", ns); !strings.Contains(out, "deployed") || strings.Count(out, "\n") != 3 {
		t.Errorf("history:\n%s", out)
	}

	mustHelm(t, "uninstall", release, "--namespace", ns)
	assertGone(t, v1)
	assertGone(t, v2)
	nsObj, err := cluster.Client().CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil || nsObj.DeletionTimestamp != nil || nsObj.Status.Phase != corev1.NamespaceActive {
		t.Fatalf("namespace %s after uninstall: %v %+v", ns, err, nsObj)
	}
	for i, alive := range survivors {
		if err := alive(); err != nil {
			t.Errorf("pre-existing object %d removed by uninstall: %v", i, err)
		}
	}
	secrets, err := cluster.Client().CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=" + release})
	if err != nil || len(secrets.Items) != 0 {
		t.Errorf("release records left: %v %v", err, secrets)
	}
}

// TestInstallValidatedByTheAPIServer: a value the templates accept but the
// API server refuses (a port above 65535) fails the install there, and
// --rollback-on-failure leaves nothing behind.
func TestInstallValidatedByTheAPIServer(t *testing.T) {
	const ns, release = "meshid-bad", "badport"
	if err := cluster.EnsureNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	objs := render(t, release, ns, "ports.grpc=70000")
	out, err := helm(t, "install", release, chartDir, "--namespace", ns, "--set", "ports.grpc=70000", "--rollback-on-failure", "--timeout", "60s")
	if err == nil || !strings.Contains(out, "70000") {
		t.Fatalf("install with port 70000: %v\n%s", err, out)
	}
	assertGone(t, objs)
}
