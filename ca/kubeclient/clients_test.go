package kubeclient_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/meshid/meshid/ca/kubeclient"
)

// writeKubeconfig writes a kubeconfig for server and returns its path.
func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: server}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "t"}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func limiter(t *testing.T, c kubeclient.Interface) flowcontrol.RateLimiter {
	t.Helper()
	rl := c.AuthenticationV1().RESTClient().GetRateLimiter()
	if rl == nil {
		t.Fatal("client without a rate limiter")
	}
	return rl
}

func TestDefaultsSizedForACA(t *testing.T) {
	cs, err := kubeclient.NewClients(kubeclient.Config{Kubeconfig: writeKubeconfig(t, "https://127.0.0.1:1")})
	if err != nil {
		t.Fatal(err)
	}
	auth, ctrl := limiter(t, cs.Auth), limiter(t, cs.Controllers)
	if auth == ctrl {
		t.Fatal("the TokenReview and controller clients share one rate limiter")
	}
	// client-go's default is QPS 5: the bug of issue 18.
	if auth.QPS() != kubeclient.DefaultQPS || cs.AuthConfig.Burst != kubeclient.DefaultBurst {
		t.Errorf("auth client QPS %v burst %d, want %d/%d", auth.QPS(), cs.AuthConfig.Burst, kubeclient.DefaultQPS, kubeclient.DefaultBurst)
	}
	if ctrl.QPS() != kubeclient.DefaultControllerQPS || cs.ControllerConfig.Burst != kubeclient.DefaultControllerBurst {
		t.Errorf("controller client QPS %v burst %d, want %d/%d", ctrl.QPS(), cs.ControllerConfig.Burst, kubeclient.DefaultControllerQPS, kubeclient.DefaultControllerBurst)
	}
}

func TestExplicitLimits(t *testing.T) {
	cs, err := kubeclient.NewClients(kubeclient.Config{Kubeconfig: writeKubeconfig(t, "https://127.0.0.1:1"),
		QPS: 42, Burst: 84, ControllerQPS: 7, ControllerBurst: 9})
	if err != nil {
		t.Fatal(err)
	}
	if q := limiter(t, cs.Auth).QPS(); q != 42 || cs.AuthConfig.Burst != 84 {
		t.Errorf("auth QPS %v burst %d, want 42/84", q, cs.AuthConfig.Burst)
	}
	if q := limiter(t, cs.Controllers).QPS(); q != 7 || cs.ControllerConfig.Burst != 9 {
		t.Errorf("controllers QPS %v burst %d, want 7/9", q, cs.ControllerConfig.Burst)
	}
}

// An exhausted controller bucket does not delay authentication: the Auth
// client still has its whole burst (TryAccept takes a token without
// waiting, so no clock is involved).
func TestControllersCannotStarveAuth(t *testing.T) {
	cs, err := kubeclient.NewClients(kubeclient.Config{Kubeconfig: writeKubeconfig(t, "https://127.0.0.1:1"),
		QPS: 1, Burst: 3, ControllerQPS: 0.001, ControllerBurst: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctrl, auth := limiter(t, cs.Controllers), limiter(t, cs.Auth)
	for ctrl.TryAccept() {
	}
	for i := range 3 {
		if !auth.TryAccept() {
			t.Fatalf("auth request %d waits after the controllers spent their budget", i+1)
		}
	}
}

// Both clients reach the server named by the kubeconfig, in protobuf, with
// a User-Agent that tells them apart in the API server's audit log.
func TestRequestsOnTheWire(t *testing.T) {
	var (
		mu     sync.Mutex
		agents = map[string]string{} // path -> user agent
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		agents[r.URL.Path] = r.UserAgent() + " " + r.Header.Get("Content-Type")
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","code":500}`))
	}))
	defer srv.Close()
	cs, err := kubeclient.NewClients(kubeclient.Config{Kubeconfig: writeKubeconfig(t, srv.URL), UserAgent: "meshid-test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, _ = cs.Auth.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{}, metav1.CreateOptions{})
	_, _ = cs.Controllers.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	mu.Lock()
	defer mu.Unlock()
	want := map[string]string{
		"/apis/authentication.k8s.io/v1/tokenreviews": "meshid-test/tokenreview application/vnd.kubernetes.protobuf",
		"/api/v1/namespaces":                          "meshid-test/controllers ",
	}
	for path, w := range want {
		if agents[path] != w {
			t.Errorf("%s: user agent and content type %q, want %q", path, agents[path], w)
		}
	}
}

func TestNewValidates(t *testing.T) {
	kc := writeKubeconfig(t, "https://127.0.0.1:1")
	bad := []kubeclient.Config{
		{Kubeconfig: kc, QPS: -1},
		{Kubeconfig: kc, Burst: -1},
		{Kubeconfig: kc, ControllerQPS: -1},
		{Kubeconfig: kc, ControllerBurst: -1},
		{Kubeconfig: kc, QPS: 100, Burst: 10},
		{Kubeconfig: kc, ControllerQPS: 100, ControllerBurst: 10},
		{Kubeconfig: filepath.Join(t.TempDir(), "missing")},
	}
	for _, cfg := range bad {
		if _, err := kubeclient.NewClients(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

func TestNotInCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	if _, err := kubeclient.NewClients(kubeclient.Config{}); !errors.Is(err, kubeclient.ErrNotInCluster) {
		t.Fatalf("err %v, want ErrNotInCluster", err)
	}
}

// The Auth client reports each 429 of a request made with OnThrottled's
// context, the attempts client-go retries included; the Controllers
// client reports nothing.
func TestAuthReportsThrottling(t *testing.T) {
	var (
		mu       sync.Mutex
		answered = map[string]int{} // user agent -> 429s sent
	)
	const rejections = 3
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n := answered[r.UserAgent()]
		if n < rejections {
			answered[r.UserAgent()]++
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if n < rejections {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429}`))
			return
		}
		_, _ = w.Write([]byte(`{"kind":"TokenReview","apiVersion":"authentication.k8s.io/v1","status":{"authenticated":false}}`))
	}))
	defer srv.Close()
	cs, err := kubeclient.NewClients(kubeclient.Config{Kubeconfig: writeKubeconfig(t, srv.URL), UserAgent: "u"})
	if err != nil {
		t.Fatal(err)
	}
	review := func(c kubeclient.Interface, ctx context.Context) {
		t.Helper()
		if _, err := c.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var reported int
	count := func() { reported++ }
	review(cs.Auth, kubeclient.OnThrottled(context.Background(), count))
	if reported != rejections {
		t.Errorf("the Auth client reported %d 429s, the server sent %d", reported, rejections)
	}
	reported = 0
	review(cs.Controllers, kubeclient.OnThrottled(context.Background(), count))
	if reported != 0 {
		t.Errorf("the Controllers client reported %d 429s", reported)
	}
	mu.Lock()
	defer mu.Unlock()
	if answered["u/tokenreview"] != rejections || answered["u/controllers"] != rejections {
		t.Errorf("the server sent 429s %v, want %d to each client", answered, rejections)
	}
}
