package multicluster_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/cluster"
)

// wantCode fails the test unless err has code, and its message contains
// every one of subs.
func wantCode(t *testing.T, what string, err error, code codes.Code, subs ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: %v, want %v", what, err, code)
	}
	for _, s := range subs {
		if !strings.Contains(status.Convert(err).Message(), s) {
			t.Fatalf("%s: message %q does not contain %q", what, status.Convert(err).Message(), s)
		}
	}
}

// TestRemoteKubeconfig: with --remote-kubeconfig cluster-b=PATH, B's
// tokens are reviewed by B's API server when they say ClusterID=cluster-b,
// and nowhere else; A's tokens keep working; B going down fails only B.
func TestRemoteKubeconfig(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "b.kubeconfig")
	if err := os.WriteFile(path, readerKubeconfig(t, clusterB), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCA(t, func(cfg *caserver.Config) { cfg.Clusters.RemoteKubeconfigs = map[string]string{idB: path} })
	wa := newWorkload(t, clusterA, "flag-a", "frontend")
	wb := newWorkload(t, clusterB, "flag-b", "backend")

	t.Run("B's token with ClusterID=B is signed", func(t *testing.T) {
		if err := c.sign(ctx, wb.token(t), idB, wb.id()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("A's token, no ClusterID or ClusterID=A, is signed", func(t *testing.T) {
		for _, id := range []string{"", idA} {
			if err := c.sign(ctx, wa.token(t), id, wa.id()); err != nil {
				t.Fatalf("ClusterID %q: %v", id, err)
			}
		}
	})
	t.Run("B's token without ClusterID is Unauthenticated", func(t *testing.T) {
		wantCode(t, "B's token as local", c.sign(ctx, wb.token(t), "", wb.id()), codes.Unauthenticated)
	})
	t.Run("A's token as ClusterID=B is Unauthenticated", func(t *testing.T) {
		wantCode(t, "A's token as B", c.sign(ctx, wa.token(t), idB, wa.id()), codes.Unauthenticated)
	})
	t.Run("unknown ClusterID is Unauthenticated naming it", func(t *testing.T) {
		wantCode(t, "unknown", c.sign(ctx, wb.token(t), "cluster-z", wb.id()), codes.Unauthenticated, `"cluster-z"`)
	})
	t.Run("cluster label", func(t *testing.T) {
		if got := c.metric(t, "meshid_ca_cluster_authentications_total", "cluster", idB, "result", "authenticated"); got != 1 {
			t.Fatalf("B authenticated = %v", got)
		}
		if got := c.metric(t, "meshid_ca_cluster_authentications_total", "cluster", cluster.UnknownLabel, "result", "unauthenticated"); got != 1 {
			t.Fatalf("unknown = %v", got)
		}
	})
	t.Run("latency of a remote review", func(t *testing.T) { logLatency(t, c, wa, wb) })
	t.Run("B down: Unavailable for B, A keeps signing", func(t *testing.T) { remoteDown(t, c, wa, wb) })
}

// logLatency logs the median time to sign with a fresh token (one review
// each, no cache) of the local and of the remote cluster. Both API servers
// run on this machine, so the extra is the remote path's own cost (a
// second client, TLS, the lookup), not a network's.
func logLatency(t *testing.T, c *ca, wa, wb workload) {
	const n = 9
	median := func(w workload, cluster string) time.Duration {
		var ds []time.Duration
		for range n {
			tok := w.token(t)
			start := time.Now()
			if err := c.sign(context.Background(), tok, cluster, w.id()); err != nil {
				t.Fatal(err)
			}
			ds = append(ds, time.Since(start))
		}
		slices.Sort(ds)
		return ds[n/2]
	}
	local, remote := median(wa, ""), median(wb, idB)
	t.Logf("CreateCertificate with a fresh token (median of %d): local %s, remote %s, extra %s", n, local, remote, remote-local)
}

// remoteDown stops B's API server: B's fresh tokens get Unavailable (never
// Unauthenticated), A's keep being signed; B recovers when it is back.
func remoteDown(t *testing.T, c *ca, wa, wb workload) {
	ctx := context.Background()
	unseen := wb.token(t)
	if err := clusterB.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !clusterB.APIServerRunning() {
			if err := clusterB.StartAPIServer(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
	wantCode(t, "B down", c.sign(ctx, unseen, idB, wb.id()), codes.Unavailable)
	if err := c.sign(ctx, wa.token(t), "", wa.id()); err != nil {
		t.Fatalf("A while B is down: %v", err)
	}
	if err := c.srv.Ready(); err != nil {
		t.Fatalf("/readyz depends on B: %v", err)
	}
	if got := c.metric(t, "meshid_ca_remote_cluster_state", "cluster", idB, "state", cluster.StateUnreachable); got != 1 {
		t.Fatalf("B unreachable = %v", got)
	}
	if err := clusterB.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = c.sign(ctx, unseen, idB, wb.id())
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("B back: %v (last %v)", err, last)
	}
}
