package chart_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/meshid/meshid/test/kube/harness"
)

func into(t *testing.T, u *unstructured.Unstructured, out any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

func deployment(t *testing.T, r rendered, ns, name string) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	into(t, r.get(t, "Deployment", ns, name), &d)
	return &d
}

func TestLint(t *testing.T) {
	mustHelm(t, "lint", "--strict", chartDir)
	mustHelm(t, "lint", "--strict", chartDir, "--namespace", "istio-system",
		"--set", "caMode=kubeCASecret", "--set", "server.trustedNodeAccounts={istio-system/ztunnel}",
		"--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true")
	// The check can fail: the chart with a template that renders invalid
	// YAML does not lint.
	broken := filepath.Join(t.TempDir(), "meshid")
	if err := os.CopyFS(broken, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(broken, "templates", "broken.yaml"), []byte("kind: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := helm(t, "lint", "--strict", broken); err == nil {
		t.Fatalf("lint accepted a broken template:\n%s", out)
	}
}

// TestTemplateDefaults: the default values render the CA of deploy/ (two
// replicas on Istio's cacerts, PDB, Service, RBAC, NetworkPolicy, APF), all
// in the release namespace, no Namespace object, nothing optional.
func TestTemplateDefaults(t *testing.T) {
	const ns = "istio-system"
	r := render(t, "meshid", ns)
	want := []string{
		key("ServiceAccount", ns, "meshid"), key("ClusterRole", "", "meshid"), key("ClusterRoleBinding", "", "meshid"),
		key("Role", ns, "meshid"), key("RoleBinding", ns, "meshid"), key("Service", ns, "meshid"),
		key("Deployment", ns, "meshid"), key("PodDisruptionBudget", ns, "meshid"), key("NetworkPolicy", ns, "meshid"),
		key("FlowSchema", "", "meshid-ca-tokenreviews"), key("PriorityLevelConfiguration", "", "meshid-ca-tokenreviews"),
		key("ClusterRole", "", "meshid-local-verification"), key("ClusterRoleBinding", "", "meshid-local-verification"),
	}
	got := r.keys()
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Fatalf("rendered %q,\nwant %q", got, want)
	}
	d := deployment(t, r, ns, "meshid")
	if *d.Spec.Replicas != 2 {
		t.Errorf("replicas %d, want 2", *d.Spec.Replicas)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != "meshid:latest" {
		t.Errorf("image %q, want meshid:latest (what make image builds)", c.Image)
	}
	for _, arg := range []string{"server", "--listen=0.0.0.0:15012", "--monitoring-listen=0.0.0.0:15014", "--ca-dir=/etc/cacerts",
		"--serving-dns-names=meshid.istio-system.svc,meshid.istio-system.svc.cluster.local", "--trust-domain=cluster.local",
		"--token-verification=auto"} {
		if !slices.Contains(c.Args, arg) {
			t.Errorf("args %q lack %s", c.Args, arg)
		}
	}
	if v := d.Spec.Template.Spec.Volumes; len(v) != 2 || v[0].Secret == nil || v[0].Secret.SecretName != "cacerts" {
		t.Errorf("volumes %+v, want the cacerts Secret and the state emptyDir", v)
	}
	if sc := c.SecurityContext; sc == nil || *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("container security context %+v", sc)
	}
	if psc := d.Spec.Template.Spec.SecurityContext; psc == nil || !*psc.RunAsNonRoot || *psc.RunAsUser != 65532 {
		t.Errorf("pod security context %+v", psc)
	}
	if err := harness.CheckGoMemLimit(c); err != nil {
		t.Error(err)
	}
	// The check can fail: a divisor of 1Mi would make GOMEMLIMIT 512 bytes.
	c.Env[len(c.Env)-1].ValueFrom.ResourceFieldRef.Divisor = resource.MustParse("1Mi")
	if harness.CheckGoMemLimit(c) == nil {
		t.Error("CheckGoMemLimit accepted GOMEMLIMIT in MiB")
	}
	var pdb policyv1.PodDisruptionBudget
	into(t, r.get(t, "PodDisruptionBudget", ns, "meshid"), &pdb)
	if pdb.Spec.MinAvailable.IntValue() != 1 || !reflect.DeepEqual(pdb.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels) {
		t.Errorf("PDB %+v does not cover the Deployment's pods", pdb.Spec)
	}
}

