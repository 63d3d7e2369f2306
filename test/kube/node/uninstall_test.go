package node_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// notesItemRE is one object of the NOTES' list of what uninstall leaves:
// "  - Kind name: what".
var notesItemRE = regexp.MustCompile(`(?m)^\s+- (\w+) (\S+): (.*)$`)

// TestChartUninstallOnNode: `helm uninstall` of the release the suite
// installed, once every other test is done (it runs in the parallel
// phase, after the pod certificate test's refresh), leaves exactly what
// the chart's NOTES list: every object of the cluster in the release's
// namespace, or written by helm or by the CA (its field managers), is
// named there, and everything named there is left, but for what exists
// only "if you created it". Objects every namespace gets (its default
// ServiceAccount, kube-root-ca.crt), events, and the kubelet's
// PodCertificateRequests, which the CA answered, are not the chart's.
// Then the leftovers are deleted as the NOTES say, and nothing of meshid
// is left.
func TestChartUninstallOnNode(t *testing.T) {
	need(t)
	installMeshid(t)
	t.Parallel()
	podCertRefreshes.Wait()
	ctx := context.Background()
	managers := fieldManagers(t)
	helm(t, "uninstall", release, "--namespace", caNS, "--wait")
	meshidInstalled = false

	listed := map[string]bool{} // "Kind name" from the NOTES
	optional := map[string]bool{}
	for _, m := range notesItemRE.FindAllStringSubmatch(installNotes, -1) {
		listed[m[1]+" "+m[2]] = true
		if strings.Contains(m[3], "if you created it") {
			optional[m[1]+" "+m[2]] = true
		}
	}
	if len(listed) == 0 {
		t.Fatalf("the NOTES list nothing that stays:\n%s", installNotes)
	}
	// The garbage collector removes the pods, ReplicaSet and endpoints
	// after helm returns: wait for nothing unlisted to be left.
	var left []object
	var extra []string
	found := map[string]bool{}
	_ = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		left, extra, found = leftovers(t, managers), nil, map[string]bool{}
		for _, o := range left {
			found[o.kind+" "+o.name] = true
			if !listed[o.kind+" "+o.name] {
				extra = append(extra, o.String())
			}
		}
		return len(extra) == 0, nil
	})
	if len(extra) > 0 {
		t.Errorf("uninstall left objects the NOTES do not list: %v\nNOTES:\n%s", extra, installNotes)
	}
	for item := range listed {
		if !found[item] && !optional[item] {
			t.Errorf("the NOTES say %s stays, but uninstall left none", item)
		}
	}
	t.Logf("left by uninstall, as the NOTES list: %v", left)

	// The NOTES' commands to remove meshid completely.
	for _, o := range left {
		if o.kind == "Namespace" {
			continue
		}
		if err := o.client.Namespace(o.namespace).Delete(ctx, o.name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting %s: %v", o, err)
		}
	}
	if after := leftovers(t, managers); len(after) != 1 || after[0].kind != "Namespace" {
		t.Errorf("after the NOTES' commands, left: %v", after)
	}
}

// fieldManagers are the names under which helm and the CA write objects:
// "helm", and the managers of the root ConfigMap the CA publishes.
func fieldManagers(t *testing.T) []string {
	t.Helper()
	cm, err := cluster.Client().CoreV1().ConfigMaps(caNS).Get(context.Background(), "istio-ca-root-cert", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	managers := []string{"helm"}
	for _, f := range cm.ManagedFields {
		managers = append(managers, f.Manager)
	}
	return managers
}

// object is one object of the cluster.
type object struct {
	kind, namespace, name string
	client                dynamic.NamespaceableResourceInterface
}

func (o object) String() string {
	if o.namespace == "" {
		return o.kind + " " + o.name
	}
	return o.kind + " " + o.namespace + "/" + o.name
}

// leftovers lists every object of every listable resource that is in the
// release's namespace (or is it), or that one of managers wrote, but for
// events, what every namespace gets, and PodCertificateRequests.
func leftovers(t *testing.T, managers []string) []object {
	t.Helper()
	ctx := context.Background()
	cfg := cluster.AdminConfig()
	cfg.WarningHandler = rest.NoWarnings{} // listing deprecated kinds (Endpoints, ComponentStatus) warns
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lists, err := disc.ServerPreferredResources()
	if err != nil {
		t.Fatal(err)
	}
	var out []object
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") || r.Kind == "Event" || r.Kind == "PodCertificateRequest" {
				continue
			}
			client := dyn.Resource(gv.WithResource(r.Name))
			items, err := client.List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatalf("listing %s: %v", r.Name, err)
			}
			for _, it := range items.Items {
				o := object{kind: r.Kind, namespace: it.GetNamespace(), name: it.GetName(), client: client}
				ours := o.namespace == caNS || (o.kind == "Namespace" && o.name == caNS)
				for _, f := range it.GetManagedFields() {
					ours = ours || slices.Contains(managers, f.Manager)
				}
				switch {
				case !ours:
				case o.kind == "ServiceAccount" && o.name == "default", o.kind == "ConfigMap" && o.name == "kube-root-ca.crt":
				default:
					out = append(out, o)
				}
			}
		}
	}
	return out
}
