package rootpublisher_test

import (
	"context"
	"crypto/x509"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/meshid/meshid/ca/kube/internal/kubetest"
	"github.com/meshid/meshid/ca/kube/rootpublisher"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
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
	return newHarnessWith(t, func(c *rootpublisher.Config) { c.Workers = workers }, objs...)
}

func newHarnessWith(t *testing.T, modify func(*rootpublisher.Config), objs ...runtime.Object) *harness {
	t.Helper()
	h := &harness{t: t, client: fake.NewClientset(objs...), reg: prometheus.NewRegistry()}
	cfg := rootpublisher.Config{Client: h.client, Registerer: h.reg}
	modify(&cfg)
	p, err := rootpublisher.New(cfg)
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
	h := newHarness(t, 0, namespace("default"), namespace("kube-system"), namespace("kube-public"), namespace("kube-node-lease"), namespace("team-a"))
	h.pub.SetRoots([]*x509.Certificate{rootA})
	h.run()
	for _, ns := range []string{"default", "team-a"} {
		h.waitPublished(ns, rootA)
	}
	// A namespace created later gets it too.
	h.createNamespace("team-b")
	h.waitPublished("team-b", rootA)
	// Kubernetes' own namespaces are left out by default (every namespace
	// was queued before team-b, so they have been reconciled by now).
	for _, ns := range []string{"kube-system", "kube-public", "kube-node-lease"} {
		if h.configMap(ns) != nil || h.writes(ns) != 0 {
			t.Errorf("published to %s, which the default selector leaves out", ns)
		}
	}
}

func TestNamespaceSelector(t *testing.T) {
	rootA := root(t, "A")
	meshed := namespace("meshed")
	meshed.Labels = map[string]string{"istio-injection": "enabled"}
	t.Run("everything", func(t *testing.T) {
		h := newHarnessWith(t, func(c *rootpublisher.Config) { c.Namespaces = labels.Everything() },
			namespace("kube-system"), namespace("app"))
		h.pub.SetRoots([]*x509.Certificate{rootA})
		h.run()
		h.waitPublished("kube-system", rootA)
		h.waitPublished("app", rootA)
	})
	// byLabel runs a publisher for meshed namespaces, with one worker
	// (FIFO: "meshed" is reconciled after "plain"), once it has published
	// to "meshed".
	byLabel := func(t *testing.T) *harness {
		sel, err := labels.Parse("istio-injection=enabled")
		if err != nil {
			t.Fatal(err)
		}
		h := newHarnessWith(t, func(c *rootpublisher.Config) { c.Namespaces = sel; c.Workers = 1 },
			namespace("plain"), meshed.DeepCopy())
		h.pub.SetRoots([]*x509.Certificate{rootA})
		h.run()
		h.waitPublished("meshed", rootA)
		return h
	}
	t.Run("by label", func(t *testing.T) {
		h := byLabel(t)
		// A namespace labelled later is published to.
		ns, err := h.client.CoreV1().Namespaces().Get(context.Background(), "plain", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ns.Labels = map[string]string{"istio-injection": "enabled"}
		if _, err := h.client.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		h.waitPublished("plain", rootA)
	})
	t.Run("deselected", func(t *testing.T) {
		h := byLabel(t)
		if h.configMap("plain") != nil {
			t.Error("published to a namespace the selector leaves out")
		}
	})
}

// failingClient makes ConfigMap writes in namespace ns fail with Forbidden
// (the CA's RBAC broken) while broken is set.
func failingClient(h *harness, ns string, broken *atomic.Bool) {
	h.client.PrependReactor("*", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if (a.GetVerb() == "create" || a.GetVerb() == "update") && a.GetNamespace() == ns && broken.Load() {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "istio-ca-root-cert", errors.New("RBAC: access denied"))
		}
		return false, nil, nil
	})
}

