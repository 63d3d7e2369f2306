package caserver_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/testkit"
)

// apiServer is an HTTP server in the API server's place: /readyz answers
// with the status code in readyz (0: the connection is closed without an
// answer) and counts its requests; every other path is 404.
type apiServer struct {
	readyz   atomic.Int64
	probes   atomic.Int64
	kc       *kubeclient.Clientset
	shutdown func()
}

func newAPIServer(t *testing.T, code int) *apiServer {
	t.Helper()
	a := &apiServer{}
	a.readyz.Store(int64(code))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		a.probes.Add(1)
		code := int(a.readyz.Load())
		if code == 0 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(srv.Close)
	kc, err := kubeclient.New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	a.kc = kc
	return a
}

// TestReadyFollowsAPIServer: a CA (TokenReview only, as one whose local
// verification has not synced) that has had no answer from its API server
// since it started is not ready and says why; it is ready once the API
// server answers its probe, and meshid_ca_kube_apiserver_reachable
// follows. The grace after a last answer is shown by internal/reachability
// (fake clock) and by test/kube (the real API server stopped and started).
func TestReadyFollowsAPIServer(t *testing.T) {
	for _, tc := range []struct {
		name string
		code int
		want string
	}{
		{"no answer", 0, "EOF"},
		{"credentials refused", http.StatusUnauthorized, "refuses the CA's credentials"},
		{"not ready", http.StatusServiceUnavailable, "not ready (503)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newAPIServer(t, tc.code)
			logs := testkit.NewLogRecorder()
			reg := prometheus.NewRegistry()
			s := testkit.CA(t, caserver.Config{
				Kube: caserver.KubeConfig{
					Client:                 api.kc,
					DisableRootConfigMap:   true,
					APIServerProbeInterval: 10 * time.Millisecond,
					APIServerGrace:         time.Hour,
				},
				Registerer: reg, Logger: logs.Logger(),
			})
			logs.WaitFor(t, "the Kubernetes API server does not answer", 1)
			err := s.Ready()
			if err == nil || !strings.Contains(err.Error(), "cannot authenticate") || !strings.Contains(err.Error(), "not answered since the start") ||
				!strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Ready() = %v, want not ready naming the API server and %q", err, tc.want)
			}
			if v := testkit.Metric(t, reg, "meshid_ca_kube_apiserver_reachable"); v != 0 {
				t.Fatalf("meshid_ca_kube_apiserver_reachable = %v while it fails", v)
			}
			api.readyz.Store(http.StatusOK)
			logs.WaitFor(t, "the Kubernetes API server answers again", 1)
			waitReady(t, s)
			if v := testkit.Metric(t, reg, "meshid_ca_kube_apiserver_reachable"); v != 1 {
				t.Fatalf("meshid_ca_kube_apiserver_reachable = %v once it answers", v)
			}
		})
	}
}

// TestReadyAPIServerForbidden: an API server that authenticates the CA but
// does not let it read /readyz (403) answers: the CA is ready.
func TestReadyAPIServerForbidden(t *testing.T) {
	api := newAPIServer(t, http.StatusForbidden)
	s := testkit.CA(t, caserver.Config{Kube: caserver.KubeConfig{Client: api.kc, DisableRootConfigMap: true, APIServerProbeInterval: 10 * time.Millisecond}})
	waitReady(t, s)
	if api.probes.Load() == 0 {
		t.Fatal("ready without a probe")
	}
}

// TestReadyAPIServerCheckOff: with APIServerGrace negative the CA sends
// no probe and its readiness ignores the API server; a KubeClient without
// a REST client (client-go's fake) gets no probe either.
func TestReadyAPIServerCheckOff(t *testing.T) {
	api := newAPIServer(t, 0)
	s := testkit.CA(t, caserver.Config{
		Kube: caserver.KubeConfig{
			Client:                 api.kc,
			DisableRootConfigMap:   true,
			APIServerProbeInterval: 10 * time.Millisecond,
			APIServerGrace:         -1,
		},
	})
	waitReady(t, s)
	if n := api.probes.Load(); n != 0 {
		t.Fatalf("%d probes sent with the check off", n)
	}
	waitReady(t, testkit.CA(t, caserver.Config{Kube: caserver.KubeConfig{Client: fake.NewClientset(), DisableRootConfigMap: true}}))
}

func TestAPIServerProbeIntervalRefused(t *testing.T) {
	if _, err := caserver.New(caserver.Config{StateDir: t.TempDir(), Kube: caserver.KubeConfig{APIServerProbeInterval: -time.Second}}); err == nil {
		t.Fatal("New accepted a negative probe interval")
	}
}

// waitReady waits until s is ready (the gRPC server starts serving just
// after Run logs that it does).
func waitReady(t *testing.T, s *caserver.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Guard)
	defer cancel()
	var last error
	if err := wait.PollUntilContextCancel(ctx, 5*time.Millisecond, true, func(context.Context) (bool, error) {
		last = s.Ready()
		return last == nil, nil
	}); err != nil {
		t.Fatalf("never ready: %v", last)
	}
}
