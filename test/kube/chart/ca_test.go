package chart_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/test/kube/harness"
)

// meshidBinary builds cmd/meshid once for the package.
func meshidBinary(t *testing.T) string {
	t.Helper()
	bin, err := harness.BuildMeshidOnce(filepath.Join(helmHome, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// eventually polls cond every 100 ms until it returns nil, failing the
// test after timeout with its last error.
func eventually(t *testing.T, timeout time.Duration, what string, cond func(context.Context) error) {
	t.Helper()
	var last error
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		last = cond(ctx)
		return last == nil, nil
	}); err != nil {
		t.Fatalf("%s: not within %s: %v", what, timeout, last)
	}
}

// allowed asks the API server's authorizer (a SubjectAccessReview) whether
// service account ns/sa may do verb on resource cluster-wide, or get the
// non-resource path when resource starts with "/".
func allowed(t *testing.T, ns, sa, verb, resource string) bool {
	t.Helper()
	spec := authorizationv1.SubjectAccessReviewSpec{
		User:   "system:serviceaccount:" + ns + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	if strings.HasPrefix(resource, "/") {
		spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Verb: verb, Path: resource}
	} else {
		spec.ResourceAttributes = &authorizationv1.ResourceAttributes{Verb: verb, Resource: resource}
	}
	sar, err := cluster.Client().AuthorizationV1().SubjectAccessReviews().Create(context.Background(),
		&authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return sar.Status.Allowed
}

// chartCA runs the real `meshid server` as the chart's pods would: the
// installed Deployment's args and environment, as the release's
// ServiceAccount (a token of it), with only the listen addresses and the
// scratch directory moved to the test's.
type chartCA struct {
	proc    *harness.Process
	monitor string
}

func runChartCA(t *testing.T, ns, deploymentName string) *chartCA {
	t.Helper()
	ctx := context.Background()
	dep, err := cluster.Client().AppsV1().Deployments(ns).Get(ctx, deploymentName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := dep.Spec.Template.Spec
	tok, err := cluster.Token(ctx, harness.TokenSpec{Namespace: ns, ServiceAccount: pod.ServiceAccountName, Expiration: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := cluster.TokenKubeconfig(pod.ServiceAccountName, tok)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	monitor, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var args []string
	for _, a := range pod.Containers[0].Args {
		switch {
		case strings.HasPrefix(a, "--listen="):
			a = "--listen=" + addr
		case strings.HasPrefix(a, "--monitoring-listen="):
			a = "--monitoring-listen=" + monitor
		case strings.HasPrefix(a, "--state-dir="):
			a = "--state-dir=" + filepath.Join(dir, "state")
		case strings.HasPrefix(a, "--ca-dir="):
			t.Fatalf("the Deployment mounts a CA directory (%s): install with caMode=kubeCASecret", a)
		}
		args = append(args, a)
	}
	args = append(args, "--kubeconfig="+kubeconfig)
	// The downward API's values, as the Deployment's env sets them.
	env := []string{"POD_NAMESPACE=" + ns, "POD_NAME=" + deploymentName + "-0"}
	p, err := harness.StartProcess("meshid-server", meshidBinary(t), filepath.Join(dir, "meshid-server.log"), env, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(20 * time.Second); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("meshid server log:\n%s", p.Tail(16384))
		}
	})
	return &chartCA{proc: p, monitor: monitor}
}

// metric reads one sample, name{labels} (labels as Prometheus prints
// them, "" for none), from the CA's /metrics.
func (c *chartCA) metric(name, labels string) (float64, error) {
	return harness.ScrapeMetric(c.monitor, name, labels)
}

func (c *chartCA) readyz() (int, string, error) {
	resp, err := http.Get("http://" + c.monitor + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, string(body), err
}

// notesObjects are the objects NOTES.txt says stay after uninstall, as
// "Kind/name", from its lines "  - Kind name: why".
func notesObjects(notes string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^\s+- (Namespace|Secret|Lease|ConfigMap) ([a-z0-9.-]+):`).FindAllStringSubmatch(notes, -1) {
		out = append(out, m[1]+"/"+m[2])
	}
	sort.Strings(out)
	return out
}

// readmeObjects are the rows of the chart README's uninstall table, as
// "Kind/name" (the release namespace as Namespace/<ns>).
func readmeObjects(t *testing.T, ns string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Uninstall")
	if !ok {
		t.Fatal("the chart README has no Uninstall section")
	}
	var out []string
	for _, m := range regexp.MustCompile("(?m)^\\| (Namespace|Secret|Lease|ConfigMap) (`([a-z0-9.-]+)`|\\(the release's\\))").FindAllStringSubmatch(section, -1) {
		name := m[3]
		if name == "" {
			name = ns
		}
		out = append(out, m[1]+"/"+name)
	}
	sort.Strings(out)
	return out
}

// TestChartRunsTheCA (issue 30): the chart, installed under a release name
// and namespace of its own (edge in mesh-edge, the CA key in a Secret it
// creates), grants its own ServiceAccount what the server's default token
// verification needs: the API server's authorizer lets it list and watch
// pods and service accounts cluster-wide and read the issuer's keys, and
// the real `meshid server`, run with the installed Deployment's args as
// that ServiceAccount, verifies tokens locally, is ready, and never logs
// a forbidden request. After helm uninstall, what the chart and that CA
// leave is exactly what NOTES.txt and the chart README list.
func TestChartRunsTheCA(t *testing.T) {
	const ns, release, sa, app = "mesh-edge", "edge", "edge-meshid", "edge-app"
	ctx := context.Background()
	for _, n := range []string{ns, app} {
		if err := cluster.EnsureNamespace(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	mustHelm(t, "install", release, chartDir, "--namespace", ns, "--set", "caMode=kubeCASecret")
	objs := releaseObjects(t, release, ns)
	notes := mustHelm(t, "get", "notes", release, "--namespace", ns)

	// The authorizer sees a new binding a moment after it is created.
	eventually(t, 30*time.Second, "the chart's local-verification binding seen by the authorizer", func(context.Context) error {
		if !allowed(t, ns, sa, "list", "pods") {
			return fmt.Errorf("%s/%s may not list pods cluster-wide", ns, sa)
		}
		return nil
	})
	for _, r := range []struct {
		verb, resource string
		allow          bool
	}{
		{"list", "pods", true}, {"watch", "pods", true}, {"list", "serviceaccounts", true}, {"watch", "serviceaccounts", true},
		{"get", "/openid/v1/jwks", true}, {"get", "/.well-known/openid-configuration", true},
		{"get", "pods", false}, {"list", "secrets", false}, {"update", "pods", false}, {"list", "nodes", false},
	} {
		if got := allowed(t, ns, sa, r.verb, r.resource); got != r.allow {
			t.Errorf("%s %s cluster-wide: allowed %v, want %v", r.verb, r.resource, got, r.allow)
		}
	}
	// The check can fail: another namespace's account of that name may not.
	if allowed(t, "default", sa, "list", "pods") {
		t.Fatal("the binding is not limited to the release's ServiceAccount")
	}

	ca := runChartCA(t, ns, sa)
	eventually(t, time.Minute, "local token verification", func(context.Context) error {
		if v, err := ca.metric("meshid_ca_token_verification_mode", `mode="local"`); err != nil || v != 1 {
			return fmt.Errorf("mode local = %v, %v", v, err)
		}
		return nil
	})
	eventually(t, time.Minute, "/readyz 200", func(context.Context) error {
		if code, body, err := ca.readyz(); err != nil || code != http.StatusOK {
			return fmt.Errorf("/readyz %d %q %v", code, body, err)
		}
		return nil
	})
	if v, err := ca.metric("meshid_ca_kube_apiserver_reachable", ""); err != nil || v != 1 {
		t.Errorf("meshid_ca_kube_apiserver_reachable = %v, %v", v, err)
	}
	c := cluster.Client()
	eventually(t, time.Minute, "what the running CA creates", func(ctx context.Context) error {
		for _, get := range []func() error{
			func() error { _, err := c.CoreV1().Secrets(ns).Get(ctx, "meshid-ca", metav1.GetOptions{}); return err },
			func() error {
				_, err := c.CoreV1().Secrets(ns).Get(ctx, "meshid-jwt-keys", metav1.GetOptions{})
				return err
			},
			func() error {
				_, err := c.CoordinationV1().Leases(ns).Get(ctx, "meshid-ca", metav1.GetOptions{})
				return err
			},
			func() error {
				_, err := c.CoordinationV1().Leases(ns).Get(ctx, "meshid-jwt-keys", metav1.GetOptions{})
				return err
			},
			func() error {
				_, err := c.CoreV1().ConfigMaps(app).Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
				return err
			},
		} {
			if err := get(); err != nil {
				return err
			}
		}
		return nil
	})
	// Stopped, the CA has flushed its (buffered) log.
	if err := ca.proc.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if log := ca.proc.Tail(1 << 20); strings.Contains(log, "forbidden") || !strings.Contains(log, "token verification: local") {
		t.Errorf("the CA, with the chart's RBAC, was refused a request or never verified locally:\n%s", log)
	}

	mustHelm(t, "uninstall", release, "--namespace", ns)
	assertGone(t, objs)
	left := []string{"Namespace/" + ns}
	secrets, err := c.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		left = append(left, "Secret/"+s.Name)
	}
	leases, err := c.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Items {
		left = append(left, "Lease/"+l.Name)
	}
	for _, n := range []string{ns, app} {
		cms, err := c.CoreV1().ConfigMaps(n).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cm := range cms.Items {
			if cm.Name != "kube-root-ca.crt" && !slices.Contains(left, "ConfigMap/"+cm.Name) { // kube-root-ca.crt: the cluster's
				left = append(left, "ConfigMap/"+cm.Name)
			}
		}
	}
	sort.Strings(left)
	listed := notesObjects(notes)
	// The operator's cacerts is listed ("if you created it"); this
	// install created none.
	want := slices.DeleteFunc(slices.Clone(listed), func(o string) bool { return o == "Secret/cacerts" })
	if !slices.Equal(left, want) {
		t.Errorf("left after uninstall %q,\nNOTES.txt lists %q (cacerts aside)", left, listed)
	}
	if readme := readmeObjects(t, ns); !slices.Equal(readme, listed) {
		t.Errorf("the chart README's uninstall table lists %q, NOTES.txt %q", readme, listed)
	}
	if nsObj, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil || nsObj.DeletionTimestamp != nil {
		t.Errorf("namespace %s after uninstall: %v", ns, err)
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Get(ctx, sa+"-local-verification", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the local-verification binding after uninstall: %v", err)
	}
}
