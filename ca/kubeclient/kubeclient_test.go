package kubeclient_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/testkit"
)

// TestNarrowScheme: the CA binary links four API groups of k8s.io/api and
// none of the client-go packages that bring all of them back (the reason
// this package exists; test/image bounds the image it makes).
func TestNarrowScheme(t *testing.T) {
	allowed := map[string]bool{"k8s.io/api/core/v1": true, "k8s.io/api/authentication/v1": true, "k8s.io/api/coordination/v1": true,
		"k8s.io/api/certificates/v1": true}
	banned := []string{
		"k8s.io/client-go/kubernetes", "k8s.io/client-go/informers", "k8s.io/client-go/applyconfigurations",
		"k8s.io/client-go/discovery", "k8s.io/client-go/tools/leaderelection", "k8s.io/client-go/metadata/metadatainformer",
	}
	groups := 0
	for _, dep := range testkit.Deps(t, "github.com/meshid/meshid/cmd/meshid") {
		if strings.HasPrefix(dep, "k8s.io/api/") {
			if !allowed[dep] {
				t.Errorf("cmd/meshid links %s", dep)
			}
			groups++
		}
		for _, b := range banned {
			if dep == b || strings.HasPrefix(dep, b+"/") {
				t.Errorf("cmd/meshid links %s", dep)
			}
		}
	}
	if groups != len(allowed) {
		t.Errorf("cmd/meshid links %d of the API groups %v", groups, allowed)
	}
	for gvk := range kubeclient.Scheme.AllKnownTypes() {
		if g := gvk.Group; g != "" && g != "authentication.k8s.io" && g != "coordination.k8s.io" && g != "certificates.k8s.io" {
			t.Errorf("Scheme has %v", gvk)
		}
	}
}

// TestNewSharesOneRateLimiter: the groups share one token bucket of the
// config's QPS and burst, as client-go's clientset does, so a client's
// limit is its limit whatever it calls; a config's own limiter is kept.
func TestNewSharesOneRateLimiter(t *testing.T) {
	c, err := kubeclient.New(&rest.Config{Host: "https://127.0.0.1:1", QPS: 7, Burst: 9})
	if err != nil {
		t.Fatal(err)
	}
	core := c.CoreV1().RESTClient().GetRateLimiter()
	if core == nil || core != c.AuthenticationV1().RESTClient().GetRateLimiter() || core != c.CoordinationV1().RESTClient().GetRateLimiter() {
		t.Fatal("the groups do not share one rate limiter")
	}
	if core.QPS() != 7 {
		t.Fatalf("QPS %v, want 7", core.QPS())
	}
	if _, err := kubeclient.New(&rest.Config{Host: "https://127.0.0.1:1", QPS: 5}); err == nil {
		t.Fatal("QPS without a burst accepted")
	}
	if _, err := kubeclient.New(&rest.Config{Host: "://bad"}); err == nil {
		t.Fatal("a bad host accepted")
	}
}

