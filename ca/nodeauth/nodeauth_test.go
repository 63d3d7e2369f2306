package nodeauth_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	k8stesting "k8s.io/client-go/testing"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/ca/nodeauth"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/testkit"
)

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

var ztunnelSA = identity.ServiceAccount{Namespace: "istio-system", Name: "ztunnel"}

func pod(ns, name, sa, node string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns, UID: types.UID("uid-" + ns + "-" + name),
			Annotations: map[string]string{"big": strings.Repeat("x", 4096)},
			Labels:      map[string]string{"app": name},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa, NodeName: node,
			Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10", Args: []string{strings.Repeat("y", 1024)}}},
		},
		Status: corev1.PodStatus{Phase: phase},
	}
}

// ztunnel is the node agent's pod on node-a and a caller bound to it.
var ztunnelPod = pod("istio-system", "ztunnel-a", "ztunnel", "node-a", corev1.PodRunning)

func ztunnelCaller(method string) *authn.Caller {
	return &authn.Caller{Namespace: "istio-system", ServiceAccount: "ztunnel", PodName: ztunnelPod.Name, PodUID: string(ztunnelPod.UID), NodeName: "node-a", Method: method}
}

func cluster() []k8sruntime.Object {
	return []k8sruntime.Object{
		ztunnelPod,
		pod("istio-system", "ztunnel-b", "ztunnel", "node-b", corev1.PodRunning),
		pod("istio-system", "ztunnel-done", "ztunnel", "node-a", corev1.PodSucceeded),
		pod("istio-system", "ztunnel-pending", "ztunnel", "", corev1.PodPending),
		pod("prod", "web-a", "web", "node-a", corev1.PodRunning),
		pod("prod", "db-b", "db", "node-b", corev1.PodRunning),
		pod("prod", "job-a", "batch", "node-a", corev1.PodSucceeded),
		pod("prod", "crash-a", "crash", "node-a", corev1.PodFailed),
		pod("prod", "unscheduled", "queued", "", corev1.PodPending),
		pod("istio-system", "other-agent", "not-trusted", "node-a", corev1.PodRunning),
	}
}

func id(ns, sa string) spiffeid.ID { return spiffeid.RequireFromSegments(td, "ns", ns, "sa", sa) }

