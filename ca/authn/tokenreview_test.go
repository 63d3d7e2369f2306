package authn_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// fakeAPI is a Kubernetes API server that answers TokenReviews with
// answer(token, audiences).
type fakeAPI struct {
	calls  atomic.Int32
	answer func(token string, aud []string) (authenticationv1.TokenReviewStatus, error)
}

func (f *fakeAPI) client() *fake.Clientset {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.calls.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		st, err := f.answer(tr.Spec.Token, tr.Spec.Audiences)
		if err != nil {
			return true, nil, err
		}
		out := tr.DeepCopy()
		out.Status = st
		return true, out, nil
	})
	return cs
}

// saStatus is what the API server says for a valid projected token.
func saStatus(ns, sa string, aud ...string) authenticationv1.TokenReviewStatus {
	return authenticationv1.TokenReviewStatus{
		Authenticated: true,
		User: authenticationv1.UserInfo{
			Username: "system:serviceaccount:" + ns + ":" + sa,
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			Extra: map[string]authenticationv1.ExtraValue{
				"authentication.kubernetes.io/pod-name":  {"web-0"},
				"authentication.kubernetes.io/pod-uid":   {"1234"},
				"authentication.kubernetes.io/node-name": {"node-a"},
			},
		},
		Audiences: aud,
	}
}

func newTokenReview(t *testing.T, api *fakeAPI, clk clock.Clock, size int) (*authn.TokenReview, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	tr, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: api.client(), CacheSize: size, Clock: clk, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return tr, reg
}

func TestTokenReviewDecisions(t *testing.T) {
	iss := newIssuer(t)
	token := mint(t, iss, "default", "web", []string{"istio-ca"}, time.Hour, t0)
	unavailable := []error{
		apierrors.NewInternalError(errors.New("etcd down")),
		apierrors.NewServiceUnavailable("shutting down"),
		apierrors.NewTimeoutError("slow", 1),
		apierrors.NewTooManyRequests("busy", 1),
		apierrors.NewForbidden(schema.GroupResource{Group: "authentication.k8s.io", Resource: "tokenreviews"}, "", errors.New("rbac")),
		fmt.Errorf("dial tcp 10.0.0.1:443: connect: connection refused"),
		context.DeadlineExceeded,
	}
	type tc struct {
		name   string
		status authenticationv1.TokenReviewStatus
		apiErr error
		kind   ca.Kind // 0 with accept
		accept bool
	}
	tests := []tc{
		{name: "accept", status: saStatus("default", "web", "istio-ca"), accept: true},
		{name: "accept with extra audience", status: saStatus("default", "web", "other", "istio-ca"), accept: true},
		{name: "wrong audience", status: saStatus("default", "web", "kubernetes"), kind: ca.KindUnauthenticated},
		{name: "audience unaware API server", status: saStatus("default", "web"), kind: ca.KindUnauthenticated},
		{name: "not authenticated", status: authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}, kind: ca.KindUnauthenticated},
		{name: "non-SA user", status: func() authenticationv1.TokenReviewStatus {
			s := saStatus("default", "web", "istio-ca")
			s.User.Username = "alice"
			return s
		}(), kind: ca.KindUnauthenticated},
		{name: "SA-looking user with extra colon", status: func() authenticationv1.TokenReviewStatus {
			s := saStatus("default", "web", "istio-ca")
			s.User.Username = "system:serviceaccount:default:web:x"
			return s
		}(), kind: ca.KindUnauthenticated},
		{name: "SA user without SA group", status: func() authenticationv1.TokenReviewStatus {
			s := saStatus("default", "web", "istio-ca")
			s.User.Groups = []string{"system:authenticated"}
			return s
		}(), kind: ca.KindUnauthenticated},
	}
	for i, e := range unavailable {
		tests = append(tests, tc{name: fmt.Sprintf("API error %d", i), apiErr: e, kind: ca.KindUnavailable})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var sentAud []string
			var sentTok string
			api := &fakeAPI{answer: func(tok string, aud []string) (authenticationv1.TokenReviewStatus, error) {
				sentTok, sentAud = tok, aud
				return tc.status, tc.apiErr
			}}
			tr, reg := newTokenReview(t, api, clock.NewFake(t0), 0)
			c, err := tr.Authenticate(context.Background(), authn.Credentials{Token: token})
			if sentTok != token || !slices.Equal(sentAud, []string{"istio-ca"}) {
				t.Fatalf("sent token ok=%v audiences %v", sentTok == token, sentAud)
			}
			if tc.accept {
				if err != nil {
					t.Fatal(err)
				}
				want := authn.Caller{Namespace: "default", ServiceAccount: "web", PodName: "web-0", PodUID: "1234", NodeName: "node-a", Method: "tokenreview", Expiry: t0.Add(time.Hour)}
				if !c.Expiry.Equal(want.Expiry) {
					t.Fatalf("expiry %v, want %v", c.Expiry, want.Expiry)
				}
				c.Expiry = want.Expiry
				if *c != want {
					t.Fatalf("caller %+v, want %+v", *c, want)
				}
				if got := testkit.Metric(t, reg, "meshid_ca_tokenreview_requests_total", "result", "authenticated"); got != 1 {
					t.Fatalf("authenticated count %v", got)
				}
				return
			}
			wantKind(t, err, tc.kind, token)
			// Unavailable answers are never cached: the next call asks again.
			before := api.calls.Load()
			_, err = tr.Authenticate(context.Background(), authn.Credentials{Token: token})
			wantKind(t, err, tc.kind, token)
			if tc.kind == ca.KindUnavailable && api.calls.Load() != before+1 {
				t.Fatalf("unavailable result was cached")
			}
		})
	}
}

