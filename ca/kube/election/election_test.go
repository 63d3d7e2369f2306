package election_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
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
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

const (
	ns    = "istio-system"
	retry = election.DefaultRetryPeriod
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// world is an API server (the fake, with the optimistic concurrency of a
// real one) and a fake clock shared by candidates.
type world struct {
	t       *testing.T
	client  *fake.Clientset
	clk     *clock.Fake
	gate    gate
	mu      sync.Mutex
	running map[*candidate]bool
}

// gate holds every Lease Update until n Gets have been made since it was
// armed, so candidates that wake together all read the Lease before any of
// them writes it: the race the resourceVersion settles, made certain.
type gate struct {
	mu    sync.Mutex
	n     int
	armed chan struct{} // closed when n Gets were made; nil when disarmed
}

func (g *gate) arm(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n, g.armed = n, make(chan struct{})
}

func (g *gate) disarm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed = nil
}

func (g *gate) got() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.armed != nil {
		if g.n--; g.n == 0 {
			close(g.armed)
		}
	}
}

func (g *gate) update() {
	g.mu.Lock()
	ch := g.armed
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

func newWorld(t *testing.T, objects ...runtime.Object) *world {
	w := &world{t: t, client: fake.NewClientset(objects...), clk: clock.NewFake(t0), running: map[*candidate]bool{}}
	enforceResourceVersions(w.client)
	return w
}

// enforceResourceVersions makes the fake's Leases behave as the API
// server's: every write gets a new resourceVersion, and an Update carrying
// an old one fails with a conflict (the object tracker checks neither).
// An Update without one is unconditional, as on the API server.
func enforceResourceVersions(c *fake.Clientset) {
	var mu sync.Mutex
	version := 0
	gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")
	c.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		switch a.GetVerb() {
		case "create":
			l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
			version++
			l.ResourceVersion = strconv.Itoa(version)
			if err := c.Tracker().Create(gvr, l, a.GetNamespace()); err != nil {
				return true, nil, err
			}
			return true, l, nil
		case "update":
			l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
			cur, err := c.Tracker().Get(gvr, a.GetNamespace(), l.Name)
			if err != nil {
				return true, nil, err
			}
			if l.ResourceVersion != "" && l.ResourceVersion != cur.(*coordinationv1.Lease).ResourceVersion {
				return true, nil, apierrors.NewConflict(gvr.GroupResource(), l.Name, errors.New("the object has been modified"))
			}
			version++
			l.ResourceVersion = strconv.Itoa(version)
			if err := c.Tracker().Update(gvr, l, a.GetNamespace()); err != nil {
				return true, nil, err
			}
			return true, l, nil
		}
		return false, nil, nil
	})
}

// candidate is an Elector whose Lead records its terms; its requests fail
// while cut is set (a replica cut off from the API server).
type candidate struct {
	id      string
	e       *election.Elector
	reg     *prometheus.Registry
	cut     atomic.Bool
	terms   atomic.Int32 // Lead calls started
	running atomic.Int32 // Lead calls running now
	overlap atomic.Bool  // two Lead calls ran at once
	cancel  context.CancelFunc
	done    chan error
}

