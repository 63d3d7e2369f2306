package e2e_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/internal/clock"
)

// TestAPIServerOutage stops the real API server under a running CA: tokens
// it has not reviewed get Unavailable (never Unauthenticated: the token was
// not judged), tokens reviewed within the cache lifetime keep working, and
// the CA recovers on its own when the API server is back.
func TestAPIServerOutage(t *testing.T) {
	ctx := context.Background()
	w := newWorkload(t, "outage")
	// TokenReview's outage semantics: local verification (issue 15) would
	// keep signing unseen tokens on its last keys and informer state.
	srv := startCA(t, cluster.AdminKubeconfig(), "--token-verification", "tokenreview")
	srv.connect(t, srv.stateRoots(t))
	id := workloadID(w.ns, w.sa)
	seen := w.token(t, "istio-ca")   // reviewed before the outage
	unseen := w.token(t, "istio-ca") // first shown during the outage

	// The cache expiry is shown in-process, with a fake clock, against the
	// same real API server: waiting a real minute would only slow the suite.
	fake := clock.NewFake(time.Now())
	tr, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: cluster.MeshClient(), Audiences: []string{"istio-ca"}, Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	inproc := w.token(t, "istio-ca")
	if _, err := tr.Authenticate(ctx, authn.Credentials{Token: inproc}); err != nil {
		t.Fatalf("in-process review before the outage: %v", err)
	}
	if _, err := srv.sign(ctx, seen, id); err != nil {
		t.Fatalf("sign before the outage: %v", err)
	}

	stopAPIServer(t)

	t.Run("unreviewed token is Unavailable", func(t *testing.T) {
		_, err := srv.sign(ctx, unseen, id)
		if got := status.Code(err); got != codes.Unavailable {
			t.Fatalf("code = %v (%v), want Unavailable", got, err)
		}
	})
	t.Run("cached review keeps signing", func(t *testing.T) {
		chain, err := srv.sign(ctx, seen, id)
		if err != nil {
			t.Fatalf("sign with a reviewed token: %v", err)
		}
		verifySVID(t, chain, srv.roots, id)
	})
	t.Run("cached review expires into Unavailable", func(t *testing.T) {
		if _, err := tr.Authenticate(ctx, authn.Credentials{Token: inproc}); err != nil {
			t.Fatalf("within the cache lifetime: %v", err)
		}
		fake.Add(authn.DefaultCacheTTL + time.Second)
		_, err := tr.Authenticate(ctx, authn.Credentials{Token: inproc})
		if got := ca.KindOf(err); got != ca.KindUnavailable {
			t.Fatalf("after the cache lifetime: kind = %v (%v), want unavailable", got, err)
		}
	})

	if err := cluster.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Run("recovers when the API server is back", func(t *testing.T) {
		// client-go reconnects on the next call; allow it a few tries.
		var last error
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			chain, err := srv.sign(ctx, unseen, id)
			last = err
			switch status.Code(err) {
			case codes.OK:
				verifySVID(t, chain, srv.roots, id)
				return true, nil
			case codes.Unavailable:
				return false, nil
			}
			return false, err
		})
		if err != nil {
			t.Fatalf("after the API server restarted: %v (last: %v)", err, last)
		}
		if _, err := tr.Authenticate(ctx, authn.Credentials{Token: inproc}); err != nil {
			t.Fatalf("in-process review after the restart: %v", err)
		}
	})
}

// stopAPIServer stops the cluster's API server (etcd keeps running) and
// starts it again when the test ends, unless the test did.
func stopAPIServer(t *testing.T) {
	t.Helper()
	if err := cluster.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !cluster.APIServerRunning() {
			if err := cluster.StartAPIServer(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}
