package chart_test

import (
	"context"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/meshid/meshid/test/kube/harness"
)

// podCertObjects are the objects podCertificates.signerName adds.
func podCertObjects(ns, name string) []string {
	return []string{key("ClusterRole", "", name), key("ClusterRoleBinding", "", name), key("Role", ns, name), key("RoleBinding", ns, name)}
}

// TestTemplatePodCertificates: podCertificates.signerName renders
// --pod-certificate-signer and the RBAC of deploy/pod-certificates/ (for
// meshid.io/workload, rule for rule; for another name, that name and its
// bundle), which the API server accepts; unset, neither is rendered.
func TestTemplatePodCertificates(t *testing.T) {
	const ns = "istio-system"
	off := render(t, "meshid", ns)
	for _, k := range podCertObjects(ns, "meshid-pod-certificates") {
		if off[k] != nil {
			t.Errorf("%s rendered with pod certificates off", k)
		}
	}
	if args := deployment(t, off, ns, "meshid").Spec.Template.Spec.Containers[0].Args; slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--pod-certificate-signer") }) {
		t.Errorf("args %q with pod certificates off", args)
	}

	on := render(t, "meshid", ns, "podCertificates.signerName=meshid.io/workload")
	if args := deployment(t, on, ns, "meshid").Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--pod-certificate-signer=meshid.io/workload") ||
		slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--pod-certificate-refresh-ratio") }) {
		t.Errorf("args %q lack --pod-certificate-signer or set a refresh ratio unasked", args)
	}
	ratio := render(t, "meshid", ns, "podCertificates.signerName=meshid.io/workload", "podCertificates.refreshRatio=0.05")
	if args := deployment(t, ratio, ns, "meshid").Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--pod-certificate-refresh-ratio=0.05") {
		t.Errorf("args %q lack --pod-certificate-refresh-ratio=0.05", args)
	}
	repo, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	plain, err := harness.ReadManifests(filepath.Join(repo, "deploy", "pod-certificates", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plain {
		rendered := on.get(t, p.GetKind(), p.GetNamespace(), p.GetName())
		if p.GetKind() == "ClusterRole" || p.GetKind() == "Role" {
			var got, want rbacv1.ClusterRole
			into(t, rendered, &got)
			into(t, p, &want)
			if !reflect.DeepEqual(got.Rules, want.Rules) {
				t.Errorf("%s rules differ from deploy/:\nchart  %+v\ndeploy %+v", p.GetName(), got.Rules, want.Rules)
			}
			continue
		}
		var got, want rbacv1.RoleBinding
		into(t, rendered, &got)
		into(t, p, &want)
		if !reflect.DeepEqual(got.RoleRef, want.RoleRef) || !reflect.DeepEqual(got.Subjects, want.Subjects) {
			t.Errorf("%s %s differs from deploy/: chart %+v %+v, deploy %+v %+v", p.GetKind(), p.GetName(), got.RoleRef, got.Subjects, want.RoleRef, want.Subjects)
		}
	}

	other := render(t, "mesh", "mesh-ca", "podCertificates.signerName=example.com/apps")
	var cr rbacv1.ClusterRole
	into(t, other.get(t, "ClusterRole", "", "mesh-meshid-pod-certificates"), &cr)
	names := map[string][]string{}
	for _, r := range cr.Rules {
		for _, res := range r.Resources {
			names[res] = append(names[res], r.ResourceNames...)
		}
	}
	if !slices.Equal(names["signers"], []string{"example.com/apps"}) || !slices.Equal(names["clustertrustbundles"], []string{"example.com:apps:roots"}) {
		t.Errorf("resource names for example.com/apps: %v", names)
	}

	// The API server takes them as rendered (and the RoleBinding's
	// namespace exists).
	ctx := context.Background()
	if err := cluster.EnsureNamespace(ctx, "mesh-ca"); err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	for _, k := range podCertObjects("mesh-ca", "mesh-meshid-pod-certificates") {
		objs = append(objs, other[k])
	}
	t.Cleanup(func() {
		rb := cluster.Client().RbacV1()
		const name = "mesh-meshid-pod-certificates"
		_ = rb.ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = rb.ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
		_ = rb.RoleBindings("mesh-ca").Delete(ctx, name, metav1.DeleteOptions{})
		_ = rb.Roles("mesh-ca").Delete(ctx, name, metav1.DeleteOptions{})
	})
	if _, err := cluster.Apply(ctx, objs...); err != nil {
		t.Fatalf("the API server refuses the rendered RBAC: %v", err)
	}
}