// TestRequests: each resource goes to its API path with the scheme's
// protobuf encoding; the API's Status errors come back typed.
func TestRequests(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	pb := protobuf.NewSerializer(kubeclient.Scheme, kubeclient.Scheme)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.Method+" "+r.URL.Path)
		mu.Unlock()
		if r.Header.Get("Content-Type") != "" && r.Header.Get("Content-Type") != "application/vnd.kubernetes.protobuf" {
			t.Errorf("%s sent %s", r.URL.Path, r.Header.Get("Content-Type"))
		}
		var obj runtime.Object
		switch {
		case strings.HasSuffix(r.URL.Path, "/missing"):
			obj = &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound}
			w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf")
			w.WriteHeader(http.StatusNotFound)
		case strings.Contains(r.URL.Path, "/leases"):
			obj = &coordinationv1.Lease{TypeMeta: metav1.TypeMeta{Kind: "Lease", APIVersion: "coordination.k8s.io/v1"}, ObjectMeta: metav1.ObjectMeta{Name: "l"}}
		default:
			body, _ := io.ReadAll(r.Body)
			if len(body) == 0 {
				obj = &corev1.Secret{TypeMeta: metav1.TypeMeta{Kind: "Secret", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: "s"}}
			} else {
				w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf")
				_, _ = w.Write(body) // echo the created object
				return
			}
		}
		if w.Header().Get("Content-Type") == "" {
			w.Header().Set("Content-Type", "application/vnd.kubernetes.protobuf")
		}
		if err := pb.Encode(obj, w); err != nil {
			t.Error(err)
		}
	}))
	defer srv.Close()
	c, err := kubeclient.New(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/vnd.kubernetes.protobuf"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if s, err := c.CoreV1().Secrets("ns").Get(ctx, "s", metav1.GetOptions{}); err != nil || s.Name != "s" {
		t.Fatalf("get: %v %v", s, err)
	}
	if s, err := c.CoreV1().Secrets("ns").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "new"}, Data: map[string][]byte{"k": []byte("v")}}, metav1.CreateOptions{}); err != nil || s.Name != "new" || string(s.Data["k"]) != "v" {
		t.Fatalf("create: %v %v", s, err)
	}
	if _, err := c.CoreV1().ConfigMaps("ns").Get(ctx, "missing", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("missing: %v, want NotFound", err)
	}
	if l, err := c.CoordinationV1().Leases("ns").Get(ctx, "l", metav1.GetOptions{}); err != nil || l.Name != "l" {
		t.Fatalf("lease: %v %v", l, err)
	}
	if _, err := c.CoreV1().Namespaces().Get(ctx, "n", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"GET /api/v1/namespaces/ns/secrets/s",
		"POST /api/v1/namespaces/ns/secrets",
		"GET /api/v1/namespaces/ns/configmaps/missing",
		"GET /apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
		"GET /api/v1/namespaces/n",
	}
	mu.Lock()
	defer mu.Unlock()
	if !reflect.DeepEqual(paths, want) {
		t.Fatalf("requests\n%q\nwant\n%q", paths, want)
	}
}

// TestFake: the fake serves its objects, records actions, takes reactors,
// and feeds the informer factory, whose informers sync, see later changes
// and stop at Shutdown; a factory shut down starts nothing more.
func TestFake(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p"}, Spec: corev1.PodSpec{NodeName: "n1"}})
	if p, err := cs.CoreV1().Pods("a").Get(ctx, "p", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "n1" {
		t.Fatalf("get: %v %v", p, err)
	}
	if _, err := cs.CoreV1().Pods("b").Get(ctx, "p", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("other namespace: %v", err)
	}
	boom := errors.New("boom")
	cs.PrependReactor("create", "leases", func(clienttesting.Action) (bool, runtime.Object, error) { return true, nil, boom })
	if _, err := cs.CoordinationV1().Leases("a").Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "l"}}, metav1.CreateOptions{}); !errors.Is(err, boom) {
		t.Fatalf("reactor: %v", err)
	}

	f := kubeclient.NewInformerFactory(cs, 0, kubeclient.WithNamespace("a"))
	pods := f.Pods()
	added := make(chan string, 10)
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) { added <- obj.(*corev1.Pod).Name }}); err != nil {
		t.Fatal(err)
	}
	f.Start(ctx.Done())
	if synced := f.WaitForCacheSync(ctx.Done()); !synced[reflect.TypeOf(&corev1.Pod{})] {
		t.Fatalf("not synced: %v", synced)
	}
	if _, err := cs.CoreV1().Pods("a").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "q"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("b").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "r"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"p", "q"} {
		if got := <-added; got != want {
			t.Fatalf("informer added %s, want %s", got, want)
		}
	}
	if _, err := pods.Lister().Pods("a").Get("q"); err != nil {
		t.Fatal(err)
	}
	if _, err := pods.Lister().Pods("b").Get("r"); err == nil {
		t.Fatal("a namespaced informer holds another namespace's pod")
	}
	if got := len(cs.Actions()); got < 4 {
		t.Fatalf("%d actions recorded", got)
	}

	cancel()
	f.Shutdown()
	late := f.Secrets().Informer()
	f.Start(make(chan struct{}))
	if late.HasSynced() || f.WaitForCacheSync(make(chan struct{}))[reflect.TypeOf(&corev1.Secret{})] {
		t.Fatal("an informer started after Shutdown")
	}
}