func (w *world) candidate(id string) *candidate {
	w.t.Helper()
	c := &candidate{id: id, reg: prometheus.NewRegistry()}
	e, err := election.New(election.Config{
		Client:     cutOff{w.client, &c.cut, &w.gate},
		Namespace:  ns,
		Candidate:  election.Candidate{Identity: id},
		Clock:      w.clk,
		Registerer: c.reg,
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
		w.t.Fatal(err)
	}
	c.e = e
	return c
}

// start runs the candidates and waits until each has made its first
// attempt and waits on the clock.
func (w *world) start(cs ...*candidate) {
	w.t.Helper()
	for _, c := range cs {
		ctx, cancel := context.WithCancel(context.Background())
		c.cancel, c.done = cancel, make(chan error, 1)
		go func() { c.done <- c.e.Run(ctx) }()
		w.mu.Lock()
		w.running[c] = true
		w.mu.Unlock()
		w.t.Cleanup(func() { w.stop(c) })
	}
	w.settle()
}

// stop cancels c's Run and waits for it to return; idempotent.
func (w *world) stop(c *candidate) {
	w.mu.Lock()
	run := w.running[c]
	delete(w.running, c)
	w.mu.Unlock()
	if run {
		c.cancel()
		if err := <-c.done; err != nil {
			w.t.Errorf("%s: Run: %v", c.id, err)
		}
	}
}

// settle waits until every running candidate waits on the clock: each
// waits on one timer at a time, and Lead here uses none.
func (w *world) settle() {
	w.mu.Lock()
	n := len(w.running)
	w.mu.Unlock()
	w.clk.WaitForWaiters(n, nil)
}

// tick advances the clock by d and lets every candidate act on it.
func (w *world) tick(d time.Duration) {
	w.clk.Add(d)
	w.settle()
}

// leaders returns the running candidates that lead, checking that Lead
// runs exactly while IsLeader says so.
func (w *world) leaders(cs ...*candidate) []string {
	w.t.Helper()
	var ids []string
	for _, c := range cs {
		if c.e.IsLeader() {
			ids = append(ids, c.id)
			kubetest.Eventually(w.t, c.id+"'s Lead runs", func() bool { return c.running.Load() == 1 })
		} else if n := c.running.Load(); n != 0 {
			w.t.Errorf("%s: %d Lead calls running while not leader", c.id, n)
		}
		if c.overlap.Load() {
			w.t.Errorf("%s: two Lead calls ran at once", c.id)
		}
	}
	return ids
}

// leading starts candidate id alone and returns it once it leads.
func (w *world) leading(id string) *candidate {
	w.t.Helper()
	c := w.candidate(id)
	w.start(c)
	return w.oneLeader(c)
}

// twoCandidates starts ca-0, then ca-1, and returns them once one of them
// leads (ca-0, which tried first).
func (w *world) twoCandidates() (a, b *candidate) {
	w.t.Helper()
	a, b = w.candidate("ca-0"), w.candidate("ca-1")
	w.start(a)
	w.start(b)
	w.oneLeader(a, b)
	return a, b
}

// wantTerms fails the test unless c's Lead has started want times.
func (c *candidate) wantTerms(t *testing.T, want int32) {
	t.Helper()
	if got := c.terms.Load(); got != want {
		t.Errorf("%s started Lead %d times, want %d", c.id, got, want)
	}
}

// oneLeader checks that exactly one candidate leads, the one the Lease
// names, and returns it.
func (w *world) oneLeader(cs ...*candidate) *candidate {
	w.t.Helper()
	ids := w.leaders(cs...)
	if len(ids) != 1 {
		w.t.Fatalf("leaders %v, want exactly one", ids)
	}
	if h := ptr.Deref(w.lease().Spec.HolderIdentity, ""); h != ids[0] {
		w.t.Fatalf("%s leads but the Lease names %q", ids[0], h)
	}
	for _, c := range cs {
		if c.id == ids[0] {
			return c
		}
	}
	return nil
}

func (w *world) lease() *coordinationv1.Lease {
	w.t.Helper()
	l, err := w.client.CoordinationV1().Leases(ns).Get(context.Background(), election.DefaultLeaseName, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	return l
}

// putLease stores a Lease as another program would.
func (w *world) putLease(spec coordinationv1.LeaseSpec) {
	w.t.Helper()
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: election.DefaultLeaseName}, Spec: spec}
	ctx := context.Background()
	if cur, err := w.client.CoordinationV1().Leases(ns).Get(ctx, l.Name, metav1.GetOptions{}); err == nil {
		l.ResourceVersion = cur.ResourceVersion
		_, err = w.client.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
		if err != nil {
			w.t.Fatal(err)
		}
		return
	}
	if _, err := w.client.CoordinationV1().Leases(ns).Create(ctx, l, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

func held(holder string, seconds int32, renew time.Time) coordinationv1.LeaseSpec {
	return coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(holder),
		LeaseDurationSeconds: ptr.To(seconds),
		RenewTime:            &metav1.MicroTime{Time: renew},
		AcquireTime:          &metav1.MicroTime{Time: renew},
		LeaseTransitions:     ptr.To[int32](0),
	}
}

// cutOff is a client whose Lease requests fail while cut is set.
// Its Lease requests pass the world's gate.
type cutOff struct {
	*fake.Clientset
	cut  *atomic.Bool
	gate *gate
}

func (c cutOff) CoordinationV1() kubeclient.CoordinationV1Interface {
	return cutOffCoordination{c.Clientset.CoordinationV1(), c.cut, c.gate}
}

type cutOffCoordination struct {
	kubeclient.CoordinationV1Interface
	cut  *atomic.Bool
	gate *gate
}

func (c cutOffCoordination) Leases(ns string) kubeclient.LeaseInterface {
	return cutOffLeases{c.CoordinationV1Interface.Leases(ns), c.cut, c.gate}
}

type cutOffLeases struct {
	kubeclient.LeaseInterface
	cut  *atomic.Bool
	gate *gate
}

var errCut = apierrors.NewServiceUnavailable("cut off")

func (l cutOffLeases) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordinationv1.Lease, error) {
	if l.cut.Load() {
		return nil, errCut
	}
	defer l.gate.got()
	return l.LeaseInterface.Get(ctx, name, o)
}

