package secretstore_test

import (
	"context"
	"crypto/x509"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kube/internal/kubetest"
	"github.com/meshid/meshid/ca/kube/secretstore"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/testkit"
)

const ns = "istio-system"

// harness runs a Store against a fake clientset and records the bundles
// its subscriber sees.
type harness struct {
	t      *testing.T
	client *fake.Clientset
	store  *secretstore.Store
	reg    *prometheus.Registry

	mu   sync.Mutex
	seen []*x509.Certificate // Cert of each bundle delivered to the subscriber
}

func newHarness(t *testing.T, objs ...runtime.Object) *harness {
	t.Helper()
	h := &harness{t: t, client: fake.NewClientset(objs...), reg: prometheus.NewRegistry()}
	s, err := secretstore.New(secretstore.Config{
		Client: h.client, Namespace: ns, TrustDomain: "cluster.local", Registerer: h.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.store = s
	s.Subscribe(func(b *keystore.Bundle) {
		h.mu.Lock()
		h.seen = append(h.seen, b.Cert)
		h.mu.Unlock()
	})
	return h
}

// run starts fn(ctx) in the background until the test ends.
func (h *harness) run(fn func(context.Context) error) { testkit.Run(h.t, "store", fn) }

func (h *harness) seenCerts() []*x509.Certificate {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*x509.Certificate(nil), h.seen...)
}

func (h *harness) waitFor(cert *x509.Certificate, source string) {
	h.t.Helper()
	kubetest.Eventually(h.t, "bundle "+cert.Subject.String()+" from "+source, func() bool {
		b := h.store.Bundle()
		seen := h.seenCerts()
		return b != nil && b.Cert.Equal(cert) && h.store.Source() == source &&
			len(seen) > 0 && seen[len(seen)-1].Equal(cert)
	})
}

func (h *harness) loads(secret, result string) float64 {
	return h.metric("meshid_ca_secret_loads_total", map[string]string{"secret": secret, "result": result})
}

// metric returns the value of the counter name whose labels include want.
func (h *harness) metric(name string, want map[string]string) float64 {
	h.t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func (h *harness) put(name string, data map[string][]byte) {
	h.t.Helper()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data}
	secrets := h.client.CoreV1().Secrets(ns)
	_, err := secrets.Update(context.Background(), sec, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		_, err = secrets.Create(context.Background(), sec, metav1.CreateOptions{})
	}
	if err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) remove(name string) {
	h.t.Helper()
	if err := h.client.CoreV1().Secrets(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

func secret(name string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data}
}

func creates(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == "create" && a.GetResource().Resource == "secrets" {
			n++
		}
	}
	return n
}

func TestBootstrapCreatesTheRootSecret(t *testing.T) {
	h := newHarness(t)
	if err := h.store.Ready(); !errors.Is(err, secretstore.ErrNotLoaded) {
		t.Fatalf("Ready before load = %v, want ErrNotLoaded", err)
	}
	h.run(h.store.Run)
	h.run(h.store.Bootstrap)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := h.store.WaitForBundle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.store.Ready(); err != nil {
		t.Fatalf("Ready after load = %v", err)
	}
	sec, err := h.client.CoreV1().Secrets(ns).Get(ctx, secretstore.DefaultSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sec.Type != secretstore.SecretType {
		t.Errorf("Secret type = %q, want %q", sec.Type, secretstore.SecretType)
	}
	if got := sec.Labels[secretstore.ManagedByLabel]; got != secretstore.ManagedByValue {
		t.Errorf("managed-by label = %q", got)
	}
	for _, k := range []string{keystore.CACertFile, keystore.CAKeyFile, keystore.CertChainFile, keystore.RootCertFile} {
		if len(sec.Data[k]) == 0 {
			t.Errorf("Secret has no %s", k)
		}
	}
	loaded, err := keystore.LoadFiles(sec.Data, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Cert.Equal(b.Cert) || !b.Cert.Equal(b.Roots[0]) {
		t.Errorf("the store's bundle is not the self-signed root in the Secret")
	}
	if got := b.Cert.Subject.Organization; len(got) != 1 || got[0] != "cluster.local" {
		t.Errorf("root O = %v, want [cluster.local]", got)
	}
	// A second ensure (another leader term) finds it and creates nothing.
	if err := h.store.EnsureRoot(ctx); err != nil {
		t.Fatal(err)
	}
	if n := creates(h.client); n != 1 {
		t.Errorf("%d Secret creates, want 1", n)
	}
	if n := h.metric("meshid_ca_secret_creations_total", nil); n != 1 {
		t.Errorf("meshid_ca_secret_creations_total = %v, want 1", n)
	}
}

func TestWithoutBootstrapNothingIsCreated(t *testing.T) {
	// A follower only runs Run: it waits for the leader's Secret.
	h := newHarness(t)
	h.run(h.store.Run)
	files, root := kubetest.SelfSigned(t, "leader")
	// Wait until the follower has synced and seen that no Secret exists:
	// it logs and stays not ready, and has created nothing.
	kubetest.Eventually(t, "informers listing", func() bool {
		n := 0
		for _, a := range h.client.Actions() {
			if a.GetVerb() == "watch" && a.GetResource().Resource == "secrets" {
				n++
			}
		}
		return n == 2
	})
	if err := h.store.Ready(); err == nil {
		t.Fatal("ready without any Secret")
	}
	h.put(secretstore.DefaultSecretName, files) // what the leader does
	h.waitFor(root, secretstore.DefaultSecretName)
	if n := creates(h.client); n != 1 {
		t.Errorf("%d Secret creates, want only the leader's 1", n)
	}
}

func TestEnsureRootLosesTheCreateRace(t *testing.T) {
	h := newHarness(t)
	files, root := kubetest.SelfSigned(t, "winner")
	// Another replica creates the Secret between our Get and our Create.
	h.client.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if err := h.client.Tracker().Add(secret(secretstore.DefaultSecretName, files)); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewAlreadyExists(a.GetResource().GroupResource(), secretstore.DefaultSecretName)
	})
	if err := h.store.EnsureRoot(context.Background()); err != nil {
		t.Fatalf("EnsureRoot after losing the race: %v", err)
	}
	h.run(h.store.Run)
	h.waitFor(root, secretstore.DefaultSecretName)
}

func TestSecretChangesArePickedUp(t *testing.T) {
	filesA, rootA := kubetest.SelfSigned(t, "A")
	filesB, rootB := kubetest.SelfSigned(t, "B")
	h := newHarness(t, secret(secretstore.DefaultSecretName, filesA))
	h.run(h.store.Run)
	h.waitFor(rootA, secretstore.DefaultSecretName)

	h.put(secretstore.DefaultSecretName, filesB) // an operator rotates the root
	h.waitFor(rootB, secretstore.DefaultSecretName)
	seen := h.seenCerts()
	if len(seen) != 2 || !seen[0].Equal(rootA) || !seen[1].Equal(rootB) {
		t.Errorf("subscriber saw %d bundles, want A then B", len(seen))
	}
	// A late subscriber gets the current bundle at once.
	var late *x509.Certificate
	cancel := h.store.Subscribe(func(b *keystore.Bundle) { late = b.Cert })
	cancel()
	if late == nil || !late.Equal(rootB) {
		t.Errorf("late subscriber did not get the current bundle")
	}
}

func TestInvalidContentIsIgnored(t *testing.T) {
	filesA, rootA := kubetest.SelfSigned(t, "A")
	_, rootB := kubetest.SelfSigned(t, "B")
	filesB, _ := kubetest.SelfSigned(t, "B")
	tests := []struct {
		name string
		data map[string][]byte
	}{
		{"garbage", map[string][]byte{keystore.CACertFile: []byte("not a cert"), keystore.CAKeyFile: []byte("x")}},
		{"no key", without(filesB, keystore.CAKeyFile)},
		{"key of another CA", mix(filesB, keystore.CAKeyFile, filesA)},
		{"empty", map[string][]byte{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, secret(secretstore.DefaultSecretName, filesA))
			h.run(h.store.Run)
			h.waitFor(rootA, secretstore.DefaultSecretName)
			h.put(secretstore.DefaultSecretName, tc.data)
			kubetest.Eventually(t, "invalid content counted", func() bool {
				return h.loads(secretstore.DefaultSecretName, "invalid") == 1
			})
			if b := h.store.Bundle(); !b.Cert.Equal(rootA) || b.Cert.Equal(rootB) {
				t.Fatal("the invalid Secret replaced the last good bundle")
			}
			if n := len(h.seenCerts()); n != 1 {
				t.Errorf("subscriber called %d times, want 1", n)
			}
			if err := h.store.Ready(); err != nil {
				t.Errorf("not ready after invalid update: %v", err)
			}
		})
	}
}

