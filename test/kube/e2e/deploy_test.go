package e2e_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/meshid/meshid/test/kube/harness"
)

// warnings collects the API server's Warning headers (deprecated APIs,
// ignored fields): a manifest that draws one fails too.
type warnings struct {
	mu  sync.Mutex
	got []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.got
	w.got = nil
	return out
}

// applier server-side-applies unstructured objects, the way
// `kubectl apply --server-side` does.
type applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
	warn   *warnings
}

func newApplier(t *testing.T, cfg *rest.Config) *applier {
	t.Helper()
	w := &warnings{}
	cfg.WarningHandler = w
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), warn: w}
}

// apply sends obj as a server-side apply with strict field validation;
// dryRun asks the API server to run every admission and validation step
// without persisting.
func (a *applier) apply(ctx context.Context, obj *unstructured.Unstructured, dryRun bool) error {
	gvk := obj.GroupVersionKind()
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	var rc dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		rc = a.dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return err
	}
	force := true
	opts := metav1.PatchOptions{FieldManager: "meshid-e2e", Force: &force, FieldValidation: "Strict"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = rc.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts)
	return err
}

// TestDeployManifestsServerDryRun applies every manifest under deploy/ to
// the real API server with a server-side dry run and strict field
// validation: an unknown or misplaced field, a wrong type, a failed
// validation or a deprecation warning fails the test.
func TestDeployManifestsServerDryRun(t *testing.T) {
	ctx := context.Background()
	ms := loadManifests(t)
	a := newApplier(t, cluster.AdminConfig())

	// A namespaced object can only be admitted into a namespace that
	// exists, so namespaces are dry-run and then created for real.
	for _, m := range ms {
		if m.obj.GetKind() != "Namespace" {
			continue
		}
		if err := a.apply(ctx, m.obj, true); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		if err := cluster.EnsureNamespace(ctx, m.obj.GetName()); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range ms {
		t.Run(m.String(), func(t *testing.T) {
			scoped, err := a.mapper.RESTMapping(m.obj.GroupVersionKind().GroupKind(), m.obj.GroupVersionKind().Version)
			if err != nil {
				t.Fatal(err)
			}
			if scoped.Scope.Name() == meta.RESTScopeNameNamespace && m.obj.GetNamespace() == "" {
				t.Fatal("namespaced object without metadata.namespace (it would land in the user's current namespace)")
			}
			if err := a.apply(ctx, m.obj, true); err != nil {
				t.Fatal(err)
			}
			if w := a.warn.take(); len(w) > 0 {
				t.Fatalf("API server warnings: %q", w)
			}
		})
	}

	// The check can fail: the same dry run rejects an unknown field.
	t.Run("strict validation rejects an unknown field", func(t *testing.T) {
		bad := find(t, ms, "Deployment", "istio-system", "meshid").DeepCopy()
		if err := unstructured.SetNestedField(bad.Object, int64(2), "spec", "replicaz"); err != nil {
			t.Fatal(err)
		}
		if err := a.apply(ctx, bad, true); err == nil {
			t.Fatal("a Deployment with spec.replicaz was accepted")
		}
	})
}

// TestDeployManifestsContent checks the properties the manifests promise:
// HA, probes, hardening, and the workload token the agent needs.
func TestDeployManifestsContent(t *testing.T) {
	ms := loadManifests(t)
	for _, variant := range []struct {
		file string
		// keySource checks how the Deployment gets its CA.
		keySource func(dep appsv1.Deployment, c corev1.Container) (string, bool)
	}{
		// The first example: Istio's cacerts Secret mounted as the CA dir.
		{"20-ca.yaml", func(dep appsv1.Deployment, c corev1.Container) (string, bool) {
			return "cacerts Secret mounted read-only at /etc/cacerts, --ca-dir=/etc/cacerts", mountsCacerts(dep, c) && slices.Contains(c.Args, "--ca-dir=/etc/cacerts") && !slices.Contains(c.Args, "--kube-ca-secret")
		}},
		// The alternative: the CA keeps its key in a Secret it manages.
		{"kube-ca-secret/20-ca.yaml", func(_ appsv1.Deployment, c corev1.Container) (string, bool) {
			return "CA keeps its key in a Secret", slices.Contains(c.Args, "--kube-ca-secret") && !slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--ca-dir") })
		}},
	} {
		t.Run(variant.file, func(t *testing.T) {
			var dep appsv1.Deployment
			fromUnstructured(t, findIn(t, ms, variant.file, "Deployment", "istio-system", "meshid"), &dep)
			c := dep.Spec.Template.Spec.Containers[0]
			what, ok := variant.keySource(dep, c)
			if !ok {
				t.Errorf("CA Deployment: %s: not so", what)
			}
			checkCADeployment(t, ms, dep)
		})
	}
	checkAgentExample(t, ms)
}

// mountsCacerts reports whether dep mounts the Secret cacerts read-only
// at /etc/cacerts in container c, readable by the pod's group only.
func mountsCacerts(dep appsv1.Deployment, c corev1.Container) bool {
	var vol string
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "cacerts" && (v.Secret.Optional == nil || !*v.Secret.Optional) &&
			v.Secret.DefaultMode != nil && *v.Secret.DefaultMode&0o007 == 0 {
			vol = v.Name
		}
	}
	sc := dep.Spec.Template.Spec.SecurityContext
	if vol == "" || sc == nil || sc.FSGroup == nil {
		return false
	}
	for _, m := range c.VolumeMounts {
		if m.Name == vol && m.MountPath == "/etc/cacerts" && m.ReadOnly {
			return true
		}
	}
	return false
}