func TestTokenReviewNoToken(t *testing.T) {
	api := &fakeAPI{}
	tr, _ := newTokenReview(t, api, nil, 0)
	if _, err := tr.Authenticate(context.Background(), authn.Credentials{}); !errors.Is(err, authn.ErrNoCredentials) {
		t.Fatalf("err %v, want ErrNoCredentials", err)
	}
	if api.calls.Load() != 0 {
		t.Fatal("API called without a token")
	}
}

func TestTokenReviewCache(t *testing.T) {
	iss := newIssuer(t)
	long := mint(t, iss, "ns", "long", []string{"istio-ca"}, time.Hour, t0)
	short := mint(t, iss, "ns", "short", []string{"istio-ca"}, 20*time.Second, t0)
	const opaque = "not-a-jwt-but-the-api-server-knows-it"
	tests := []struct {
		name     string
		token    string
		accept   bool
		hitUntil time.Duration // still cached at this age
		missAt   time.Duration // asked again at this age
	}{
		{"positive lives one minute", long, true, 59 * time.Second, 61 * time.Second},
		{"positive ends at token exp", short, true, 19 * time.Second, 21 * time.Second},
		{"opaque token one minute", opaque, true, 59 * time.Second, 61 * time.Second},
		{"negative lives a few seconds", long, false, 4 * time.Second, 6 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			api := &fakeAPI{answer: func(string, []string) (authenticationv1.TokenReviewStatus, error) {
				if tc.accept {
					return saStatus("ns", "sa", "istio-ca"), nil
				}
				return authenticationv1.TokenReviewStatus{}, nil
			}}
			clk := clock.NewFake(t0)
			tr, reg := newTokenReview(t, api, clk, 0)
			call := func() {
				t.Helper()
				_, err := tr.Authenticate(context.Background(), authn.Credentials{Token: tc.token})
				if tc.accept && err != nil {
					t.Fatal(err)
				}
				if !tc.accept {
					wantKind(t, err, ca.KindUnauthenticated, tc.token)
				}
			}
			call()
			clk.Set(t0.Add(tc.hitUntil))
			call()
			if n := api.calls.Load(); n != 1 {
				t.Fatalf("API calls %d after a cached call, want 1", n)
			}
			if got := testkit.Metric(t, reg, "meshid_ca_tokenreview_cache_hits_total"); got != 1 {
				t.Fatalf("cache hits %v, want 1", got)
			}
			clk.Set(t0.Add(tc.missAt))
			call()
			if n := api.calls.Load(); n != 2 {
				t.Fatalf("API calls %d after expiry, want 2", n)
			}
		})
	}
}

func TestTokenReviewCacheBounded(t *testing.T) {
	api := &fakeAPI{answer: func(string, []string) (authenticationv1.TokenReviewStatus, error) {
		return saStatus("ns", "sa", "istio-ca"), nil
	}}
	tr, _ := newTokenReview(t, api, clock.NewFake(t0), 2)
	for _, tok := range []string{"a", "b", "c", "c", "b", "a"} {
		if _, err := tr.Authenticate(context.Background(), authn.Credentials{Token: tok}); err != nil {
			t.Fatal(err)
		}
	}
	// a, b, c miss; c and b hit; a was evicted by c.
	if n := api.calls.Load(); n != 4 {
		t.Fatalf("API calls %d, want 4", n)
	}
}