func newAuthorizer(t *testing.T, client *fake.Clientset, reg prometheus.Registerer) *nodeauth.Authorizer {
	t.Helper()
	a, err := nodeauth.New(nodeauth.Config{TrustedAccounts: []identity.ServiceAccount{ztunnelSA}, Client: client, TrustDomain: td, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// synced runs a's informer until the test ends and waits until it synced.
func synced(t *testing.T, a *nodeauth.Authorizer) {
	t.Helper()
	testkit.Run(t, "node authorizer", a.Run)
	waitFor(t, "the pod informer to sync", func() bool { return a.HasSynced() })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, testkit.Guard, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func TestNewValidates(t *testing.T) {
	client := fake.NewClientset()
	for name, cfg := range map[string]nodeauth.Config{
		"no trusted account": {Client: client, TrustDomain: td},
		"no client":          {TrustedAccounts: []identity.ServiceAccount{ztunnelSA}, TrustDomain: td},
		"no trust domain":    {TrustedAccounts: []identity.ServiceAccount{ztunnelSA}, Client: client},
		"bad account":        {TrustedAccounts: []identity.ServiceAccount{{Namespace: "..", Name: "x"}}, Client: client, TrustDomain: td},
		"empty account":      {TrustedAccounts: []identity.ServiceAccount{{}}, Client: client, TrustDomain: td},
		"negative timeout":   {TrustedAccounts: []identity.ServiceAccount{ztunnelSA}, Client: client, TrustDomain: td, LookupTimeout: -time.Second},
	} {
		if _, err := nodeauth.New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
}

// cases are the conditions of the issue, each with its expected outcome;
// they run once on a synced informer and once on direct API reads before
// the informer has synced.
var cases = []struct {
	name   string
	caller *authn.Caller
	id     spiffeid.ID
	kind   ca.Kind // -1 = allowed
	msg    string
	result string
}{
	{"pod on the caller's node", ztunnelCaller(authn.MethodTokenReview), id("prod", "web"), -1, "", nodeauth.ResultAllowed},
	{"offline JWT caller", ztunnelCaller(authn.MethodJWT), id("prod", "web"), -1, "", nodeauth.ResultAllowed},
	{"token without a node claim", func() *authn.Caller { c := ztunnelCaller(authn.MethodTokenReview); c.NodeName = ""; return c }(), id("prod", "web"), -1, "", nodeauth.ResultAllowed},
	{"the node agent itself", ztunnelCaller(authn.MethodTokenReview), id("istio-system", "ztunnel"), -1, "", nodeauth.ResultAllowed},
	{"pod only on the other node", ztunnelCaller(authn.MethodTokenReview), id("prod", "db"), ca.KindPermissionDenied, "condition 3", nodeauth.ResultNoPodOnNode},
	{"terminated pod (succeeded)", ztunnelCaller(authn.MethodTokenReview), id("prod", "batch"), ca.KindPermissionDenied, "condition 3", nodeauth.ResultNoPodOnNode},
	{"terminated pod (failed)", ztunnelCaller(authn.MethodTokenReview), id("prod", "crash"), ca.KindPermissionDenied, "condition 3", nodeauth.ResultNoPodOnNode},
	{"unscheduled pod", ztunnelCaller(authn.MethodTokenReview), id("prod", "queued"), ca.KindPermissionDenied, "condition 3", nodeauth.ResultNoPodOnNode},
	{"no such service account", ztunnelCaller(authn.MethodTokenReview), id("prod", "ghost"), ca.KindPermissionDenied, "condition 3", nodeauth.ResultNoPodOnNode},
	{"untrusted caller", &authn.Caller{Namespace: "istio-system", ServiceAccount: "not-trusted", PodName: "other-agent", PodUID: "uid-istio-system-other-agent", NodeName: "node-a", Method: authn.MethodTokenReview}, id("prod", "web"), ca.KindPermissionDenied, "condition 1", nodeauth.ResultUntrustedCaller},
	{"workload as caller", &authn.Caller{Namespace: "prod", ServiceAccount: "web", PodName: "web-a", PodUID: "uid-prod-web-a", NodeName: "node-a", Method: authn.MethodTokenReview}, id("prod", "db"), ca.KindPermissionDenied, "condition 1", nodeauth.ResultUntrustedCaller},
	{"trusted account with a client certificate", &authn.Caller{Namespace: "istio-system", ServiceAccount: "ztunnel", Method: authn.MethodClientCert}, id("prod", "web"), ca.KindPermissionDenied, "condition 1", nodeauth.ResultUntrustedCaller},
	{"unknown method", func() *authn.Caller { c := ztunnelCaller(""); return c }(), id("prod", "web"), ca.KindPermissionDenied, "condition 1", nodeauth.ResultUntrustedCaller},
	{"no caller", nil, id("prod", "web"), ca.KindPermissionDenied, "condition 1", nodeauth.ResultUntrustedCaller},
	{"token not bound to a pod", &authn.Caller{Namespace: "istio-system", ServiceAccount: "ztunnel", NodeName: "node-a", Method: authn.MethodTokenReview}, id("prod", "web"), ca.KindPermissionDenied, "condition 2", nodeauth.ResultUnboundCaller},
	{"pod name without UID", func() *authn.Caller { c := ztunnelCaller(authn.MethodJWT); c.PodUID = ""; return c }(), id("prod", "web"), ca.KindPermissionDenied, "condition 2", nodeauth.ResultUnboundCaller},
	{"caller's pod deleted", func() *authn.Caller { c := ztunnelCaller(authn.MethodJWT); c.PodName = "ztunnel-gone"; return c }(), id("prod", "web"), ca.KindPermissionDenied, "condition 2", nodeauth.ResultUnboundCaller},
	{"caller's pod replaced (UID)", func() *authn.Caller { c := ztunnelCaller(authn.MethodJWT); c.PodUID = "old-uid"; return c }(), id("prod", "web"), ca.KindPermissionDenied, "condition 2", nodeauth.ResultUnboundCaller},
	{"caller's pod terminated", func() *authn.Caller {
		return &authn.Caller{Namespace: "istio-system", ServiceAccount: "ztunnel", PodName: "ztunnel-done", PodUID: "uid-istio-system-ztunnel-done", Method: authn.MethodJWT}
	}(), id("prod", "web"), ca.KindPermissionDenied, "condition 2", nodeauth.ResultUnboundCaller},
	{"caller's pod unscheduled", func() *authn.Caller {
		return &authn.Caller{Namespace: "istio-system", ServiceAccount: "ztunnel", PodName: "ztunnel-pending", PodUID: "uid-istio-system-ztunnel-pending", Method: authn.MethodJWT}
	}(), id("prod", "web"), ca.KindPermissionDenied, "condition 2", nodeauth.ResultUnboundCaller},
	{"token's node differs from the pod's", func() *authn.Caller { c := ztunnelCaller(authn.MethodJWT); c.NodeName = "node-b"; return c }(), id("prod", "web"), ca.KindPermissionDenied, "condition 2", nodeauth.ResultUnboundCaller},
	{"caller bound to another account's pod", func() *authn.Caller {
		return &authn.Caller{Namespace: "istio-system", ServiceAccount: "ztunnel", PodName: "other-agent", PodUID: "uid-istio-system-other-agent", NodeName: "node-a", Method: authn.MethodJWT}
	}(), id("prod", "web"), ca.KindPermissionDenied, "condition 2", nodeauth.ResultUnboundCaller},
	{"another trust domain", ztunnelCaller(authn.MethodTokenReview), spiffeid.RequireFromString("spiffe://evil.example/ns/prod/sa/web"), ca.KindPermissionDenied, "condition 4", nodeauth.ResultForeignIdentity},
	{"not a workload path", ztunnelCaller(authn.MethodTokenReview), spiffeid.RequireFromString("spiffe://cluster.local/ns/prod/sa/web/extra"), ca.KindPermissionDenied, "condition 4", nodeauth.ResultForeignIdentity},
	{"trust domain only", ztunnelCaller(authn.MethodTokenReview), spiffeid.RequireFromString("spiffe://cluster.local"), ca.KindPermissionDenied, "condition 4", nodeauth.ResultForeignIdentity},
}

func TestAuthorize(t *testing.T) {
	for _, mode := range []string{"synced informer", "before sync"} {
		t.Run(mode, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			a := newAuthorizer(t, fake.NewClientset(cluster()...), reg)
			if mode == "synced informer" {
				synced(t, a)
			} else if a.HasSynced() {
				t.Fatal("synced without Run")
			}
			want := map[string]float64{}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					err := a.Authorize(context.Background(), tc.caller, tc.id)
					want[tc.result]++
					if tc.kind < 0 {
						if err != nil {
							t.Fatalf("refused: %v", err)
						}
						return
					}
					if err == nil {
						t.Fatal("allowed")
					}
					var e *ca.Error
					if !errors.As(err, &e) || e.Kind != tc.kind || !strings.Contains(e.Msg, tc.msg) {
						t.Fatalf("error %v, want kind %v with %q", err, tc.kind, tc.msg)
					}
				})
			}
			for r, n := range want {
				if got := testkit.Metric(t, reg, "meshid_ca_impersonations_total", "result", r); got != n {
					t.Errorf("meshid_ca_impersonations_total{result=%q} = %v, want %v", r, got, n)
				}
			}
		})
	}
}

// TestPodChanges: a pod scheduled later becomes impersonable as soon as
// the informer sees it, and stops being so when it is deleted or
// terminates.
func TestPodChanges(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(cluster()...)
	a := newAuthorizer(t, client, nil)
	synced(t, a)
	caller := ztunnelCaller(authn.MethodTokenReview)
	late := id("prod", "late")
	if err := a.Authorize(ctx, caller, late); ca.KindOf(err) != ca.KindPermissionDenied {
		t.Fatalf("before the pod exists: %v", err)
	}
	p := pod("prod", "late-a", "late", "node-a", corev1.PodPending)
	if _, err := client.CoreV1().Pods("prod").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new pod to be impersonable", func() bool { return a.Authorize(ctx, caller, late) == nil })
	p.Status.Phase = corev1.PodSucceeded
	if _, err := client.CoreV1().Pods("prod").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the terminated pod to stop being impersonable", func() bool { return a.Authorize(ctx, caller, late) != nil })
	p.Status.Phase = corev1.PodRunning // (not a real transition; shows the delete below is what refuses)
	if _, err := client.CoreV1().Pods("prod").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pod to be impersonable again", func() bool { return a.Authorize(ctx, caller, late) == nil })
	if err := client.CoreV1().Pods("prod").Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted pod to stop being impersonable", func() bool {
		return ca.KindOf(a.Authorize(ctx, caller, late)) == ca.KindPermissionDenied
	})
	// The node agent's own pod deleted: nothing more is impersonable.
	if err := client.CoreV1().Pods("istio-system").Delete(ctx, ztunnelPod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted node agent to lose impersonation", func() bool {
		err := a.Authorize(ctx, caller, id("prod", "web"))
		return err != nil && strings.Contains(err.Error(), "condition 2")
	})
}