// TestTemplateFlagsExist: every flag the chart renders, for values that set
// every server value, is a flag of the real `meshid server` (a renamed flag
// would crash-loop every replica).
func TestTemplateFlagsExist(t *testing.T) {
	help, err := exec.Command(meshidBinary(t), "server", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("meshid server --help: %v\n%s", err, help)
	}
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`--([a-z0-9-]+)`).FindAllStringSubmatch(string(help), -1) {
		known[m[1]] = true
	}
	r := render(t, "meshid", "istio-system", everyServerValue...)
	args := deployment(t, r, "istio-system", "meshid").Spec.Template.Spec.Containers[0].Args
	if len(args) < 25 {
		t.Fatalf("only %d args rendered for every server value: %q", len(args), args)
	}
	for _, a := range args[1:] {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !known[name] {
			t.Errorf("rendered %q: not a flag of meshid server", a)
		}
	}
	// The check can fail: a made-up flag is not known.
	if known["no-such-flag"] || !known["max-ttl"] {
		t.Fatal("flag list from --help is wrong")
	}
}

// everyServerValue sets every value under server (helm --set syntax).
var everyServerValue = []string{
	"server.trustDomain=example.org", "server.defaultTTL=12h", "server.maxTTL=48h", "server.rootKeyType=ec-p384",
	"server.tokenAudiences={istio-ca,meshid}", "server.tokenreviewIssuers={https://kubernetes.default.svc}",
	"server.jwtIssuer=https://issuer.example", "server.maxTokenLifetime=24h", "server.capTTLToToken=true",
	"server.rateLimit=2.5", "server.kubeQPS=100", "server.kubeBurst=200", "server.publishRootConfigMap=false",
	"server.rootConfigMapNamespaces=istio-injection=enabled", "server.trustedNodeAccounts={istio-system/ztunnel}",
	"server.maxConnections=1000000", "server.maxConnectionsPerIP=64", "server.firstRequestTimeout=5s",
	"server.servingTTL=12h", "server.jwtSVIDTTL=2m", "server.apiserverReadinessGrace=45s", "server.jwtKeyLifetime=6h", "server.servingDNSNames={ca.example.org}", "server.logLevel=debug", "server.logFormat=text",
}

