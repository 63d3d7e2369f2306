package kube_test

import (
	"context"
	"crypto/x509"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kube"
	"github.com/meshid/meshid/ca/kube/election"
	"github.com/meshid/meshid/ca/kube/internal/kubetest"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

const caNS = "istio-system"

// The Authority is what `meshid server` binds.
var _ kube.BundleSetter = (*ca.Authority)(nil)

// setter is a BundleSetter that records what it accepted.
type setter struct {
	mu     sync.Mutex
	got    []*x509.Certificate
	reject bool
}

func (s *setter) SetBundle(b *keystore.Bundle) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reject {
		return errors.New("rejected")
	}
	s.got = append(s.got, b.Cert)
	return nil
}

func (s *setter) last() *x509.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.got) == 0 {
		return nil
	}
	return s.got[len(s.got)-1]
}

// fast is replica id's candidacy with an election quick enough for tests.
func fast(id string) election.Candidate {
	return election.Candidate{Identity: id, LeaseDuration: time.Second, RenewDeadline: 500 * time.Millisecond, RetryPeriod: 100 * time.Millisecond}
}

func newController(t *testing.T, client *fake.Clientset, id string) *kube.Controller {
	t.Helper()
	c, err := kube.New(kube.Config{
		Client:      client,
		Namespace:   caNS,
		Candidate:   fast(id),
		TrustDomain: "cluster.local",
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "controller", c.Run)
	return c
}

func namespace(n string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}
}

func count(client *fake.Clientset, verb, resource string) int {
	n := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == resource {
			n++
		}
	}
	return n
}

func rootConfigMap(client *fake.Clientset, ns string) string {
	cm, err := client.CoreV1().ConfigMaps(ns).Get(context.Background(), "istio-ca-root-cert", metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return cm.Data["root-cert.pem"]
}

func TestReplicasShareOneRootAndPublishIt(t *testing.T) {
	client := fake.NewClientset(namespace(caNS), namespace("default"), namespace("app"))
	ctrls := []*kube.Controller{newController(t, client, "ca-0"), newController(t, client, "ca-1")}
	setters := []*setter{{}, {}}
	for i, c := range ctrls {
		c.Bind(setters[i])
	}
	kubetest.Eventually(t, "both replicas ready", func() bool {
		return ctrls[0].Ready() == nil && ctrls[1].Ready() == nil
	})
	root := ctrls[0].Bundle().Roots[0]
	if !ctrls[1].Bundle().Roots[0].Equal(root) {
		t.Fatal("the replicas loaded different roots")
	}
	if n := count(client, "create", "secrets"); n != 1 {
		t.Errorf("%d Secret creates, want 1 (by the leader)", n)
	}
	if ctrls[0].IsLeader() == ctrls[1].IsLeader() {
		t.Errorf("leaders: ca-0 %v, ca-1 %v; want exactly one", ctrls[0].IsLeader(), ctrls[1].IsLeader())
	}
	want := string(certs.EncodeCertificates(root))
	for _, ns := range []string{caNS, "default", "app"} {
		kubetest.Eventually(t, "root ConfigMap in "+ns, func() bool { return rootConfigMap(client, ns) == want })
	}

	// An operator plugs in a CA: every replica switches without restart,
	// the Authority gets it, and the ConfigMaps follow.
	files, plugCA, plugRoot := testkit.Plugged(t, "operator")
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "cacerts", Namespace: caNS}, Data: files}
	if _, err := client.CoreV1().Secrets(caNS).Create(context.Background(), sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, c := range ctrls {
		kubetest.Eventually(t, "replica switched to cacerts", func() bool {
			return c.Source() == "cacerts" && setters[i].last() != nil && setters[i].last().Equal(plugCA)
		})
	}
	want = string(certs.EncodeCertificates(plugRoot))
	for _, ns := range []string{caNS, "default", "app"} {
		kubetest.Eventually(t, "plugged root in "+ns, func() bool { return rootConfigMap(client, ns) == want })
	}
}

