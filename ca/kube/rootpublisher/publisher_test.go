package rootpublisher_test

import (
	"context"
	"crypto/x509"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/meshid/meshid/ca/kube/internal/kubetest"
	"github.com/meshid/meshid/ca/kube/rootpublisher"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/testkit"
)

const name = rootpublisher.DefaultConfigMapName

type harness struct {
	t      *testing.T
	client *fake.Clientset
	pub    *rootpublisher.Publisher
	reg    *prometheus.Registry
}

func newHarness(t *testing.T, workers int, objs ...runtime.Object) *harness {
	t.Helper()
	h := &harness{t: t, client: fake.NewClientset(objs...), reg: prometheus.NewRegistry()}
	p, err := rootpublisher.New(rootpublisher.Config{Client: h.client, Workers: workers, Registerer: h.reg})
	if err != nil {
		t.Fatal(err)
	}
	h.pub = p
	return h
}

func (h *harness) run() { testkit.Run(h.t, "publisher", h.pub.Run) }

func (h *harness) configMap(ns string) *corev1.ConfigMap {
	cm, err := h.client.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return cm
}

// waitPublished waits until namespace ns holds the roots, labelled.
func (h *harness) waitPublished(ns string, roots ...*x509.Certificate) {
	h.t.Helper()
	want := string(certs.EncodeCertificates(roots...))
	kubetest.Eventually(h.t, "root ConfigMap in "+ns, func() bool {
		cm := h.configMap(ns)
		return cm != nil && cm.Data[rootpublisher.DefaultKey] == want &&
			cm.Labels[rootpublisher.ManagedByLabel] == rootpublisher.ManagedByValue
	})
}