func (l cutOffLeases) Create(ctx context.Context, x *coordinationv1.Lease, o metav1.CreateOptions) (*coordinationv1.Lease, error) {
	if l.cut.Load() {
		return nil, errCut
	}
	return l.LeaseInterface.Create(ctx, x, o)
}

func (l cutOffLeases) Update(ctx context.Context, x *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if l.cut.Load() {
		return nil, errCut
	}
	l.gate.update()
	return l.LeaseInterface.Update(ctx, x, o)
}

// Several candidates: one leads, the one the Lease names, and renewing
// keeps it leading for many lease durations; the others see it lead.
func TestOneLeaderRenews(t *testing.T) {
	w := newWorld(t)
	cs := []*candidate{w.candidate("ca-0"), w.candidate("ca-1"), w.candidate("ca-2")}
	w.start(cs...)
	leader := w.oneLeader(cs...)
	first := w.lease()
	for range 5 * election.DefaultLeaseDuration / retry {
		w.tick(retry)
		if got := w.oneLeader(cs...); got != leader {
			t.Fatalf("leadership moved from %s to %s while it renewed", leader.id, got.id)
		}
	}
	l := w.lease()
	if !l.Spec.RenewTime.Time.After(first.Spec.RenewTime.Time) || !l.Spec.AcquireTime.Time.Equal(first.Spec.AcquireTime.Time) {
		t.Errorf("renewal: renewTime %v -> %v, acquireTime %v -> %v", first.Spec.RenewTime, l.Spec.RenewTime, first.Spec.AcquireTime, l.Spec.AcquireTime)
	}
	if got := ptr.Deref(l.Spec.LeaseTransitions, -1); got != 0 {
		t.Errorf("leaseTransitions = %d, want 0", got)
	}
	if got := ptr.Deref(l.Spec.LeaseDurationSeconds, 0); got != 15 {
		t.Errorf("leaseDurationSeconds = %d, want 15", got)
	}
	for _, c := range cs {
		if got := c.e.Leader(); got != leader.id {
			t.Errorf("%s: Leader() = %q, want %q", c.id, got, leader.id)
		}
		want := 0.0
		if c == leader {
			want = 1
		}
		if got := testkit.Metric(t, c.reg, "meshid_ca_leader"); got != want {
			t.Errorf("%s: meshid_ca_leader = %v, want %v", c.id, got, want)
		}
	}
	leader.wantTerms(t, 1)
}