func TestFollowerWaitsForTheLeader(t *testing.T) {
	// Another replica holds the Lease for an hour.
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "meshid-ca", Namespace: caNS},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To("ca-other"),
			LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime:          &metav1.MicroTime{Time: time.Now()},
			RenewTime:            &metav1.MicroTime{Time: time.Now()},
		},
	}
	client := fake.NewClientset(lease, namespace(caNS), namespace("app"))
	c := newController(t, client, "ca-1")
	var s setter
	c.Bind(&s)
	kubetest.Eventually(t, "the follower observes the leader", func() bool { return c.Leader() == "ca-other" })
	if c.IsLeader() {
		t.Fatal("follower leads")
	}
	if err := c.Ready(); err == nil {
		t.Fatal("ready without a CA Secret")
	}
	if n := count(client, "create", "secrets") + count(client, "create", "configmaps"); n != 0 {
		t.Errorf("a follower wrote %d objects", n)
	}

	// The leader creates the Secret: the follower loads it.
	files, root := kubetest.SelfSigned(t, "cluster.local")
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "meshid-ca", Namespace: caNS}, Data: files}
	if _, err := client.CoreV1().Secrets(caNS).Create(context.Background(), sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := c.WaitForBundle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Cert.Equal(root) {
		t.Error("follower loaded another root")
	}
	kubetest.Eventually(t, "Bind delivered the bundle", func() bool { return s.last() != nil && s.last().Equal(root) })
	if n := count(client, "create", "configmaps"); n != 0 {
		t.Errorf("a follower published %d ConfigMaps", n)
	}
}

func TestBindKeepsGoingWhenTheSetterRejects(t *testing.T) {
	files, root := kubetest.SelfSigned(t, "cluster.local")
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "meshid-ca", Namespace: caNS}, Data: files}
	client := fake.NewClientset(sec)
	c := newController(t, client, "ca-0")
	bad := &setter{reject: true}
	good := &setter{}
	c.Bind(bad)
	c.Bind(good)
	kubetest.Eventually(t, "the second setter got the bundle", func() bool { return good.last() != nil && good.last().Equal(root) })
}

func TestNewValidates(t *testing.T) {
	client := fake.NewClientset()
	ok := kube.Config{Client: client, Namespace: caNS, Candidate: election.Candidate{Identity: "ca-0"}, TrustDomain: "cluster.local"}
	testkit.Refuses(t, kube.New, ok, map[string]func(*kube.Config){
		"no client":           func(c *kube.Config) { c.Client = nil },
		"no namespace":        func(c *kube.Config) { c.Namespace = "" },
		"no identity":         func(c *kube.Config) { c.Identity = "" },
		"no trust domain":     func(c *kube.Config) { c.TrustDomain = "" },
		"bad lease durations": func(c *kube.Config) { c.LeaseDuration, c.RenewDeadline = time.Second, 2*time.Second },
	})
}

// rootSource is a RootSource whose bundle the test swaps, as
// ca.Authority.SetBundle does.
type rootSource struct {
	b atomic.Pointer[keystore.Bundle]
}

func (s *rootSource) Bundle() *keystore.Bundle { return s.b.Load() }

func selfSignedBundle(t *testing.T, org string) *keystore.Bundle {
	t.Helper()
	b, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: org})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newRootsController(t *testing.T, client *fake.Clientset, id string, src kube.RootSource, clk clock.Clock, modify func(*kube.Config)) *kube.Controller {
	t.Helper()
	cfg := kube.Config{
		Client:    client,
		Namespace: caNS,
		Candidate: fast(id),
		Roots:     src,
		Clock:     clk,
	}
	if modify != nil {
		modify(&cfg)
	}
	c, err := kube.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, id, c.Run)
	return c
}

