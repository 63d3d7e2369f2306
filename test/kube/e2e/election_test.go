package e2e_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/ca/kube/election"
	"github.com/meshid/meshid/ca/kubeclient"
)

// elector is one in-process election.Elector on the real API server.
type elector struct {
	id      string
	e       *election.Elector
	running atomic.Int32 // Lead calls running now
	cancel  context.CancelFunc
	done    chan struct{}
}

// TestElection runs ca/kube/election's Electors on the real API server as
// the meshid ServiceAccount, with exactly deploy/'s RBAC (get and update of
// the meshid-ca Lease, create of Leases): three candidates elect exactly
// one leader, the one the Lease names, and keep it while it renews; when it
// stops, it releases the Lease and another takes over well before the
// Lease would have expired; the real resourceVersion checks keep the
// candidates racing for it to one leader.
func TestElection(t *testing.T) {
	kubeconfig := deployRBAC(t)
	resetCAState(t)
	t.Cleanup(func() { resetCAState(t) })
	const (
		leaseDuration = 15 * time.Second
		renewDeadline = 10 * time.Second
		retryPeriod   = 250 * time.Millisecond
	)
	start := func(id string) *elector {
		clients, err := kubeclient.NewClients(kubeclient.Config{Kubeconfig: kubeconfig})
		if err != nil {
			t.Fatal(err)
		}
		el := &elector{id: id, done: make(chan struct{})}
		el.e, err = election.New(election.Config{
			Client:    clients.Controllers,
			Namespace: caNamespace,
			Candidate: election.Candidate{Identity: id, LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod},
			Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("elector", id),
			Lead: func(ctx context.Context) {
				el.running.Add(1)
				defer el.running.Add(-1)
				<-ctx.Done()
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		el.cancel = cancel
		go func() {
			defer close(el.done)
			if err := el.e.Run(ctx); err != nil {
				t.Errorf("%s: Run: %v", id, err)
			}
		}()
		t.Cleanup(func() { cancel(); <-el.done })
		return el
	}
	// leader returns the one elector that leads and runs Lead, the one the
	// Lease names, or an error.
	leader := func(ctx context.Context, els []*elector) (*elector, error) {
		var found []*elector
		for _, el := range els {
			if el.e.IsLeader() || el.running.Load() != 0 {
				found = append(found, el)
			}
		}
		if len(found) != 1 {
			return nil, fmt.Errorf("%d leaders", len(found))
		}
		l, err := cluster.Client().CoordinationV1().Leases(caNamespace).Get(ctx, election.DefaultLeaseName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if h := l.Spec.HolderIdentity; h == nil || *h != found[0].id || found[0].running.Load() != 1 {
			return nil, fmt.Errorf("%s leads, the Lease names %v", found[0].id, h)
		}
		return found[0], nil
	}

	els := []*elector{start("ca-0"), start("ca-1"), start("ca-2")}
	var first *elector
	eventually(t, 30*time.Second, "one leader", func(ctx context.Context) (err error) {
		first, err = leader(ctx, els)
		return err
	})
	// Renewing keeps it: sampled over more than a lease duration, never
	// two leaders and never another.
	ctx := context.Background()
	checks := 0
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, leaseDuration+2*time.Second, true, func(ctx context.Context) (bool, error) {
		checks++
		got, err := leader(context.Background(), els) // not ctx: it ends, on purpose, with the poll
		if err == nil && got != first {
			err = fmt.Errorf("%s leads", got.id)
		}
		return err != nil, err
	})
	if !wait.Interrupted(err) || checks < 10 {
		t.Fatalf("while %s renews (%d checks): %v", first.id, checks, err)
	}

	// The leader stops: it releases, and one of the other two (racing on the
	// same resourceVersion) takes over within a few retry periods.
	stopped := time.Now()
	first.cancel()
	<-first.done
	if first.running.Load() != 0 || first.e.IsLeader() {
		t.Fatal("the stopped elector still leads")
	}
	rest := make([]*elector, 0, 2)
	for _, el := range els {
		if el != first {
			rest = append(rest, el)
		}
	}
	var next *elector
	eventually(t, leaseDuration/2, "a new leader after the release", func(ctx context.Context) (err error) {
		next, err = leader(ctx, rest)
		return err
	})
	t.Logf("%s took over from %s %v after it stopped (lease duration %v)", next.id, first.id, time.Since(stopped).Round(time.Millisecond), leaseDuration)
	l, err := cluster.Client().CoordinationV1().Leases(caNamespace).Get(ctx, election.DefaultLeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.LeaseTransitions == nil || *l.Spec.LeaseTransitions < 1 {
		t.Errorf("leaseTransitions = %v after a takeover, want at least 1", l.Spec.LeaseTransitions)
	}
}
