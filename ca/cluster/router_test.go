package cluster_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/rest"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/cluster"
	"github.com/meshid/meshid/testkit"
)

// apiServer is an HTTPS endpoint answering TokenReviews: a unit-test
// stand-in for a remote API server (test/kube runs real ones). It
// authenticates exactly the token it was given, as ns/sa.
type apiServer struct {
	srv     *httptest.Server
	reviews atomic.Int64
}

func newAPIServer(t *testing.T, token, ns, sa string) *apiServer {
	a := &apiServer{}
	a.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/authentication.k8s.io/v1/tokenreviews" {
			http.NotFound(w, r)
			return
		}
		a.reviews.Add(1)
		var tr authenticationv1.TokenReview
		tr.APIVersion, tr.Kind = "authentication.k8s.io/v1", "TokenReview"
		// The client sends protobuf; the body is not read: the token is
		// recognised by a header-free rule, its presence in the body.
		body := make([]byte, 64<<10)
		n, _ := r.Body.Read(body)
		if strings.Contains(string(body[:n]), token) {
			tr.Status = authenticationv1.TokenReviewStatus{
				Authenticated: true,
				User:          authenticationv1.UserInfo{Username: "system:serviceaccount:" + ns + ":" + sa, Groups: []string{"system:serviceaccounts"}},
				Audiences:     []string{"istio-ca"},
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&tr)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *apiServer) config() *rest.Config {
	return &rest.Config{Host: a.srv.URL, TLSClientConfig: rest.TLSClientConfig{
		CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.srv.Certificate().Raw}),
	}}
}

// localAuth records what the local cluster was asked.
type localAuth struct{ calls atomic.Int64 }

func (l *localAuth) Authenticate(_ context.Context, creds authn.Credentials) (*authn.Caller, error) {
	if creds.Token == "" {
		return nil, authn.ErrNoCredentials
	}
	l.calls.Add(1)
	if creds.Token == "local-token" {
		return &authn.Caller{Namespace: "a", ServiceAccount: "local", Method: authn.MethodTokenReview}, nil
	}
	return nil, authn.FinalForToken(ca.Errorf(ca.KindUnauthenticated, "local: rejected"))
}

func newRouter(t *testing.T, cfg cluster.Config) (*cluster.Router, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	cfg.Registerer = reg
	r, err := cluster.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r, reg
}