func TestTokenReviewCallerNotShared(t *testing.T) {
	api := &fakeAPI{answer: func(string, []string) (authenticationv1.TokenReviewStatus, error) {
		return saStatus("ns", "sa", "istio-ca"), nil
	}}
	tr, _ := newTokenReview(t, api, clock.NewFake(t0), 0)
	c1, _ := tr.Authenticate(context.Background(), authn.Credentials{Token: "x"})
	c1.Namespace = "changed"
	c2, err := tr.Authenticate(context.Background(), authn.Credentials{Token: "x"})
	if err != nil || c2.Namespace != "ns" {
		t.Fatalf("cached caller was modified through a returned pointer: %+v %v", c2, err)
	}
}

func TestTokenReviewConfig(t *testing.T) {
	if _, err := authn.NewTokenReview(authn.TokenReviewConfig{}); err == nil {
		t.Fatal("no client accepted")
	}
	if _, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: fake.NewClientset(), CacheSize: -1}); err == nil {
		t.Fatal("negative cache size accepted")
	}
	if _, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: fake.NewClientset(), Audiences: []string{""}}); err == nil {
		t.Fatal("empty audience accepted")
	}
}

// A caller that goes away while its review is in flight gets Unavailable at
// once; the review itself completes and is cached for the next caller.
func TestTokenReviewCallerCancels(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	api := &fakeAPI{answer: func(string, []string) (authenticationv1.TokenReviewStatus, error) {
		once.Do(func() { close(entered) })
		<-release
		return saStatus("ns", "sa", "istio-ca"), nil
	}}
	tr, _ := newTokenReview(t, api, clock.NewFake(t0), 0)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := tr.Authenticate(ctx, authn.Credentials{Token: "opaque-4f1c"})
		errc <- err
	}()
	<-entered
	cancel()
	wantKind(t, <-errc, ca.KindUnavailable, "opaque-4f1c")

	got := make(chan error, 1)
	go func() {
		_, err := tr.Authenticate(context.Background(), authn.Credentials{Token: "opaque-4f1c"})
		got <- err
	}()
	close(release)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if n := api.calls.Load(); n != 1 {
		t.Fatalf("API calls %d, want 1", n)
	}
}

// lockFreeReviews answers TokenReview creates through api.answer without
// the fake clientset's reactor chain, which holds a mutex while a reactor
// runs: a caller blocked in answer must not block the others on that
// mutex, or synctest.Wait (which waits for durably blocked goroutines, and
// a mutex is not) would never return.
type lockFreeReviews struct {
	kubeclient.TokenReviewInterface
	api *fakeAPI
}

func (r lockFreeReviews) Create(_ context.Context, tr *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	r.api.calls.Add(1)
	st, err := r.api.answer(tr.Spec.Token, tr.Spec.Audiences)
	if err != nil {
		return nil, err
	}
	out := tr.DeepCopy()
	out.Status = st
	return out, nil
}

type lockFreeAuthn struct {
	kubeclient.AuthenticationV1Interface
	api *fakeAPI
}

func (a lockFreeAuthn) TokenReviews() kubeclient.TokenReviewInterface {
	return lockFreeReviews{a.AuthenticationV1Interface.TokenReviews(), a.api}
}

type lockFreeClient struct {
	kubeclient.Interface
	api *fakeAPI
}

func (c lockFreeClient) AuthenticationV1() kubeclient.AuthenticationV1Interface {
	return lockFreeAuthn{c.Interface.AuthenticationV1(), c.api}
}

// inBubble builds a TokenReview whose API answers through answer, inside a
// synctest bubble: synctest.Wait then returns once every caller is parked,
// either in the API call or waiting for another caller's review.
func inBubble(t *testing.T, answer func(string, []string) (authenticationv1.TokenReviewStatus, error)) (*authn.TokenReview, *fakeAPI) {
	t.Helper()
	api := &fakeAPI{answer: answer}
	tr, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: lockFreeClient{fake.NewClientset(), api}, Clock: clock.NewFake(t0)})
	if err != nil {
		t.Fatal(err)
	}
	return tr, api
}