func TestPluggedSecretTakesPrecedence(t *testing.T) {
	selfFiles, selfRoot := kubetest.SelfSigned(t, "self")
	plugFiles, plugCA, plugRoot := testkit.Plugged(t, "plugged")
	plug2Files, plug2CA, _ := testkit.Plugged(t, "plugged-2")

	// Both exist at start: cacerts wins, and the self-signed one is never
	// served in between.
	h := newHarness(t, secret(secretstore.DefaultSecretName, selfFiles), secret(secretstore.DefaultPluggedSecretName, plugFiles))
	h.run(h.store.Run)
	h.waitFor(plugCA, secretstore.DefaultPluggedSecretName)
	if seen := h.seenCerts(); len(seen) != 1 {
		t.Fatalf("subscriber saw %d bundles at start, want only cacerts", len(seen))
	}
	if b := h.store.Bundle(); len(b.Roots) != 1 || !b.Roots[0].Equal(plugRoot) {
		t.Errorf("roots are not the plugged root")
	}

	steps := []struct {
		name   string
		do     func()
		cert   *x509.Certificate
		source string
	}{
		{"cacerts deleted: fall back to meshid-ca", func() { h.remove(secretstore.DefaultPluggedSecretName) },
			selfRoot, secretstore.DefaultSecretName},
		{"cacerts appears: switch to it", func() { h.put(secretstore.DefaultPluggedSecretName, plugFiles) },
			plugCA, secretstore.DefaultPluggedSecretName},
		{"meshid-ca changes: cacerts still wins", func() { h.remove(secretstore.DefaultSecretName) },
			plugCA, secretstore.DefaultPluggedSecretName},
		{"cacerts rotated", func() { h.put(secretstore.DefaultPluggedSecretName, plug2Files) },
			plug2CA, secretstore.DefaultPluggedSecretName},
		{"cacerts invalid: keep the last good", func() {
			h.put(secretstore.DefaultPluggedSecretName, without(plug2Files, keystore.CAKeyFile))
			kubetest.Eventually(t, "invalid cacerts counted", func() bool {
				return h.loads(secretstore.DefaultPluggedSecretName, "invalid") == 1
			})
		}, plug2CA, secretstore.DefaultPluggedSecretName},
	}
	for _, st := range steps {
		st.do()
		h.waitFor(st.cert, st.source)
	}
}