// Stopping the leader waits for its Lead, then clears the holder: the
// follower takes over at its next attempt, long before the Lease would
// have expired.
func TestReleaseOnCancel(t *testing.T) {
	w := newWorld(t)
	a, b := w.twoCandidates()
	w.stop(a)
	if a.running.Load() != 0 || a.e.IsLeader() || testkit.Metric(t, a.reg, "meshid_ca_leader") != 0 {
		t.Fatal("ca-0 still leads after Run returned")
	}
	if h := w.lease().Spec.HolderIdentity; h != nil {
		t.Fatalf("holder after release = %q, want none", *h)
	}
	w.tick(retry)
	if got := w.oneLeader(a, b); got != b {
		t.Fatalf("leader %s, want ca-1", got.id)
	}
	if got := ptr.Deref(w.lease().Spec.LeaseTransitions, -1); got != 1 {
		t.Errorf("leaseTransitions = %d, want 1", got)
	}
}

// A holder that stopped (crashed, no release) keeps the Lease for its
// leaseDurationSeconds from when the candidate first saw it unchanged.
func TestExpiredLeaseTakenOver(t *testing.T) {
	w := newWorld(t)
	w.putLease(held("ghost", 15, t0))
	c := w.candidate("ca-0")
	w.start(c)
	for w.clk.Now().Before(t0.Add(15 * time.Second)) {
		if c.e.IsLeader() || c.e.Leader() != "ghost" {
			t.Fatalf("at %v: leader %v, Leader() = %q; want ghost's Lease respected", w.clk.Now().Sub(t0), c.e.IsLeader(), c.e.Leader())
		}
		w.tick(retry / 2)
	}
	w.tick(retry)
	w.oneLeader(c)
	l := w.lease()
	if got := ptr.Deref(l.Spec.LeaseTransitions, -1); got != 1 {
		t.Errorf("leaseTransitions = %d, want 1", got)
	}
	if !l.Spec.AcquireTime.Time.After(t0) {
		t.Errorf("acquireTime %v not set on takeover", l.Spec.AcquireTime)
	}
}

// The candidate's own clock decides expiry, not the renewTime another
// machine wrote: a renewTime in the far future does not extend the Lease,
// and the holder's long leaseDurationSeconds is honoured, not the
// candidate's shorter one.
func TestHeldLeaseRespected(t *testing.T) {
	w := newWorld(t)
	w.putLease(held("other", 3600, t0.Add(365*24*time.Hour)))
	c := w.candidate("ca-0")
	w.start(c)
	for range 10 {
		w.tick(election.DefaultLeaseDuration)
		if c.e.IsLeader() {
			t.Fatalf("took other's Lease after %v of its 1h", w.clk.Now().Sub(t0))
		}
	}
	w.clk.Set(t0.Add(time.Hour))
	w.settle()
	w.tick(retry)
	w.oneLeader(c)
}

// A leader cut off from the API server stops leading (Lead's context is
// cancelled) once RenewDeadline has passed since its last renewal, and
// before the follower may take the Lease: never two leaders.
func TestStepsDownWhenItCannotRenew(t *testing.T) {
	w := newWorld(t)
	a, b := w.twoCandidates()
	a.cut.Store(true)
	cutAt := w.clk.Now()
	var steppedDown, tookOver time.Duration
	for w.clk.Now().Before(cutAt.Add(time.Minute)) && tookOver == 0 {
		w.tick(retry / 4)
		ids := w.leaders(a, b)
		if len(ids) > 1 {
			t.Fatalf("at %v after the cut: two leaders", w.clk.Now().Sub(cutAt))
		}
		if steppedDown == 0 && !a.e.IsLeader() {
			steppedDown = w.clk.Now().Sub(cutAt)
		}
		if b.e.IsLeader() {
			tookOver = w.clk.Now().Sub(cutAt)
		}
	}
	// ca-0 last renewed at most a retry before the cut.
	if steppedDown == 0 || steppedDown > election.DefaultRenewDeadline || steppedDown < election.DefaultRenewDeadline-retry {
		t.Errorf("ca-0 stepped down %v after the cut, want within the renew deadline %v", steppedDown, election.DefaultRenewDeadline)
	}
	if tookOver == 0 || tookOver <= steppedDown {
		t.Errorf("ca-1 took over %v after the cut, ca-0 stepped down after %v", tookOver, steppedDown)
	}
	if a.running.Load() != 0 {
		t.Error("ca-0's Lead still runs")
	}
	// Reconnected, ca-0 follows.
	a.cut.Store(false)
	w.tick(retry)
	if got := w.oneLeader(a, b); got != b || a.e.Leader() != "ca-1" {
		t.Errorf("after reconnecting: leader %s, ca-0 sees %q", got.id, a.e.Leader())
	}
}

