package chart_test

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/meshid/meshid/test/kube/harness"
)

// helm runs the real helm CLI with args against the harness's API server
// (its admin kubeconfig), its state kept in a temporary HELM_*_HOME.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBin, args...)
	cmd.Env = []string{
		"HOME=" + helmHome,
		"PATH=/usr/bin:/bin",
		"HELM_CACHE_HOME=" + filepath.Join(helmHome, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(helmHome, "config"),
		"HELM_DATA_HOME=" + filepath.Join(helmHome, "data"),
	}
	if cluster != nil {
		cmd.Env = append(cmd.Env, "KUBECONFIG="+cluster.AdminKubeconfig())
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// mustHelm is helm that fails the test on an error.
func mustHelm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// rendered is what `helm template` produced, by kind/namespace/name.
type rendered map[string]*unstructured.Unstructured

func key(kind, ns, name string) string { return kind + "/" + ns + "/" + name }

// render runs helm template for release in namespace ns with values set
// (helm --set syntax) and decodes every object.
func render(t *testing.T, release, ns string, set ...string) rendered {
	t.Helper()
	out, err := renderErr(t, release, ns, set...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func renderErr(t *testing.T, release, ns string, set ...string) (rendered, error) {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", ns}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		return nil, errors.New(out)
	}
	return decode(t, out), nil
}

func decode(t *testing.T, manifest string) rendered {
	t.Helper()
	objs := rendered{}
	us, err := harness.DecodeManifests([]byte(manifest))
	if err != nil {
		t.Fatalf("decode rendered manifest: %v\n%s", err, manifest)
	}
	for _, u := range us {
		k := key(u.GetKind(), u.GetNamespace(), u.GetName())
		if objs[k] != nil {
			t.Fatalf("%s rendered twice", k)
		}
		objs[k] = u
	}
	return objs
}

// get returns the rendered object, failing the test when it is missing.
func (r rendered) get(t *testing.T, kind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	o := r[key(kind, ns, name)]
	if o == nil {
		t.Fatalf("no %s %s/%s rendered; have %v", kind, ns, name, r.keys())
	}
	return o
}

func (r rendered) keys() []string {
	var out []string
	for k := range r {
		out = append(out, k)
	}
	return out
}