// With the key held elsewhere (a state directory, a plugged --ca-dir), the
// replicas elect one leader, which publishes the source's roots and follows
// their changes; no Secret is read or written.
func TestRootSourcePublishedByOneLeader(t *testing.T) {
	client := fake.NewClientset(namespace(caNS), namespace("app"), namespace("kube-system"))
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	src := &rootSource{}
	a := selfSignedBundle(t, "A")
	src.b.Store(a)
	ctrls := []*kube.Controller{
		newRootsController(t, client, "ca-0", src, clk, nil),
		newRootsController(t, client, "ca-1", src, clk, nil),
	}
	want := string(certs.EncodeCertificates(a.Roots...))
	kubetest.Eventually(t, "root ConfigMap in app", func() bool { return rootConfigMap(client, "app") == want })
	if ctrls[0].IsLeader() == ctrls[1].IsLeader() {
		t.Errorf("leaders: ca-0 %v, ca-1 %v; want exactly one", ctrls[0].IsLeader(), ctrls[1].IsLeader())
	}
	for _, c := range ctrls {
		if err := c.Ready(); err != nil {
			t.Errorf("not ready: %v", err)
		}
		if c.Bundle() != a {
			t.Error("Bundle is not the source's")
		}
	}
	if rootConfigMap(client, "kube-system") != "" {
		t.Error("published to kube-system by default")
	}
	if n := count(client, "list", "secrets") + count(client, "create", "secrets"); n != 0 {
		t.Errorf("%d Secret requests without the Secret keystore", n)
	}

	// The Authority's bundle changes (a rotated cacerts directory): the
	// ConfigMaps follow within a poll interval.
	b := selfSignedBundle(t, "B")
	src.b.Store(b)
	want = string(certs.EncodeCertificates(b.Roots...))
	kubetest.Eventually(t, "new root in app", func() bool {
		clk.Add(kube.DefaultRootPollInterval)
		return rootConfigMap(client, "app") == want
	})
}

func TestPublisherSwitchedOff(t *testing.T) {
	t.Run("key elsewhere: nothing to lead", func(t *testing.T) {
		client := fake.NewClientset(namespace(caNS), namespace("app"))
		src := &rootSource{}
		src.b.Store(selfSignedBundle(t, "A"))
		reg := prometheus.NewRegistry()
		c := newRootsController(t, client, "ca-0", src, nil, func(c *kube.Config) { c.DisablePublisher = true; c.Registerer = reg })
		if err := c.Ready(); err != nil {
			t.Fatal(err)
		}
		// Neither an elector nor a publisher was built (each registers its
		// metrics in New), so Run neither campaigns nor publishes.
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			t.Errorf("metric %s registered with nothing to do", mf.GetName())
		}
		if c.IsLeader() || c.Leader() != "" {
			t.Error("a Controller with nothing to lead reports a leader")
		}
	})
	t.Run("key elsewhere with a Lead task: elected, run on one replica", func(t *testing.T) {
		client := fake.NewClientset(namespace(caNS), namespace("app"))
		src := &rootSource{}
		src.b.Store(selfSignedBundle(t, "A"))
		var leading atomic.Int32
		var ran sync.Map
		ctrls := map[string]*kube.Controller{}
		for _, id := range []string{"ca-0", "ca-1"} {
			ctrls[id] = newRootsController(t, client, id, src, nil, func(c *kube.Config) {
				c.DisablePublisher = true
				c.Lead = func(ctx context.Context) {
					leading.Add(1)
					ran.Store(id, true)
					<-ctx.Done()
					leading.Add(-1)
				}
			})
		}
		kubetest.Eventually(t, "one replica runs Lead", func() bool { return leading.Load() == 1 })
		n := 0
		for id, c := range ctrls {
			if _, ok := ran.Load(id); ok != c.IsLeader() {
				t.Errorf("%s: ran Lead %v, leads %v", id, ok, c.IsLeader())
			}
			if c.IsLeader() {
				n++
			}
		}
		if n != 1 || leading.Load() != 1 {
			t.Errorf("%d leaders, %d Lead tasks running; want 1 and 1", n, leading.Load())
		}
		if n := count(client, "create", "configmaps"); n != 0 {
			t.Errorf("%d ConfigMaps created with the publisher off", n)
		}
	})
	t.Run("key in a Secret: the store still runs", func(t *testing.T) {
		client := fake.NewClientset(namespace(caNS), namespace("app"))
		c, err := kube.New(kube.Config{Client: client, Namespace: caNS, Candidate: fast("ca-0"), TrustDomain: "cluster.local",
			DisablePublisher: true})
		if err != nil {
			t.Fatal(err)
		}
		testkit.Run(t, "controller", c.Run)
		kubetest.Eventually(t, "bootstrapped and loaded", func() bool { return c.Ready() == nil })
		if n := count(client, "create", "configmaps") + count(client, "list", "configmaps"); n != 0 {
			t.Errorf("%d ConfigMap requests with the publisher off", n)
		}
	})
}