// touch updates namespace ns, which makes the Publisher reconcile it now
// rather than after its retry backoff.
func (h *harness) touch(ns string) {
	h.t.Helper()
	obj, err := h.client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	obj = obj.DeepCopy()
	if obj.Annotations == nil {
		obj.Annotations = map[string]string{}
	}
	obj.Annotations["touched"] += "x"
	if _, err := h.client.CoreV1().Namespaces().Update(context.Background(), obj, metav1.UpdateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// A namespace the Publisher cannot write to makes it not ready once the
// failure outlasts the grace period, shows in a gauge, and is logged with
// the namespace and the reason at most once per log interval; a repair
// clears all three.
func TestFailuresReportedAndRateLimited(t *testing.T) {
	rootA := root(t, "A")
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	logs := testkit.NewLogRecorder()
	var broken atomic.Bool
	broken.Store(true)
	h := newHarnessWith(t, func(c *rootpublisher.Config) {
		c.Clock, c.Logger = clk, logs.Logger()
		c.FailureGrace, c.LogInterval = 30*time.Second, time.Minute
	}, namespace("ok"), namespace("locked"))
	failingClient(h, "locked", &broken)
	h.pub.SetRoots([]*x509.Certificate{rootA})
	h.run()
	h.waitPublished("ok", rootA)
	// The queue retries with backoff; let it fail a few times.
	kubetest.Eventually(t, "retries", func() bool {
		return testkit.Metric(t, h.reg, "meshid_ca_root_configmap_errors_total") >= 3
	})
	if got := testkit.Metric(t, h.reg, "meshid_ca_root_configmap_failing_namespaces"); got != 1 {
		t.Errorf("failing namespaces gauge %v, want 1", got)
	}
	if n := logs.CountContaining("namespace=locked"); n != 1 {
		t.Errorf("%d failure logs within one log interval, want 1:\n%s", n, logs.All())
	}
	if !strings.Contains(logs.All(), "RBAC: access denied") {
		t.Errorf("the log does not say why:\n%s", logs.All())
	}
	// Within the grace period a failure (a stale cache's conflict) is not
	// worth taking the replica out of service.
	if err := h.pub.Ready(); err != nil {
		t.Errorf("not ready within the grace period: %v", err)
	}
	clk.Add(30 * time.Second)
	err := h.pub.Ready()
	if !errors.Is(err, rootpublisher.ErrNotPublished) || !strings.Contains(err.Error(), "locked") {
		t.Errorf("Ready after the grace period: %v, want ErrNotPublished naming locked", err)
	}
	// After the log interval, the next failure is logged again.
	clk.Add(time.Minute)
	h.touch("locked")
	logs.WaitForContaining(t, "namespace=locked", 2)

	broken.Store(false) // RBAC fixed
	h.touch("locked")
	h.waitPublished("locked", rootA)
	kubetest.Eventually(t, "recovery", func() bool {
		return h.pub.Ready() == nil && testkit.Metric(t, h.reg, "meshid_ca_root_configmap_failing_namespaces") == 0
	})
}

// A failure is the publishing replica's own: once its Run ends (leadership
// lost), it no longer reports it.
func TestFailuresForgottenWhenRunEnds(t *testing.T) {
	rootA := root(t, "A")
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var broken atomic.Bool
	broken.Store(true)
	h := newHarnessWith(t, func(c *rootpublisher.Config) { c.Clock = clk }, namespace("locked"))
	failingClient(h, "locked", &broken)
	h.pub.SetRoots([]*x509.Certificate{rootA})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.pub.Run(ctx) }()
	kubetest.Eventually(t, "a failure", func() bool {
		return testkit.Metric(t, h.reg, "meshid_ca_root_configmap_failing_namespaces") == 1
	})
	clk.Add(time.Hour)
	if h.pub.Ready() == nil {
		t.Fatal("ready while failing")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := h.pub.Ready(); err != nil {
		t.Errorf("a stopped Publisher reports %v", err)
	}
	if got := testkit.Metric(t, h.reg, "meshid_ca_root_configmap_failing_namespaces"); got != 0 {
		t.Errorf("failing namespaces gauge %v after Run ended, want 0", got)
	}
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