// checkCADeployment checks what every CA Deployment variant promises: HA,
// probes, hardening.
func checkCADeployment(t *testing.T, ms []manifest, dep appsv1.Deployment) {
	t.Helper()
	var pdb policyv1.PodDisruptionBudget
	fromUnstructured(t, find(t, ms, "PodDisruptionBudget", "istio-system", "meshid"), &pdb)
	var svc corev1.Service
	fromUnstructured(t, find(t, ms, "Service", "istio-system", "meshid"), &svc)

	podLabels := labels.Set(dep.Spec.Template.Labels)
	c := dep.Spec.Template.Spec.Containers[0]
	pdbSel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name string
		ok   bool
	}{
		{"2 replicas", dep.Spec.Replicas != nil && *dep.Spec.Replicas == 2},
		{"PDB keeps one replica and selects the CA pods", pdb.Spec.MinAvailable != nil && pdb.Spec.MinAvailable.IntValue() == 1 && pdbSel.Matches(podLabels)},
		{"Service selects the CA pods", labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels)},
		{"Service port grpc 15012", hasPort(svc, "grpc", 15012)},
		{"Service port http-monitoring 15014", hasPort(svc, "http-monitoring", 15014)},
		{"runs as the meshid service account", dep.Spec.Template.Spec.ServiceAccountName == "meshid"},
		{"readiness probe /readyz on 15014", c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path == "/readyz" && portNumber(c, c.ReadinessProbe.HTTPGet.Port) == 15014},
		// Issue 30: without it every pod's first readiness probe met a closed port.
		{"startup probe /healthz on 15014, first after 1 s, up to a minute", c.StartupProbe != nil && c.StartupProbe.HTTPGet != nil && c.StartupProbe.HTTPGet.Path == "/healthz" &&
			portNumber(c, c.StartupProbe.HTTPGet.Port) == 15014 && c.StartupProbe.InitialDelaySeconds >= 1 && c.StartupProbe.PeriodSeconds*c.StartupProbe.FailureThreshold >= 60},
		{"liveness probe /healthz on 15014", c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path == "/healthz" && portNumber(c, c.LivenessProbe.HTTPGet.Port) == 15014},
		{"runAsNonRoot", dep.Spec.Template.Spec.SecurityContext != nil && ptrTrue(dep.Spec.Template.Spec.SecurityContext.RunAsNonRoot)},
		{"read-only root filesystem", c.SecurityContext != nil && ptrTrue(c.SecurityContext.ReadOnlyRootFilesystem)},
		{"no privilege escalation", c.SecurityContext != nil && c.SecurityContext.AllowPrivilegeEscalation != nil && !*c.SecurityContext.AllowPrivilegeEscalation},
		{"resource requests", !c.Resources.Requests.Cpu().IsZero() && !c.Resources.Requests.Memory().IsZero()},
	}
	for _, ck := range checks {
		if !ck.ok {
			t.Errorf("CA Deployment: %s: not so", ck.name)
		}
	}
	if err := harness.CheckGoMemLimit(c); err != nil {
		t.Errorf("CA Deployment: %v", err)
	}
}

// checkAgentExample checks the workload example's projected token.
func checkAgentExample(t *testing.T, ms []manifest) {
	t.Helper()
	var ex appsv1.Deployment
	fromUnstructured(t, find(t, ms, "Deployment", "meshid-example", "example"), &ex)
	var tokenOK bool
	for _, v := range ex.Spec.Template.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if st := s.ServiceAccountToken; st != nil && st.Audience == "istio-ca" && st.ExpirationSeconds != nil && *st.ExpirationSeconds == 43200 {
				tokenOK = true
			}
		}
	}
	if !tokenOK {
		t.Error("agent example: no projected token with audience istio-ca and expirationSeconds 43200")
	}
}

func fromUnstructured(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
		t.Fatal(err)
	}
}

func hasPort(svc corev1.Service, name string, port int32) bool {
	for _, p := range svc.Spec.Ports {
		if p.Name == name && p.Port == port {
			return true
		}
	}
	return false
}

// portNumber resolves a probe port (a number or a container port name).
func portNumber(c corev1.Container, port intstr.IntOrString) int32 {
	if port.Type == intstr.Int {
		return port.IntVal
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return p.ContainerPort
		}
	}
	return 0
}

func ptrTrue(b *bool) bool { return b != nil && *b }