// A renewal that fails now and then, within the renew deadline, does not
// interrupt Lead.
func TestTransientRenewFailureKeepsLeading(t *testing.T) {
	w := newWorld(t)
	a := w.leading("ca-0")
	for range 10 {
		a.cut.Store(true)
		w.tick(retry)
		w.tick(retry)
		a.cut.Store(false)
		w.tick(retry)
	}
	w.oneLeader(a)
	a.wantTerms(t, 1)
}

// Someone else takes the Lease: the leader's next renewal conflicts, it
// reads the new holder and stops at once, not at its renew deadline; when
// the Lease is gone it leads a second term, never two at once.
func TestLeadStopsWhenTheLeaseIsTaken(t *testing.T) {
	w := newWorld(t)
	a := w.leading("ca-0")
	w.putLease(held("thief", 3600, w.clk.Now()))
	w.tick(retry)
	if ids := w.leaders(a); len(ids) != 0 || a.e.Leader() != "thief" {
		t.Fatalf("leaders %v, Leader() %q after the Lease was taken", ids, a.e.Leader())
	}
	if err := w.client.CoordinationV1().Leases(ns).Delete(context.Background(), election.DefaultLeaseName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.tick(retry)
	w.oneLeader(a)
	a.wantTerms(t, 2)
}

// Candidates that saw the same expired Lease all write it at the same
// instant; the resourceVersion lets exactly one through, every time.
func TestConflictingWritesElectOne(t *testing.T) {
	w := newWorld(t)
	var cs []*candidate
	for i := range 5 {
		cs = append(cs, w.candidate(fmt.Sprintf("ca-%d", i)))
	}
	w.putLease(held("ghost", 15, t0))
	w.start(cs...)
	for round := range 5 {
		// Every candidate wakes at once to an expired Lease, and all read
		// it before any writes.
		w.gate.arm(len(cs))
		w.tick(election.DefaultLeaseDuration)
		w.gate.disarm()
		leader := w.oneLeader(cs...)
		if got := ptr.Deref(w.lease().Spec.LeaseTransitions, -1); got != 1 { // the ghost wrote 0
			t.Errorf("round %d: leaseTransitions = %d, want 1", round, got)
		}
		// The leader hangs (cut off, no release), and the others all
		// wait out the same Lease.
		leader.cut.Store(true)
		w.tick(election.DefaultRenewDeadline)
		if leader.e.IsLeader() {
			t.Fatalf("round %d: %s leads cut off for the renew deadline", round, leader.id)
		}
		w.stop(leader)
		cs = removeCandidate(cs, leader)
		w.putLease(held("ghost", 15, w.clk.Now()))
		w.tick(retry) // each sees the ghost's new version
		if len(w.leaders(cs...)) != 0 {
			t.Fatal("the ghost's fresh Lease was taken")
		}
		if len(cs) == 1 {
			break
		}
	}
}

func removeCandidate(cs []*candidate, c *candidate) []*candidate {
	var out []*candidate
	for _, x := range cs {
		if x != c {
			out = append(out, x)
		}
	}
	return out
}

// Malformed Leases, as a buggy tool or an attacker with write access to
// the Lease could leave them, neither crash a candidate nor let it take a
// Lease sooner than a valid one: with no holder it is free; with a holder
// but no usable duration the holder gets the candidate's own.
func TestMalformedLease(t *testing.T) {
	tests := []struct {
		name        string
		spec        coordinationv1.LeaseSpec
		takenAfter  time.Duration // 0: at the first attempt
		transitions int32
	}{
		{"empty spec", coordinationv1.LeaseSpec{}, 0, 0},
		{"empty holder", coordinationv1.LeaseSpec{HolderIdentity: ptr.To(""), LeaseDurationSeconds: ptr.To[int32](3600)}, 0, 0},
		{"holder, no duration", coordinationv1.LeaseSpec{HolderIdentity: ptr.To("x")}, election.DefaultLeaseDuration, 0},
		{"zero duration", coordinationv1.LeaseSpec{HolderIdentity: ptr.To("x"), LeaseDurationSeconds: ptr.To[int32](0)}, election.DefaultLeaseDuration, 0},
		{"negative duration", coordinationv1.LeaseSpec{HolderIdentity: ptr.To("x"), LeaseDurationSeconds: ptr.To[int32](-5)}, election.DefaultLeaseDuration, 0},
		{"negative transitions", func() coordinationv1.LeaseSpec {
			s := held("x", 1, t0)
			s.LeaseTransitions = ptr.To[int32](-7)
			return s
		}(), 2 * time.Second, 0},
		{"transitions at the int32 limit", func() coordinationv1.LeaseSpec {
			s := held("x", 1, t0)
			s.LeaseTransitions = ptr.To[int32](math.MaxInt32)
			return s
		}(), 2 * time.Second, math.MaxInt32},
		{"renew time in the past, no acquire time", coordinationv1.LeaseSpec{HolderIdentity: ptr.To("x"), LeaseDurationSeconds: ptr.To[int32](4), RenewTime: &metav1.MicroTime{Time: t0.Add(-24 * time.Hour)}, LeaseTransitions: ptr.To[int32](3)}, 4 * time.Second, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			w.putLease(tc.spec)
			c := w.candidate("ca-0")
			w.start(c)
			for w.clk.Now().Before(t0.Add(tc.takenAfter)) {
				if c.e.IsLeader() {
					t.Fatalf("took the Lease after %v, want %v", w.clk.Now().Sub(t0), tc.takenAfter)
				}
				w.tick(time.Second)
			}
			w.tick(retry)
			w.oneLeader(c)
			l := w.lease()
			if got := ptr.Deref(l.Spec.LeaseTransitions, -1); got != tc.transitions {
				t.Errorf("leaseTransitions = %d, want %d", got, tc.transitions)
			}
			if l.Spec.AcquireTime == nil || l.Spec.RenewTime == nil || ptr.Deref(l.Spec.LeaseDurationSeconds, 0) != 15 {
				t.Errorf("taken Lease not repaired: %+v", l.Spec)
			}
		})
	}
}

func TestNewValidates(t *testing.T) {
	client := fake.NewClientset()
	lead := func(context.Context) {}
	ok := election.Config{Client: client, Namespace: ns, Candidate: election.Candidate{Identity: "x"}, Lead: lead}
	testkit.Refuses(t, election.New, ok, map[string]func(*election.Config){
		"no client":                      func(c *election.Config) { c.Client = nil },
		"no namespace":                   func(c *election.Config) { c.Namespace = "" },
		"no identity":                    func(c *election.Config) { c.Identity = "" },
		"no lead":                        func(c *election.Config) { c.Lead = nil },
		"renew deadline not below lease": func(c *election.Config) { c.LeaseDuration, c.RenewDeadline = time.Second, time.Second },
		"retry too long for renew":       func(c *election.Config) { c.RetryPeriod = 9 * time.Second },
		"negative retry":                 func(c *election.Config) { c.RetryPeriod = -time.Second },
		"negative renew deadline":        func(c *election.Config) { c.RenewDeadline = -time.Second },
		"lease under a second": func(c *election.Config) {
			c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 900*time.Millisecond, 500*time.Millisecond, 100*time.Millisecond
		},
	})
}