func (h *harness) createNamespace(ns string) {
	h.t.Helper()
	if _, err := h.client.CoreV1().Namespaces().Create(context.Background(), namespace(ns), metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// writes counts create or update actions on ConfigMaps in ns.
func (h *harness) writes(ns string) int {
	n := 0
	for _, a := range h.client.Actions() {
		if (a.GetVerb() == "create" || a.GetVerb() == "update") && a.GetResource().Resource == "configmaps" && a.GetNamespace() == ns {
			n++
		}
	}
	return n
}

// published sums meshid_ca_root_configmap_writes_total over its labels.
func (h *harness) published() float64 {
	h.t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "meshid_ca_root_configmap_writes_total" {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func namespace(n string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}
}

func root(t *testing.T, org string) *x509.Certificate {
	_, c := kubetest.SelfSigned(t, org)
	return c
}

func TestPublishesToEveryNamespace(t *testing.T) {
	rootA := root(t, "A")
	h := newHarness(t, 0, namespace("default"), namespace("kube-system"), namespace("team-a"))
	h.pub.SetRoots([]*x509.Certificate{rootA})
	h.run()
	for _, ns := range []string{"default", "kube-system", "team-a"} {
		h.waitPublished(ns, rootA)
	}
	// A namespace created later gets it too.
	h.createNamespace("team-b")
	h.waitPublished("team-b", rootA)
}

func TestRootsSetAfterStart(t *testing.T) {
	rootA := root(t, "A")
	h := newHarness(t, 0, namespace("default"))
	h.run()
	h.createNamespace("late")
	h.pub.SetRoots([]*x509.Certificate{rootA})
	h.waitPublished("default", rootA)
	h.waitPublished("late", rootA)
}

func TestRepairs(t *testing.T) {
	rootA := root(t, "A")
	ctx := context.Background()
	tests := []struct {
		name    string
		breakIt func(t *testing.T, h *harness)
	}{
		{"data edited", func(t *testing.T, h *harness) {
			cm := h.configMap("app").DeepCopy()
			cm.Data[rootpublisher.DefaultKey] = "tampered"
			if _, err := h.client.CoreV1().ConfigMaps("app").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"key removed", func(t *testing.T, h *harness) {
			cm := h.configMap("app").DeepCopy()
			cm.Data = nil
			if _, err := h.client.CoreV1().ConfigMaps("app").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"label removed", func(t *testing.T, h *harness) {
			cm := h.configMap("app").DeepCopy()
			cm.Labels = nil
			if _, err := h.client.CoreV1().ConfigMaps("app").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"deleted", func(t *testing.T, h *harness) {
			if err := h.client.CoreV1().ConfigMaps("app").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 0, namespace("app"))
			h.pub.SetRoots([]*x509.Certificate{rootA})
			h.run()
			h.waitPublished("app", rootA)
			// The metric is bumped after the API call returns: wait for it.
			kubetest.Eventually(t, "the create counted", func() bool { return h.published() == 1 })
			tc.breakIt(t, h)
			h.waitPublished("app", rootA)
			kubetest.Eventually(t, "the repair counted", func() bool { return h.published() == 2 })
		})
	}
}

func TestUpdatesOnRootChange(t *testing.T) {
	rootA, rootB := root(t, "A"), root(t, "B")
	h := newHarness(t, 0, namespace("one"), namespace("two"))
	h.pub.SetRoots([]*x509.Certificate{rootA})
	h.run()
	h.waitPublished("one", rootA)
	h.waitPublished("two", rootA)
	// Rotation: publish both roots, then only the new one.
	h.pub.SetRoots([]*x509.Certificate{rootA, rootB})
	h.waitPublished("one", rootA, rootB)
	h.waitPublished("two", rootA, rootB)
	h.pub.SetRoots([]*x509.Certificate{rootB})
	h.waitPublished("one", rootB)
	h.waitPublished("two", rootB)
}

func TestWritesOnlyWhenContentDiffers(t *testing.T) {
	rootA := root(t, "A")
	current := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ok",
			Labels: map[string]string{rootpublisher.ManagedByLabel: rootpublisher.ManagedByValue, "team": "x"}},
		Data: map[string]string{rootpublisher.DefaultKey: string(certs.EncodeCertificates(rootA)), "extra": "kept"},
	}
	terminating := namespace("dying")
	terminating.Status.Phase = corev1.NamespaceTerminating
	// One worker: the queue is FIFO, so the namespaces that exist at start
	// are reconciled before "later", which is created afterwards.
	h := newHarness(t, 1, namespace("ok"), terminating, current)
	h.pub.SetRoots([]*x509.Certificate{rootA})
	h.run()
	// Create "later" once the namespace informer has listed the others, so
	// that it is queued after them.
	kubetest.Eventually(t, "namespace watch", func() bool {
		for _, a := range h.client.Actions() {
			if a.GetVerb() == "watch" && a.GetResource().Resource == "namespaces" {
				return true
			}
		}
		return false
	})
	h.createNamespace("later")
	h.waitPublished("later", rootA)
	if n := h.writes("ok"); n != 0 {
		t.Errorf("%d writes to an up-to-date ConfigMap, want 0", n)
	}
	if n := h.writes("dying"); n != 0 {
		t.Errorf("%d writes into a terminating namespace, want 0", n)
	}
	// An edit elsewhere in the ConfigMap keeps the other keys on repair.
	cm := h.configMap("ok").DeepCopy()
	cm.Data[rootpublisher.DefaultKey] = "tampered"
	if _, err := h.client.CoreV1().ConfigMaps("ok").Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitPublished("ok", rootA)
	if got := h.configMap("ok"); got.Data["extra"] != "kept" || got.Labels["team"] != "x" {
		t.Errorf("repair dropped foreign keys or labels: %v %v", got.Data, got.Labels)
	}
}

func TestRunAgainAfterLosingLeadership(t *testing.T) {
	rootA, rootB := root(t, "A"), root(t, "B")
	h := newHarness(t, 0, namespace("app"))
	h.pub.SetRoots([]*x509.Certificate{rootA})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.pub.Run(ctx) }()
	h.waitPublished("app", rootA)
	cancel() // leadership lost
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	h.pub.SetRoots([]*x509.Certificate{rootB}) // while not leading: remembered
	h.run()                                    // leading again
	h.waitPublished("app", rootB)
}

func TestNewValidates(t *testing.T) {
	if _, err := rootpublisher.New(rootpublisher.Config{}); err == nil {
		t.Fatal("New accepted a Config without Client")
	}
}
