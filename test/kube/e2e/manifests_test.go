package e2e_test

import (
	"bytes"
	"cmp"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/meshid/meshid/test/kube/harness"
)

// manifest is one object of a YAML file under deploy/.
type manifest struct {
	file string // relative to deploy/
	obj  *unstructured.Unstructured
}

func (m manifest) String() string {
	s := m.file + ":" + m.obj.GetKind() + "/"
	if ns := m.obj.GetNamespace(); ns != "" {
		s += ns + "/"
	}
	return s + m.obj.GetName()
}

// notManifests are the directories under deploy/ that hold no plain
// manifests: the Helm chart's templates (test/kube/chart renders them) and
// the Prometheus rules and Grafana dashboard (test/observability).
var notManifests = []string{"charts", "observability"}

// loadManifests decodes every object of every *.yaml under deploy/, but
// notManifests.
func loadManifests(t *testing.T) []manifest {
	t.Helper()
	repo, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(repo, "deploy")
	var out []manifest
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && filepath.Dir(path) == root && slices.Contains(notManifests, d.Name()) {
			return fs.SkipDir
		}
		if err != nil || d.IsDir() || (!strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml")) {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			obj := map[string]any{}
			if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return err
			}
			if len(obj) == 0 {
				continue
			}
			out = append(out, manifest{file: rel, obj: &unstructured.Unstructured{Object: obj}})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("no manifests under %s", root)
	}
	// Namespaces first, as installed (deploy/namespace/, then deploy/):
	// deploy/namespace/ sorts after the files that need it.
	slices.SortStableFunc(out, func(a, b manifest) int {
		return cmp.Compare(nsRank(a), nsRank(b))
	})
	return out
}

func nsRank(m manifest) int {
	if m.obj.GetKind() == "Namespace" {
		return 0
	}
	return 1
}

// find returns the first manifest of kind with name in namespace ns.
func find(t *testing.T, ms []manifest, kind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	return findIn(t, ms, "", kind, ns, name)
}

// findIn is find in one file (relative to deploy/); "" is any file.
func findIn(t *testing.T, ms []manifest, file, kind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	for _, m := range ms {
		if (file == "" || m.file == file) && m.obj.GetKind() == kind && m.obj.GetNamespace() == ns && m.obj.GetName() == name {
			return m.obj
		}
	}
	t.Fatalf("deploy/%s has no %s %s/%s", file, kind, ns, name)
	return nil
}

// TestDeployDeleteKeepsNamespaces: `kubectl delete -f deploy/` (which,
// like apply, reads only the files directly in deploy/) deletes no
// Namespace: istio-system holds Istio's control plane and the operator's
// cacerts Secret. The namespace is in deploy/namespace/, applied once.
func TestDeployDeleteKeepsNamespaces(t *testing.T) {
	var namespaces int
	for _, m := range loadManifests(t) {
		if m.obj.GetKind() != "Namespace" {
			continue
		}
		namespaces++
		if !strings.Contains(m.file, string(filepath.Separator)) {
			t.Errorf("deploy/%s holds Namespace %s: kubectl delete -f deploy/ would delete it", m.file, m.obj.GetName())
		}
	}
	if namespaces == 0 {
		t.Error("no Namespace manifest under deploy/ (deploy/namespace/ creates istio-system)")
	}
}
