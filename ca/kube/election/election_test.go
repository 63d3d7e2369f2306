package election_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/meshid/meshid/ca/kube/election"
	"github.com/meshid/meshid/ca/kube/internal/kubetest"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/internal/testkit"
)

const ns = "istio-system"

// candidate is an Elector whose Lead records its terms.
type candidate struct {
	e       *election.Elector
	terms   atomic.Int32 // Lead calls started
	running atomic.Int32 // Lead calls running now
	overlap atomic.Bool  // two Lead calls ran at once
	cancel  context.CancelFunc
	done    chan error
}

func newCandidate(t *testing.T, client *fake.Clientset, id string, reg prometheus.Registerer) *candidate {
	t.Helper()
	c := &candidate{}
	e, err := election.New(election.Config{
		Client:        client,
		Namespace:     ns,
		Identity:      id,
		LeaseDuration: time.Second,
		RenewDeadline: 500 * time.Millisecond,
		RetryPeriod:   100 * time.Millisecond,
		Registerer:    reg,
		Lead: func(ctx context.Context) {
			c.terms.Add(1)
			if c.running.Add(1) > 1 {
				c.overlap.Store(true)
			}
			defer c.running.Add(-1)
			<-ctx.Done()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	c.e = e
	return c
}

func (c *candidate) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel, c.done = cancel, make(chan error, 1)
	go func() { c.done <- c.e.Run(ctx) }()
	t.Cleanup(c.stop)
}

// stop cancels Run and waits for it; idempotent.
func (c *candidate) stop() {
	if c.cancel == nil {
		return
	}
	c.cancel()
	<-c.done
	c.cancel = nil
}

func holder(t *testing.T, client *fake.Clientset) string {
	l, err := client.CoordinationV1().Leases(ns).Get(context.Background(), election.DefaultLeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func TestLeadsAndReleasesOnShutdown(t *testing.T) {
	client := fake.NewClientset()
	reg := prometheus.NewRegistry()
	a := newCandidate(t, client, "ca-0", reg)
	a.start(t)
	kubetest.Eventually(t, "ca-0 leads", func() bool { return a.e.IsLeader() && a.running.Load() == 1 })
	if got := holder(t, client); got != "ca-0" {
		t.Errorf("Lease holder = %q, want ca-0", got)
	}
	if got := a.e.Leader(); got != "ca-0" {
		t.Errorf("Leader() = %q", got)
	}
	if v := gauge(t, reg); v != 1 {
		t.Errorf("meshid_ca_leader = %v, want 1", v)
	}
	a.stop()
	if a.running.Load() != 0 || a.e.IsLeader() {
		t.Error("Lead still running after Run returned")
	}
	if got := holder(t, client); got != "" {
		t.Errorf("Lease holder after shutdown = %q, want released", got)
	}
	if v := gauge(t, reg); v != 0 {
		t.Errorf("meshid_ca_leader = %v after shutdown, want 0", v)
	}
}

func TestFailover(t *testing.T) {
	client := fake.NewClientset()
	a := newCandidate(t, client, "ca-0", nil)
	b := newCandidate(t, client, "ca-1", nil)
	a.start(t)
	kubetest.Eventually(t, "ca-0 leads", func() bool { return a.e.IsLeader() })
	b.start(t)
	kubetest.Eventually(t, "ca-1 sees ca-0 lead", func() bool { return b.e.Leader() == "ca-0" })
	if b.e.IsLeader() || b.terms.Load() != 0 {
		t.Fatal("two leaders")
	}
	a.stop() // releases the Lease: ca-1 takes over without waiting for expiry
	kubetest.Eventually(t, "ca-1 leads", func() bool { return b.e.IsLeader() && b.running.Load() == 1 })
	if got := holder(t, client); got != "ca-1" {
		t.Errorf("Lease holder = %q, want ca-1", got)
	}
}

func TestLeadStopsWhenTheLeaseIsLostAndResumesLater(t *testing.T) {
	client := fake.NewClientset()
	a := newCandidate(t, client, "ca-0", nil)
	a.start(t)
	kubetest.Eventually(t, "ca-0 leads", func() bool { return a.running.Load() == 1 })

	// Someone else takes the Lease for an hour: ca-0 fails to renew and
	// must stop its leader tasks. The fake tracker does not check
	// resourceVersion, so make ca-0's stale updates conflict as an API
	// server would.
	var stolen atomic.Bool
	client.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if stolen.Load() && ptr.Deref(l.Spec.HolderIdentity, "") == "ca-0" {
			return true, nil, apierrors.NewConflict(a.GetResource().GroupResource(), l.Name, errors.New("stale"))
		}
		return false, nil, nil
	})
	ctx := context.Background()
	l, err := client.CoordinationV1().Leases(ns).Get(ctx, election.DefaultLeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.Spec.HolderIdentity = ptr.To("thief")
	l.Spec.LeaseDurationSeconds = ptr.To[int32](3600)
	l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	if _, err := client.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	stolen.Store(true)
	kubetest.Eventually(t, "ca-0 stops leading", func() bool { return a.running.Load() == 0 && !a.e.IsLeader() })
	kubetest.Eventually(t, "ca-0 sees the thief", func() bool { return a.e.Leader() == "thief" })

	// The Lease goes away: ca-0 campaigns again and leads a second term.
	stolen.Store(false)
	if err := client.CoordinationV1().Leases(ns).Delete(ctx, election.DefaultLeaseName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	kubetest.Eventually(t, "ca-0 leads again", func() bool { return a.terms.Load() == 2 && a.running.Load() == 1 })
	if a.overlap.Load() {
		t.Error("two Lead calls ran at once")
	}
}

func TestNewValidates(t *testing.T) {
	client := fake.NewClientset()
	lead := func(context.Context) {}
	ok := election.Config{Client: client, Namespace: ns, Identity: "x", Lead: lead}
	tests := []struct {
		name   string
		modify func(*election.Config)
	}{
		{"no client", func(c *election.Config) { c.Client = nil }},
		{"no namespace", func(c *election.Config) { c.Namespace = "" }},
		{"no identity", func(c *election.Config) { c.Identity = "" }},
		{"no lead", func(c *election.Config) { c.Lead = nil }},
		{"renew deadline not below lease", func(c *election.Config) { c.LeaseDuration, c.RenewDeadline = time.Second, time.Second }},
		{"retry too long for renew", func(c *election.Config) { c.RetryPeriod = 9 * time.Second }},
	}
	if _, err := election.New(ok); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.modify(&cfg)
			if _, err := election.New(cfg); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
}

func gauge(t *testing.T, g prometheus.Gatherer) float64 {
	t.Helper()
	return testkit.Metric(t, g, "meshid_ca_leader")
}