// authenticateAll runs Authenticate for every token at once and returns
// their errors, in order, once release has been closed by the caller.
func authenticateAll(tr *authn.TokenReview, tokens []string) func() []error {
	errs := make([]error, len(tokens))
	var wg sync.WaitGroup
	for i, tok := range tokens {
		wg.Go(func() {
			_, errs[i] = tr.Authenticate(context.Background(), authn.Credentials{Token: tok})
		})
	}
	return func() []error { wg.Wait(); return errs }
}

// Reviews of the same token in flight at once are made once, whether the
// API server accepts the token or cannot answer; different tokens are not
// serialised behind each other.
func TestTokenReviewSingleFlight(t *testing.T) {
	const callers = 1000 // a restart storm's retries of one token
	t.Run("same token, accepted", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			tr, api := inBubble(t, func(string, []string) (authenticationv1.TokenReviewStatus, error) {
				<-release
				return saStatus("ns", "sa", "istio-ca"), nil
			})
			wait := authenticateAll(tr, slices.Repeat([]string{"opaque-same"}, callers))
			synctest.Wait() // every caller is parked
			if n := api.calls.Load(); n != 1 {
				t.Fatalf("%d API calls in flight for one token, want 1", n)
			}
			close(release)
			for i, err := range wait() {
				if err != nil {
					t.Fatalf("caller %d: %v", i, err)
				}
			}
			// The shared result was cached once: the next caller hits it.
			if _, err := tr.Authenticate(context.Background(), authn.Credentials{Token: "opaque-same"}); err != nil || api.calls.Load() != 1 {
				t.Fatalf("after the flight: err %v, %d API calls, want nil and 1", err, api.calls.Load())
			}
		})
	})
	t.Run("same token, API server failing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			tr, api := inBubble(t, func(string, []string) (authenticationv1.TokenReviewStatus, error) {
				<-release
				return authenticationv1.TokenReviewStatus{}, apierrors.NewServiceUnavailable("overloaded")
			})
			wait := authenticateAll(tr, slices.Repeat([]string{"opaque-same"}, callers))
			synctest.Wait()
			if n := api.calls.Load(); n != 1 {
				t.Fatalf("%d API calls in flight for one token, want 1", n)
			}
			close(release)
			for _, err := range wait() {
				wantKind(t, err, ca.KindUnavailable, "opaque-same")
			}
			// An error is not cached: the next caller asks again.
			_, _ = tr.Authenticate(context.Background(), authn.Credentials{Token: "opaque-same"})
			if n := api.calls.Load(); n != 2 {
				t.Fatalf("%d API calls after a failed flight, want 2", n)
			}
		})
	})
	t.Run("different tokens in parallel", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			tr, api := inBubble(t, func(string, []string) (authenticationv1.TokenReviewStatus, error) {
				<-release
				return saStatus("ns", "sa", "istio-ca"), nil
			})
			var tokens []string
			for i := range 50 {
				tokens = append(tokens, fmt.Sprintf("opaque-%d", i), fmt.Sprintf("opaque-%d", i))
			}
			wait := authenticateAll(tr, tokens)
			synctest.Wait()
			if n := api.calls.Load(); n != 50 {
				t.Fatalf("%d API calls in flight for 50 tokens (each sent twice), want 50", n)
			}
			close(release)
			for i, err := range wait() {
				if err != nil {
					t.Fatalf("caller %d: %v", i, err)
				}
			}
		})
	})
}

// Single-flight does not let the cache grow past its bound: a storm of
// distinct tokens through a small cache evicts, and the first token is
// reviewed again.
func TestTokenReviewSingleFlightKeepsCacheBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := &fakeAPI{answer: func(string, []string) (authenticationv1.TokenReviewStatus, error) {
			return saStatus("ns", "sa", "istio-ca"), nil
		}}
		tr, _ := newTokenReview(t, api, clock.NewFake(t0), 4)
		var tokens []string
		for i := range 200 {
			tokens = append(tokens, fmt.Sprintf("opaque-%d", i))
		}
		for i, err := range authenticateAll(tr, tokens)() {
			if err != nil {
				t.Fatalf("caller %d: %v", i, err)
			}
		}
		before := api.calls.Load()
		hits := 0
		for _, tok := range tokens {
			n := api.calls.Load()
			if _, err := tr.Authenticate(context.Background(), authn.Credentials{Token: tok}); err != nil {
				t.Fatal(err)
			}
			if api.calls.Load() == n {
				hits++
			}
		}
		if before != 200 || hits > 4 {
			t.Fatalf("%d reviews for 200 tokens (want 200), then %d of 200 answered from a cache of 4", before, hits)
		}
	})
}