// TestUnavailableBeforeSync: with the API server failing, the informer
// never syncs and every decision that needs a pod is Unavailable, never
// PermissionDenied (the pods were not judged); condition 1 still refuses
// an untrusted caller at once.
func TestUnavailableBeforeSync(t *testing.T) {
	client := fake.NewClientset(cluster()...)
	client.PrependReactor("*", "pods", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	reg := prometheus.NewRegistry()
	a := newAuthorizer(t, client, reg)
	testkit.Run(t, "node authorizer", a.Run)
	ctx := context.Background()
	err := a.Authorize(ctx, ztunnelCaller(authn.MethodTokenReview), id("prod", "web"))
	if ca.KindOf(err) != ca.KindUnavailable || a.HasSynced() {
		t.Fatalf("Authorize = %v (synced %v), want Unavailable", err, a.HasSynced())
	}
	var e *ca.Error
	if !errors.As(err, &e) || strings.Contains(e.Msg, "connection refused") {
		t.Fatalf("the caller's message %q should not carry the API error", e.Msg)
	}
	if got := testkit.Metric(t, reg, "meshid_ca_impersonations_total", "result", nodeauth.ResultUnavailable); got != 1 {
		t.Fatalf("unavailable count = %v", got)
	}
	untrusted := &authn.Caller{Namespace: "prod", ServiceAccount: "web", PodName: "web-a", PodUID: "uid-prod-web-a", Method: authn.MethodTokenReview}
	if err := a.Authorize(ctx, untrusted, id("prod", "db")); ca.KindOf(err) != ca.KindPermissionDenied {
		t.Fatalf("untrusted caller during the outage: %v", err)
	}
}

// TestTransformKeepsLittle: the informer's copy of a pod holds only what
// authorization reads.
func TestTransformKeepsLittle(t *testing.T) {
	a := newAuthorizer(t, fake.NewClientset(cluster()...), nil)
	synced(t, a)
	for _, p := range nodeauth.StoredPods(a) {
		if p.Name == "" || p.Namespace == "" || p.UID == "" || p.ServiceAccount == "" || p.Phase == "" {
			t.Errorf("pod %s/%s lost a field it needs: %+v", p.Namespace, p.Name, p)
		}
		if p.Extra != 0 {
			t.Errorf("pod %s/%s keeps more than it needs: %+v", p.Namespace, p.Name, p)
		}
	}
	if n := len(nodeauth.StoredPods(a)); n != len(cluster()) {
		t.Fatalf("%d pods stored, want %d", n, len(cluster()))
	}
}

// TestRepeatedRequestsDoNotGrowMemory: 10,000 impersonation requests, each
// for a different identity (an attacker rotating names), leave nothing
// behind: the authorizer keeps no per-request state.
func TestRepeatedRequestsDoNotGrowMemory(t *testing.T) {
	a := newAuthorizer(t, fake.NewClientset(cluster()...), prometheus.NewRegistry())
	synced(t, a)
	ctx := context.Background()
	caller := ztunnelCaller(authn.MethodTokenReview)
	run := func(n int) {
		for i := range n {
			var want spiffeid.ID
			switch i % 3 {
			case 0:
				want = id("prod", "web")
			case 1:
				want = id("prod", "sa-"+strconv.Itoa(i))
			default:
				want = id("ns-"+strconv.Itoa(i), strings.Repeat("a", 200))
			}
			err := a.Authorize(ctx, caller, want)
			if (i%3 == 0) != (err == nil) {
				t.Fatalf("request %d for %s: %v", i, want, err)
			}
		}
	}
	run(1000) // warm up
	before := heap()
	run(10000)
	after := heap()
	if grown := int64(after) - int64(before); grown > 512<<10 {
		t.Fatalf("the heap grew by %d KiB over 10,000 requests", grown>>10)
	}
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