// TestTemplateKubeCASecretAndNodeMode: the Secret-held CA, a registry
// image, more replicas, node mode and every server value.
func TestTemplateKubeCASecretAndNodeMode(t *testing.T) {
	const ns = "mesh-ca"
	r := render(t, "prod", ns, append([]string{"caMode=kubeCASecret", "replicaCount=3",
		"image.repository=registry.example.com/mesh/meshid", "image.tag=v0.1.0"}, everyServerValue...)...)
	d := deployment(t, r, ns, "prod-meshid")
	c := d.Spec.Template.Spec.Containers[0]
	if *d.Spec.Replicas != 3 || c.Image != "registry.example.com/mesh/meshid:v0.1.0" {
		t.Errorf("replicas %d image %q", *d.Spec.Replicas, c.Image)
	}
	for _, arg := range []string{"--kube-ca-secret", "--trusted-node-accounts=istio-system/ztunnel", "--rate-limit=2.5",
		"--max-connections=1000000", "--token-audiences=istio-ca,meshid", "--publish-root-configmap=false", "--cap-ttl-to-token",
		"--serving-dns-names=prod-meshid.mesh-ca.svc,prod-meshid.mesh-ca.svc.cluster.local,ca.example.org",
		"--root-configmap-namespaces=istio-injection=enabled", "--log-format=text", "--apiserver-readiness-grace=45s"} {
		if !slices.Contains(c.Args, arg) {
			t.Errorf("args %q lack %s", c.Args, arg)
		}
	}
	if slices.Contains(c.Args, "--ca-dir=/etc/cacerts") || len(d.Spec.Template.Spec.Volumes) != 1 {
		t.Errorf("kubeCASecret mode still mounts cacerts: %q %+v", c.Args, d.Spec.Template.Spec.Volumes)
	}
	var cr rbacv1.ClusterRole
	into(t, r.get(t, "ClusterRole", "", "prod-meshid-node-mode"), &cr)
	if len(cr.Rules) != 1 || !slices.Equal(cr.Rules[0].Resources, []string{"pods"}) || !slices.Equal(cr.Rules[0].Verbs, []string{"get", "list", "watch"}) {
		t.Errorf("node-mode rules %+v, want read-only pods", cr.Rules)
	}
	var crb rbacv1.ClusterRoleBinding
	into(t, r.get(t, "ClusterRoleBinding", "", "prod-meshid-node-mode"), &crb)
	if crb.RoleRef.Name != "prod-meshid-node-mode" || len(crb.Subjects) != 1 || crb.Subjects[0].Name != "prod-meshid" || crb.Subjects[0].Namespace != ns {
		t.Errorf("node-mode binding %+v", crb)
	}
	for k, o := range r {
		if o.GetKind() == "Namespace" {
			t.Errorf("the chart renders a Namespace (%s): it must never own one", k)
		}
	}
}