func TestRouterRoutesByClusterID(t *testing.T) {
	ctx := context.Background()
	local := &localAuth{}
	b := newAPIServer(t, "b-token", "shop", "cart")
	r, reg := newRouter(t, cluster.Config{LocalID: "a", Local: local})
	if err := r.Set("b", b.config(), "test"); err != nil {
		t.Fatal(err)
	}

	for _, id := range []string{"", "a"} {
		c, err := r.Authenticate(ctx, authn.Credentials{Token: "local-token", ClusterID: id})
		if err != nil || c.ServiceAccount != "local" || c.Cluster != "" {
			t.Fatalf("ClusterID %q: %v %+v", id, err, c)
		}
	}
	if local.calls.Load() != 2 || b.reviews.Load() > 1 { // at most the probe
		t.Fatalf("local calls %d, remote reviews %d", local.calls.Load(), b.reviews.Load())
	}
	c, err := r.Authenticate(ctx, authn.Credentials{Token: "b-token", ClusterID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Namespace != "shop" || c.ServiceAccount != "cart" || c.Cluster != "b" || !strings.Contains(c.String(), "cluster b") {
		t.Fatalf("remote caller %+v (%s)", c, c)
	}
	if local.calls.Load() != 2 {
		t.Fatal("a remote token reached the local cluster")
	}
	// B's token without ClusterID is the local cluster's to judge.
	if _, err := r.Authenticate(ctx, authn.Credentials{Token: "b-token"}); ca.KindOf(err) != ca.KindUnauthenticated {
		t.Fatalf("B's token as local: %v", err)
	}
	// The local token sent as B's: B's API server judges it.
	if _, err := r.Authenticate(ctx, authn.Credentials{Token: "local-token", ClusterID: "b"}); ca.KindOf(err) != ca.KindUnauthenticated {
		t.Fatalf("A's token as B: %v", err)
	}
	if got := testkit.Metric(t, reg, "meshid_ca_cluster_authentications_total", "cluster", "b", "result", "authenticated"); got != 1 {
		t.Fatalf("b authenticated = %v", got)
	}
	if got := testkit.Metric(t, reg, "meshid_ca_cluster_authentications_total", "cluster", "a", "result", "authenticated"); got != 2 {
		t.Fatalf("a authenticated = %v", got)
	}
	if got := testkit.Metric(t, reg, "meshid_ca_remote_cluster_state", "cluster", "b", "state", cluster.StateReady); got != 1 {
		t.Fatalf("b ready = %v", got)
	}
}

func TestRouterUnknownCluster(t *testing.T) {
	r, _ := newRouter(t, cluster.Config{Local: &localAuth{}})
	_, err := r.Authenticate(context.Background(), authn.Credentials{Token: "t", ClusterID: "nowhere"})
	var e *ca.Error
	if !errors.As(err, &e) || e.Kind != ca.KindUnauthenticated || !strings.Contains(e.Msg, `"nowhere"`) {
		t.Fatalf("err = %v, want Unauthenticated naming the cluster", err)
	}
	// Final for the token: a chain does not hand it to the next
	// authenticator.
	next := &localAuth{}
	if _, err := authn.NewChain(r, next).Authenticate(context.Background(), authn.Credentials{Token: "local-token", ClusterID: "nowhere"}); err == nil || next.calls.Load() != 0 {
		t.Fatalf("chain: %v, next called %d times", err, next.calls.Load())
	}
}

func TestRouterRemoteDown(t *testing.T) {
	b := newAPIServer(t, "b-token", "shop", "cart")
	r, reg := newRouter(t, cluster.Config{Local: &localAuth{}})
	if err := r.Set("b", b.config(), "test"); err != nil {
		t.Fatal(err)
	}
	b.srv.Close()
	_, err := r.Authenticate(context.Background(), authn.Credentials{Token: "b-token", ClusterID: "b"})
	if ca.KindOf(err) != ca.KindUnavailable {
		t.Fatalf("err = %v, want Unavailable", err)
	}
	if _, err := r.Authenticate(context.Background(), authn.Credentials{Token: "local-token"}); err != nil {
		t.Fatalf("local cluster while B is down: %v", err)
	}
	if got := testkit.Metric(t, reg, "meshid_ca_remote_cluster_state", "cluster", "b", "state", cluster.StateUnreachable); got != 1 {
		t.Fatalf("b unreachable = %v", got)
	}
}

// TestRouterLabelsBounded: 10,000 distinct unknown ClusterIDs leave the
// label set as it was: the cluster label is a configured ID or "unknown".
func TestRouterLabelsBounded(t *testing.T) {
	r, reg := newRouter(t, cluster.Config{Local: &localAuth{}})
	series := func() int {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, mf := range mfs {
			n += len(mf.GetMetric())
		}
		return n
	}
	before := series()
	for i := range 10000 {
		_, _ = r.Authenticate(context.Background(), authn.Credentials{Token: "t", ClusterID: fmt.Sprintf("attacker-%d", i)})
	}
	after := series()
	if after > before+1 { // the unknown label's latency histogram
		t.Fatalf("series grew from %d to %d", before, after)
	}
	if got := testkit.Metric(t, reg, "meshid_ca_cluster_authentications_total", "cluster", cluster.UnknownLabel, "result", "unauthenticated"); got != 10000 {
		t.Fatalf("unknown = %v", got)
	}
	if len(r.Clusters()) != 0 {
		t.Fatal("an unknown cluster was remembered")
	}
}

func TestRouterSetRules(t *testing.T) {
	b := newAPIServer(t, "b-token", "shop", "cart")
	r, reg := newRouter(t, cluster.Config{LocalID: "a", Local: &localAuth{}, MaxClusters: 2})
	if err := r.Set("a", b.config(), "s1"); err == nil {
		t.Fatal("the local ID configured as remote")
	}
	if err := r.Set("bad id", b.config(), "s1"); err == nil {
		t.Fatal("an invalid ID configured")
	}
	if err := r.Set("b", b.config(), "s1"); err != nil {
		t.Fatal(err)
	}
	if err := r.Set("b", b.config(), "s2"); err == nil || !strings.Contains(err.Error(), "s1") {
		t.Fatalf("another owner replaced b: %v", err)
	}
	if err := r.Set("b", b.config(), "s1"); err != nil {
		t.Fatalf("the owner replacing b: %v", err)
	}
	if err := r.Invalidate("c", "s2"); err != nil {
		t.Fatal(err)
	}
	if got := testkit.Metric(t, reg, "meshid_ca_remote_cluster_state", "cluster", "c", "state", cluster.StateInvalid); got != 1 {
		t.Fatalf("c invalid = %v", got)
	}
	if err := r.Set("d", b.config(), "s3"); err == nil {
		t.Fatal("a third cluster past MaxClusters 2")
	}
	r.Remove("b", "s2") // not its owner
	if len(r.Clusters()) != 1 {
		t.Fatal("a non-owner removed b")
	}
	r.Remove("b", "s1")
	if len(r.Clusters()) != 0 {
		t.Fatal("b not removed")
	}
	_, err := r.Authenticate(context.Background(), authn.Credentials{Token: "b-token", ClusterID: "b"})
	if ca.KindOf(err) != ca.KindUnauthenticated || !strings.Contains(err.Error(), "unknown cluster") {
		t.Fatalf("removed cluster: %v", err)
	}
}

func TestRouterAuthorizeByCluster(t *testing.T) {
	b := newAPIServer(t, "b-token", "shop", "cart")
	r, _ := newRouter(t, cluster.Config{Local: &localAuth{}})
	if err := r.Set("b", b.config(), "test"); err != nil {
		t.Fatal(err)
	}
	target := spiffeid.RequireFromString("spiffe://cluster.local/ns/shop/sa/cart")
	for _, c := range []*authn.Caller{{Namespace: "x", ServiceAccount: "y"}, {Namespace: "x", ServiceAccount: "y", Cluster: "b"}, {Cluster: "gone"}} {
		if err := r.Authorize(context.Background(), c, target); ca.KindOf(err) != ca.KindPermissionDenied {
			t.Fatalf("caller %+v: %v, want PermissionDenied", c, err)
		}
	}
}

// TestRouterProbeTimeout: a remote API server that never answers is shown
// unreachable once ProbeTimeout has passed.
func TestRouterProbeTimeout(t *testing.T) {
	stop := make(chan struct{})
	hang := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(stop) }) // runs first: lets Close return
	r, reg := newRouter(t, cluster.Config{ProbeTimeout: 50 * time.Millisecond})
	rc := &rest.Config{Host: hang.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	if err := r.Set("b", rc, "test"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testkit.Guard)
	for testkit.Metric(t, reg, "meshid_ca_remote_cluster_state", "cluster", "b", "state", cluster.StateUnreachable) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the hanging cluster never shown unreachable")
		}
		runtime.Gosched()
	}
}

// A remote API server's flow control rejecting the CA's reviews (429) is
// named in the Unavailable the caller gets, as for the local cluster: the
// remote TokenReview client reports its 429s (ca/kubeclient).
func TestRemoteThrottlingNamed(t *testing.T) {
	var throttled atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		throttled.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429}`))
	}))
	t.Cleanup(srv.Close)
	b := &apiServer{srv: srv}
	r, _ := newRouter(t, cluster.Config{LocalID: "a", Local: &localAuth{}})
	if err := r.Set("b", b.config(), "test"); err != nil {
		t.Fatal(err)
	}
	_, err := r.Authenticate(context.Background(), authn.Credentials{Token: "b-token", ClusterID: "b"})
	var e *ca.Error
	if !errors.As(err, &e) || e.Kind != ca.KindUnavailable || !strings.Contains(e.Msg, "the Kubernetes API server throttled the review (HTTP 429, ") {
		t.Fatalf("err %v, want Unavailable naming the throttling", err)
	}
	if throttled.Load() == 0 {
		t.Fatal("the remote API server answered nothing")
	}
}