func TestInvalidPluggedSecretIsNotReplacedBySelfSigned(t *testing.T) {
	// An operator's broken cacerts must not silently fall back to another CA.
	selfFiles, _ := kubetest.SelfSigned(t, "self")
	plugFiles, plugCA, _ := testkit.Plugged(t, "plugged")
	h := newHarness(t, secret(secretstore.DefaultSecretName, selfFiles),
		secret(secretstore.DefaultPluggedSecretName, without(plugFiles, keystore.CAKeyFile)))
	h.run(h.store.Run)
	kubetest.Eventually(t, "invalid cacerts counted", func() bool {
		return h.loads(secretstore.DefaultPluggedSecretName, "invalid") == 1
	})
	if err := h.store.Ready(); err == nil {
		t.Fatalf("ready with bundle from %q although cacerts is invalid", h.store.Source())
	}
	h.put(secretstore.DefaultPluggedSecretName, plugFiles) // the operator fixes it
	h.waitFor(plugCA, secretstore.DefaultPluggedSecretName)
}

func TestBootstrapRecreatesWhenBothAreGone(t *testing.T) {
	h := newHarness(t)
	h.run(h.store.Run)
	h.run(h.store.Bootstrap)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first, err := h.store.WaitForBundle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.remove(secretstore.DefaultSecretName)
	kubetest.Eventually(t, "a new root", func() bool {
		b := h.store.Bundle()
		return !b.Cert.Equal(first.Cert)
	})
	if n := creates(h.client); n != 2 {
		t.Errorf("%d Secret creates, want 2", n)
	}
}

func TestBootstrapDoesNotCreateWhenPluggedExists(t *testing.T) {
	plugFiles, plugCA, _ := testkit.Plugged(t, "plugged")
	h := newHarness(t, secret(secretstore.DefaultPluggedSecretName, plugFiles))
	if err := h.store.EnsureRoot(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := creates(h.client); n != 0 {
		t.Errorf("%d Secret creates with cacerts present, want 0", n)
	}
	h.run(h.store.Run)
	h.waitFor(plugCA, secretstore.DefaultPluggedSecretName)
}

func TestNewValidates(t *testing.T) {
	c := fake.NewClientset()
	tests := []struct {
		name string
		cfg  secretstore.Config
	}{
		{"no client", secretstore.Config{Namespace: ns, TrustDomain: "td"}},
		{"no namespace", secretstore.Config{Client: c, TrustDomain: "td"}},
		{"no trust domain", secretstore.Config{Client: c, Namespace: ns}},
		{"same names", secretstore.Config{Client: c, Namespace: ns, TrustDomain: "td", SecretName: "x", PluggedSecretName: "x"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := secretstore.New(tc.cfg); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
}

func without(files map[string][]byte, key string) map[string][]byte {
	out := map[string][]byte{}
	for k, v := range files {
		if k != key {
			out[k] = v
		}
	}
	return out
}

func mix(files map[string][]byte, key string, from map[string][]byte) map[string][]byte {
	out := without(files, key)
	out[key] = from[key]
	return out
}
