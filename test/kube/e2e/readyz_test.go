package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// readyzGrace is the --apiserver-readiness-grace of these tests. The CA
// probes 5 s after its last probe ended, so its last answer before a stop
// is at most 5 s (and the probe's own time, readyzSlack under load) old:
// /readyz must stay 200 for at least readyzGrace-5s-readyzSlack after it.
const (
	readyzGrace    = 10 * time.Second
	readyzInterval = 5 * time.Second
	readyzSlack    = 2 * time.Second
)

// TestReadyzFollowsAPIServer (issue 30): the CA's /readyz says whether it
// can authenticate callers, with the real API server stopped and started
// under `meshid server`.
func TestReadyzFollowsAPIServer(t *testing.T) {
	ctx := context.Background()
	t.Run("tokenreview leaves after the grace and returns", func(t *testing.T) {
		srv := startCA(t, cluster.AdminKubeconfig(), "--token-verification", "tokenreview", "--apiserver-readiness-grace", readyzGrace.String())
		waitMetric(t, srv.monitor, "meshid_ca_kube_apiserver_reachable", 1)
		stopped := time.Now()
		stopAPIServer(t)
		body := waitReadyz(t, srv.monitor, http.StatusServiceUnavailable, time.Minute)
		if elapsed := time.Since(stopped); elapsed < readyzGrace-readyzInterval-readyzSlack {
			t.Fatalf("not ready %s after the stop: sooner than the grace allows (%s - %s - %s)", elapsed, readyzGrace, readyzInterval, readyzSlack)
		}
		if !strings.Contains(body, "cannot authenticate") || !strings.Contains(body, "has not answered for") {
			t.Fatalf("/readyz body %q does not say why", body)
		}
		waitMetric(t, srv.monitor, "meshid_ca_kube_apiserver_reachable", 0)
		if err := cluster.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		waitReadyz(t, srv.monitor, http.StatusOK, time.Minute)
		// The CA's log is buffered: it reaches the file a moment later.
		eventually(t, 30*time.Second, "the log says the API server answers again", func(context.Context) error {
			if !strings.Contains(srv.proc.Tail(1<<16), "the Kubernetes API server answers again") {
				return fmt.Errorf("not in the log")
			}
			return nil
		})
	})
	t.Run("restarted during an outage not ready until it answers", func(t *testing.T) {
		stopAPIServer(t)
		// The default token verification (auto): local verification
		// cannot sync either.
		srv := launchCA(t, cluster.AdminKubeconfig(), "--apiserver-readiness-grace", readyzGrace.String())
		eventually(t, time.Minute, "/readyz: not answered since the start", func(context.Context) error {
			code, body, err := readyz(srv.monitor)
			if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "not answered since the start") {
				return fmt.Errorf("/readyz %d %q %v", code, body, err)
			}
			return nil
		})
		// Past the grace and two more probes, still not ready.
		holds(t, readyzGrace+2*readyzInterval, "not ready while the API server is down", func() error {
			if code, body, err := readyz(srv.monitor); err != nil || code != http.StatusServiceUnavailable {
				return fmt.Errorf("/readyz %d %q %v", code, body, err)
			}
			return nil
		})
		if err := cluster.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		waitReadyz(t, srv.monitor, http.StatusOK, time.Minute)
	})
	t.Run("local verification synced stays ready and signs", func(t *testing.T) {
		// The admin may list pods and read the issuer's keys: auto
		// verifies locally.
		srv := startCA(t, cluster.AdminKubeconfig(), "--apiserver-readiness-grace", readyzGrace.String())
		srv.connect(t, srv.stateRoots(t))
		waitLocal(t, srv)
		const ns = "readyz-local"
		if err := cluster.CreateServiceAccount(ctx, ns, "app"); err != nil {
			t.Fatal(err)
		}
		_, tok := podToken(t, ns, "app-0", "app")
		waitForPods(t, srv)
		stopped := time.Now()
		stopAPIServer(t)
		waitMetric(t, srv.monitor, "meshid_ca_kube_apiserver_reachable", 0)
		holds(t, readyzGrace+2*readyzInterval-time.Since(stopped), "ready through the outage", func() error {
			if code, body, err := readyz(srv.monitor); err != nil || code != http.StatusOK {
				return fmt.Errorf("/readyz %d %q %v", code, body, err)
			}
			return nil
		})
		if _, err := srv.sign(ctx, tok, workloadID(ns, "app")); err != nil {
			t.Fatalf("sign with the API server down, verified locally: %v", err)
		}
		if err := cluster.StartAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		waitMetric(t, srv.monitor, "meshid_ca_kube_apiserver_reachable", 1)
	})
}

// waitReadyz waits until /readyz answers code and returns its body.
func waitReadyz(t *testing.T, monitor string, code int, timeout time.Duration) string {
	t.Helper()
	var body string
	eventually(t, timeout, fmt.Sprintf("/readyz %d", code), func(context.Context) error {
		got, b, err := readyz(monitor)
		body = b
		if err != nil || got != code {
			return fmt.Errorf("/readyz %d %q %v", got, b, err)
		}
		return nil
	})
	return body
}

// waitMetric waits until the unlabelled metric name is want.
func waitMetric(t *testing.T, monitor, name string, want float64) {
	t.Helper()
	eventually(t, time.Minute, fmt.Sprintf("%s = %v", name, want), func(context.Context) error {
		v, err := metric(monitor, name)
		if err != nil || v != want {
			return fmt.Errorf("%s = %v, %v", name, v, err)
		}
		return nil
	})
}

// holds checks cond every 100 ms for d and fails at the first error.
func holds(t *testing.T, d time.Duration, what string, cond func() error) {
	t.Helper()
	var failed error
	_ = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, d, true, func(context.Context) (bool, error) {
		failed = cond()
		return failed != nil, nil
	})
	if failed != nil {
		t.Fatalf("%s: %v", what, failed)
	}
}