// TestTemplateRBACMatchesDeploy: the chart grants exactly the rules of the
// plain manifests (deploy/10-rbac.yaml, deploy/15-local-verification.yaml,
// deploy/ambient/), which test/kube/e2e proves sufficient and minimal for
// the real CA.
func TestTemplateRBACMatchesDeploy(t *testing.T) {
	repo, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	plain := map[string]*unstructured.Unstructured{}
	for _, f := range []string{"10-rbac.yaml", "15-local-verification.yaml", "ambient/rbac-node-mode.yaml"} {
		objs, err := harness.ReadManifests(filepath.Join(repo, "deploy", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			plain[o.GetKind()+"/"+o.GetName()] = o
		}
	}
	r := render(t, "meshid", "istio-system", "server.trustedNodeAccounts={istio-system/ztunnel}")
	for _, c := range []struct{ kind, ns, name, plain string }{
		{"ClusterRole", "", "meshid", "ClusterRole/meshid"},
		{"Role", "istio-system", "meshid", "Role/meshid"},
		{"ClusterRole", "", "meshid-node-mode", "ClusterRole/meshid-node-mode"},
		{"ClusterRole", "", "meshid-local-verification", "ClusterRole/meshid-local-verification"},
	} {
		var got, want rbacv1.ClusterRole
		into(t, r.get(t, c.kind, c.ns, c.name), &got)
		p := plain[c.plain]
		if p == nil {
			t.Fatalf("deploy/ has no %s", c.plain)
		}
		into(t, p, &want)
		if !reflect.DeepEqual(got.Rules, want.Rules) {
			t.Errorf("%s rules differ from deploy/:\nchart  %+v\ndeploy %+v", c.plain, got.Rules, want.Rules)
		}
	}
}

// TestTemplateMonitoring: ServiceMonitor, PrometheusRule (the alerts file
// verbatim) and the Grafana dashboard ConfigMap render only when enabled;
// the NetworkPolicy admits the monitoring port from the configured
// namespace and the CSR port from the mesh.
func TestTemplateMonitoring(t *testing.T) {
	const ns = "istio-system"
	off := render(t, "meshid", ns)
	for _, k := range []string{key("ServiceMonitor", ns, "meshid"), key("PrometheusRule", ns, "meshid"), key("ConfigMap", ns, "meshid-dashboard")} {
		if off[k] != nil {
			t.Errorf("%s rendered by default", k)
		}
	}
	r := render(t, "meshid", ns, "serviceMonitor.enabled=true", "prometheusRule.enabled=true", "grafanaDashboard.enabled=true",
		"networkPolicy.monitoringNamespace=observability", "prometheusRule.labels.release=kube-prometheus")

	sm := r.get(t, "ServiceMonitor", ns, "meshid")
	if port, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints"); len(port) != 1 || port[0].(map[string]any)["port"] != "http-monitoring" {
		t.Errorf("ServiceMonitor endpoints %v", port)
	}

	pr := r.get(t, "PrometheusRule", ns, "meshid")
	if pr.GetLabels()["release"] != "kube-prometheus" {
		t.Errorf("PrometheusRule labels %v", pr.GetLabels())
	}
	repo, _ := harness.RepoRoot()
	rulesFile, err := os.ReadFile(filepath.Join(repo, "deploy", "observability", "meshid-alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := yaml.Unmarshal(rulesFile, &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(pr.Object["spec"], want) {
		t.Errorf("PrometheusRule spec is not deploy/observability/meshid-alerts.yaml")
	}
	// With citadelCompat, the recording rules of Istio's names follow.
	compatFile, err := os.ReadFile(filepath.Join(repo, "deploy", "observability", "citadel-compat-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var compat map[string]any
	if err := yaml.Unmarshal(compatFile, &compat); err != nil {
		t.Fatal(err)
	}
	withCompat := render(t, "meshid", ns, "prometheusRule.enabled=true", "prometheusRule.citadelCompat=true").get(t, "PrometheusRule", ns, "meshid")
	groups, _, _ := unstructured.NestedSlice(withCompat.Object, "spec", "groups")
	wantGroups := append(slices.Clone(want["groups"].([]any)), compat["groups"].([]any)...)
	if !reflect.DeepEqual(groups, wantGroups) {
		t.Errorf("PrometheusRule with citadelCompat holds %d groups, want the alerts' and the compat rules' (%d)", len(groups), len(wantGroups))
	}

	cm := r.get(t, "ConfigMap", ns, "meshid-dashboard")
	dash, _, _ := unstructured.NestedString(cm.Object, "data", "meshid.json")
	file, err := os.ReadFile(filepath.Join(repo, "deploy", "observability", "meshid-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid([]byte(dash)) || !bytes.Equal(bytes.TrimSpace([]byte(dash)), bytes.TrimSpace(file)) {
		t.Error("the dashboard ConfigMap does not hold deploy/observability/meshid-dashboard.json")
	}
	if cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v", cm.GetLabels())
	}

	var np networkingv1.NetworkPolicy
	into(t, r.get(t, "NetworkPolicy", ns, "meshid"), &np)
	if len(np.Spec.Ingress) != 2 || np.Spec.Ingress[0].Ports[0].Port.StrVal != "grpc" ||
		np.Spec.Ingress[1].Ports[0].Port.StrVal != "http-monitoring" ||
		np.Spec.Ingress[1].From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "observability" {
		t.Errorf("NetworkPolicy ingress %+v", np.Spec.Ingress)
	}
	if !reflect.DeepEqual(np.Spec.PodSelector.MatchLabels, deployment(t, r, ns, "meshid").Spec.Selector.MatchLabels) {
		t.Error("the NetworkPolicy does not select the CA's pods")
	}
}

// TestTemplateOptionalOff: PDB, NetworkPolicy and APF can be turned off.
func TestTemplateOptionalOff(t *testing.T) {
	r := render(t, "meshid", "istio-system", "podDisruptionBudget.enabled=false", "networkPolicy.enabled=false", "flowControl.enabled=false")
	for k, o := range r {
		switch o.GetKind() {
		case "PodDisruptionBudget", "NetworkPolicy", "FlowSchema", "PriorityLevelConfiguration":
			t.Errorf("%s rendered while disabled", k)
		}
	}
	if len(r) != 9 {
		t.Errorf("rendered %q, want the SA, RBAC (local verification's included), Service and Deployment", r.keys())
	}
}

// TestTemplateRefusesBadValues: values the CA cannot run with fail the
// render with a message naming the value.
func TestTemplateRefusesBadValues(t *testing.T) {
	for _, set := range [][]string{{"caMode=nope"}, {"replicaCount=0"}, {"server.tokenVerification=fast"}} {
		_, err := renderErr(t, "meshid", "istio-system", set...)
		if err == nil || !strings.Contains(err.Error(), strings.SplitN(set[0], "=", 2)[0]) {
			t.Errorf("--set %v: %v, want an error naming the value", set, err)
		}
	}
}

// TestTemplateTokenVerification (issue 30): the default (auto) renders the
// local-verification RBAC for the release's own ServiceAccount, whatever
// the release name and namespace; tokenreview renders none of it and says
// so to the server.
func TestTemplateTokenVerification(t *testing.T) {
	const ns = "mesh-edge"
	r := render(t, "edge", ns)
	var crb rbacv1.ClusterRoleBinding
	into(t, r.get(t, "ClusterRoleBinding", "", "edge-meshid-local-verification"), &crb)
	if crb.RoleRef.Name != "edge-meshid-local-verification" || len(crb.Subjects) != 1 ||
		crb.Subjects[0].Kind != "ServiceAccount" || crb.Subjects[0].Name != "edge-meshid" || crb.Subjects[0].Namespace != ns {
		t.Errorf("local-verification binding %+v, want the release's ServiceAccount %s/edge-meshid", crb, ns)
	}
	sa := r.get(t, "ServiceAccount", ns, "edge-meshid")
	if d := deployment(t, r, ns, "edge-meshid"); d.Spec.Template.Spec.ServiceAccountName != sa.GetName() {
		t.Errorf("the pods run as %q, the binding names %q", d.Spec.Template.Spec.ServiceAccountName, sa.GetName())
	}
	off := render(t, "edge", ns, "server.tokenVerification=tokenreview")
	for k := range off {
		if strings.Contains(k, "local-verification") {
			t.Errorf("%s rendered with server.tokenVerification=tokenreview", k)
		}
	}
	if args := deployment(t, off, ns, "edge-meshid").Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--token-verification=tokenreview") {
		t.Errorf("args %q lack --token-verification=tokenreview", args)
	}
	local := render(t, "edge", ns, "server.tokenVerification=local")
	local.get(t, "ClusterRole", "", "edge-meshid-local-verification")
}

// TestTemplateProbes (issue 30): the CA's Deployment, in the chart and in
// both plain manifests, has a startup probe on /healthz that holds the
// readiness (/readyz) and liveness (/healthz) probes back until the
// process listens, and gives it a minute.
func TestTemplateProbes(t *testing.T) {
	repo, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	deps := map[string]*appsv1.Deployment{"chart": deployment(t, render(t, "meshid", "istio-system"), "istio-system", "meshid"),
		"chart kubeCASecret": deployment(t, render(t, "meshid", "istio-system", "caMode=kubeCASecret"), "istio-system", "meshid")}
	for _, f := range []string{"20-ca.yaml", "kube-ca-secret/20-ca.yaml"} {
		objs, err := harness.ReadManifests(filepath.Join(repo, "deploy", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o.GetKind() == "Deployment" {
				var d appsv1.Deployment
				into(t, o, &d)
				deps["deploy/"+f] = &d
			}
		}
	}
	if len(deps) != 4 {
		t.Fatalf("found %d Deployments, want the chart's two and deploy/'s two", len(deps))
	}
	for name, d := range deps {
		c := d.Spec.Template.Spec.Containers[0]
		sp, rp, lp := c.StartupProbe, c.ReadinessProbe, c.LivenessProbe
		switch {
		case sp == nil || sp.HTTPGet == nil || sp.HTTPGet.Path != "/healthz" || sp.HTTPGet.Port.String() != "http-monitoring":
			t.Errorf("%s: startup probe %+v, want GET /healthz on http-monitoring", name, sp)
		case sp.InitialDelaySeconds < 1 || sp.PeriodSeconds*sp.FailureThreshold < 60:
			t.Errorf("%s: startup probe first after %d s, gives up after %d s: want at least 1 s and a minute", name, sp.InitialDelaySeconds, sp.PeriodSeconds*sp.FailureThreshold)
		case rp == nil || rp.HTTPGet == nil || rp.HTTPGet.Path != "/readyz":
			t.Errorf("%s: readiness probe %+v, want /readyz", name, rp)
		case lp == nil || lp.HTTPGet == nil || lp.HTTPGet.Path != "/healthz":
			t.Errorf("%s: liveness probe %+v, want /healthz", name, lp)
		}
	}
}

// TestTemplateUpstream: caMode upstream passes --upstream and
// --upstream-credentials from the Secret it mounts (0440, the fsGroup's),
// and --kube-ca-secret (the elected replica mints, the others sign with
// the Secret meshid-ca-upstream it writes, which the Role lets it
// update), mounts no cacerts, and refuses to render without the URL or
// the Secret.
func TestTemplateUpstream(t *testing.T) {
	const url = "cfssl+https://cfssl.corp.example:8888?profile=meshid-intermediate&ca=/etc/meshid/upstream/tls-ca.pem"
	r := render(t, "meshid", "istio-system", "caMode=upstream", "upstream.url="+strings.ReplaceAll(url, ",", `\,`),
		"upstream.secretName=meshid-upstream", "upstream.lifetime=72h", "upstream.renewAt=0.25")
	d := deployment(t, r, "istio-system", "meshid")
	c := d.Spec.Template.Spec.Containers[0]
	for _, arg := range []string{"--upstream=" + url, "--upstream-credentials=/etc/meshid/upstream/auth-key",
		"--upstream-lifetime=72h", "--upstream-renew-at=0.25", "--kube-ca-secret"} {
		if !slices.Contains(c.Args, arg) {
			t.Errorf("args %q lack %s", c.Args, arg)
		}
	}
	if slices.Contains(c.Args, "--ca-dir=/etc/cacerts") {
		t.Errorf("upstream mode with another CA source: %q", c.Args)
	}
	if role, _ := json.Marshal(r.get(t, "Role", "istio-system", "meshid").Object); !strings.Contains(string(role), `"resourceNames":["meshid-ca-upstream"],"resources":["secrets"],"verbs":["get","list","watch","update"]`) {
		t.Errorf("the Role does not let the leader write the Secret meshid-ca-upstream: %s", role)
	}
	var vol *corev1.Volume
	for i, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "upstream" {
			vol = &d.Spec.Template.Spec.Volumes[i]
		}
		if v.Name == "cacerts" {
			t.Error("upstream mode mounts cacerts")
		}
	}
	if vol == nil || vol.Secret == nil || vol.Secret.SecretName != "meshid-upstream" || vol.Secret.DefaultMode == nil || *vol.Secret.DefaultMode != 0o440 {
		t.Fatalf("upstream Secret volume %+v", vol)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "upstream" && m.MountPath == "/etc/meshid/upstream" && m.ReadOnly
	}) {
		t.Errorf("mounts %+v", c.VolumeMounts)
	}
	for _, set := range [][]string{{"caMode=upstream"}, {"caMode=upstream", "upstream.url=" + url}, {"caMode=upstream", "upstream.secretName=s"}} {
		if _, err := renderErr(t, "meshid", "istio-system", set...); err == nil || !strings.Contains(err.Error(), "caMode upstream needs") {
			t.Errorf("%v: %v", set, err)
		}
	}
}
