package certservice_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/ca/nodeauth"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/testkit"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// callers is an Authenticator for handler tests: each token stands for a
// fixed caller, as TokenReview would answer it. The real TokenReview and
// node authorization against a real API server are in test/kube.
type callers map[string]authn.Caller

func (c callers) Authenticate(_ context.Context, cr authn.Credentials) (*authn.Caller, error) {
	if v, ok := c[cr.Token]; ok {
		return &v, nil
	}
	return nil, ca.Errorf(ca.KindUnauthenticated, "unknown token")
}

var ambientCallers = callers{
	"ztunnel-a": {Namespace: "istio-system", ServiceAccount: "ztunnel", PodName: "ztunnel-a", PodUID: "uid-ztunnel-a", NodeName: "node-a", Method: authn.MethodTokenReview},
	"unbound":   {Namespace: "istio-system", ServiceAccount: "ztunnel", Method: authn.MethodTokenReview},
	"web":       {Namespace: "prod", ServiceAccount: "web", PodName: "web-a", PodUID: "uid-web-a", NodeName: "node-a", Method: authn.MethodTokenReview},
}

func ambientPod(ns, name, sa, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{ServiceAccountName: sa, NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

type ambientEnv struct {
	*env
	logs    *testkit.LogRecorder // the CA's audit log
	srvLogs *testkit.LogRecorder // the server's failure log
}

// newAmbientEnv runs a CA whose callers are ambientCallers; with nodeMode,
// node authorization (a real nodeauth.Authorizer over a fake clientset of
// pods on node-a and node-b) trusts istio-system/ztunnel.
// With recordLogs, the CA's and the server's logs are kept (every line,
// so not for a 10,000-request test).
func newAmbientEnv(t *testing.T, nodeMode, recordLogs bool) ambientEnv {
	t.Helper()
	logs, srvLogs := testkit.NewLogRecorder(), testkit.NewLogRecorder()
	var na *nodeauth.Authorizer
	e := newEnv(t, envOpts{
		caCfg: func(c *ca.Config) {
			if recordLogs {
				c.Logger = logs.Logger()
			}
		},
		auths: func(e *env) []authn.Authenticator { return []authn.Authenticator{ambientCallers} },
		cfg: func(c *certservice.Config) {
			if recordLogs {
				c.Logger = srvLogs.Logger()
			}
			if !nodeMode {
				return
			}
			client := fake.NewClientset(
				ambientPod("istio-system", "ztunnel-a", "ztunnel", "node-a"),
				ambientPod("prod", "web-a", "web", "node-a"),
				ambientPod("prod", "db-b", "db", "node-b"),
			)
			var err error
			na, err = nodeauth.New(nodeauth.Config{
				TrustedAccounts: []identity.ServiceAccount{{Namespace: "istio-system", Name: "ztunnel"}},
				Client:          client, TrustDomain: td, Registerer: c.Registerer,
			})
			if err != nil {
				t.Fatal(err)
			}
			c.NodeAuthorizer = na
		},
	})
	if na != nil {
		testkit.Run(t, "node authorizer", na.Run)
		waitUntil(t, na.HasSynced)
	}
	return ambientEnv{env: e, logs: logs, srvLogs: srvLogs}
}

func waitUntil(t testing.TB, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, testkit.Guard, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatal(err)
	}
}

// impersonationRequest asks, with token, for a certificate whose CSR
// carries san (none when empty) and whose metadata is md.
func impersonationRequest(t testing.TB, san string, md map[string]any) *securityv1alpha1.IstioCertificateRequest {
	t.Helper()
	s, err := structpb.NewStruct(md)
	if err != nil {
		t.Fatal(err)
	}
	return &securityv1alpha1.IstioCertificateRequest{Csr: csrWithURI(t, san), Metadata: s}
}

var csrKey = map[string]string{}

func csrWithURI(t testing.TB, san string) string {
	t.Helper()
	if pem, ok := csrKey[san]; ok {
		return pem
	}
	mod := func(r *x509.CertificateRequest) { r.URIs = nil }
	if san != "" {
		u, err := url.Parse(san)
		if err != nil {
			t.Fatal(err)
		}
		mod = func(r *x509.CertificateRequest) { r.URIs = []*url.URL{u} }
	}
	pem := csrFor(t, testkit.Key(t, certs.ECP256), sid("x", "y"), mod)
	csrKey[san] = pem
	return pem
}

func TestImpersonation(t *testing.T) {
	e := newAmbientEnv(t, true, true)
	c := e.client(t, "localhost", nil)
	web, db, ztunnel := sid("prod", "web").String(), sid("prod", "db").String(), sid("istio-system", "ztunnel").String()
	huge := "spiffe://cluster.local/ns/prod/sa/" + strings.Repeat("a", 200<<10)
	cases := []struct {
		name, token, san string
		md               map[string]any
		want             codes.Code
		msg              string
	}{
		{"pod on the caller's node", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": web, "ClusterID": "Kubernetes"}, codes.OK, ""},
		{"no impersonation: own identity", "ztunnel-a", ztunnel, nil, codes.OK, ""},
		{"empty value is no impersonation", "ztunnel-a", ztunnel, map[string]any{"ImpersonatedIdentity": ""}, codes.OK, ""},
		{"pod only on the other node", "ztunnel-a", db, map[string]any{"ImpersonatedIdentity": db}, codes.PermissionDenied, "condition 3"},
		{"untrusted caller", "web", db, map[string]any{"ImpersonatedIdentity": db}, codes.PermissionDenied, "condition 1"},
		{"untrusted caller, own node's pod", "web", web, map[string]any{"ImpersonatedIdentity": web}, codes.PermissionDenied, "condition 1"},
		{"token not bound to a pod", "unbound", web, map[string]any{"ImpersonatedIdentity": web}, codes.PermissionDenied, "condition 2"},
		{"CSR SAN is not the impersonated identity", "ztunnel-a", ztunnel, map[string]any{"ImpersonatedIdentity": web}, codes.PermissionDenied, "condition 4"},
		{"CSR SAN is another pod", "ztunnel-a", db, map[string]any{"ImpersonatedIdentity": web}, codes.PermissionDenied, "condition 4"},
		{"CSR without SAN", "ztunnel-a", "", map[string]any{"ImpersonatedIdentity": web}, codes.InvalidArgument, "exactly one URI SAN"},
		{"another trust domain", "ztunnel-a", "spiffe://evil.example/ns/prod/sa/web", map[string]any{"ImpersonatedIdentity": "spiffe://evil.example/ns/prod/sa/web"}, codes.PermissionDenied, "condition 4"},
		{"not a workload path", "ztunnel-a", "spiffe://cluster.local/admin", map[string]any{"ImpersonatedIdentity": "spiffe://cluster.local/admin"}, codes.PermissionDenied, "condition 4"},
		{"huge value", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": huge}, codes.InvalidArgument, "2048-byte limit"},
		{"just over the limit", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": web + strings.Repeat("a", 2049-len(web))}, codes.InvalidArgument, "2048-byte limit"},
		{"at the limit: read, and quoted clipped", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": web + strings.Repeat("a", 2048-len(web))}, codes.PermissionDenied, "names " + (web + strings.Repeat("a", 2048))[:128] + "..."},
		{"not a SPIFFE ID", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": "prod/web"}, codes.InvalidArgument, "not a SPIFFE ID"},
		{"dot segments", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": "spiffe://cluster.local/ns/prod/sa/../../ns/kube-system/sa/admin"}, codes.InvalidArgument, "not a SPIFFE ID"},
		{"https scheme", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": "https://cluster.local/ns/prod/sa/web"}, codes.InvalidArgument, "not a SPIFFE ID"},
		{"upper-case scheme", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": "SPIFFE://cluster.local/ns/prod/sa/web"}, codes.InvalidArgument, "not a SPIFFE ID"},
		{"trailing newline", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": web + "\n"}, codes.InvalidArgument, "not a SPIFFE ID"},
		{"number", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": 1.0}, codes.InvalidArgument, "must be a string"},
		{"null", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": nil}, codes.InvalidArgument, "must be a string"},
		{"list", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": []any{web}}, codes.InvalidArgument, "must be a string"},
		{"struct", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": map[string]any{"id": web}}, codes.InvalidArgument, "must be a string"},
		{"lower-case key", "ztunnel-a", web, map[string]any{"impersonatedidentity": web}, codes.InvalidArgument, "case-sensitive"},
		{"upper-case key", "ztunnel-a", web, map[string]any{"IMPERSONATEDIDENTITY": web}, codes.InvalidArgument, "case-sensitive"},
		{"camel-case key", "ztunnel-a", web, map[string]any{"impersonatedIdentity": web}, codes.InvalidArgument, "case-sensitive"},
		{"both spellings", "ztunnel-a", web, map[string]any{"ImpersonatedIdentity": web, "impersonatedidentity": web}, codes.InvalidArgument, "case-sensitive"},
		{"look-alike key is ignored", "ztunnel-a", web, map[string]any{"Impersonated-Identity": web, "ImpersonatedIdentity ": web}, codes.PermissionDenied, "caller is"},
	}
	allowed := 0.0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.CreateCertificate(withToken(context.Background(), tc.token), impersonationRequest(t, tc.san, tc.md))
			if got := status.Code(err); got != tc.want || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("code %v (%v), want %v with %q", got, err, tc.want, tc.msg)
			}
			if len(status.Convert(err).Message()) > 1024 {
				t.Fatalf("the message echoes %d bytes of input", len(status.Convert(err).Message()))
			}
		})
		if tc.want == codes.OK && tc.md["ImpersonatedIdentity"] != nil && tc.md["ImpersonatedIdentity"] != "" {
			allowed++
		}
	}
	if got := testkit.Metric(t, e.reg, "meshid_ca_impersonations_total", "result", nodeauth.ResultAllowed); got != allowed {
		t.Errorf("allowed impersonations = %v, want %v (a refused CSR must not count)", got, allowed)
	}

	// The issued certificate is the workload's, and the audit line names
	// both the node agent and the workload.
	resp, err := c.CreateCertificate(withToken(context.Background(), "ztunnel-a"), impersonationRequest(t, web, map[string]any{"ImpersonatedIdentity": web}))
	if err != nil {
		t.Fatal(err)
	}
	verifyChain(t, resp.CertChain, e.authority.Bundle().Roots, 0, web)
	want := "spiffe_id=" + web + " caller=istio-system/ztunnel (tokenreview) impersonating, from pod istio-system/ztunnel-a"
	if e.logs.CountContaining(want) < 2 {
		t.Fatalf("no audit line with %q in:\n%s", want, e.logs.All())
	}
	if n := e.srvLogs.CountContaining("impersonated_identity=" + db); n < 1 {
		t.Fatalf("the refusal log does not name the impersonated identity:\n%s", e.srvLogs.All())
	}
	if strings.Contains(e.srvLogs.All(), strings.Repeat("a", 200)) {
		t.Fatal("a refusal log carries the huge value")
	}
}

// TestImpersonationOff: without node authorization every impersonation is
// refused, even of the caller's own identity and even for a caller that
// would be trusted.
func TestImpersonationOff(t *testing.T) {
	e := newAmbientEnv(t, false, true)
	c := e.client(t, "localhost", nil)
	for _, tc := range []struct{ token, id string }{
		{"ztunnel-a", sid("prod", "web").String()},
		{"ztunnel-a", sid("istio-system", "ztunnel").String()},
		{"web", sid("prod", "web").String()},
	} {
		_, err := c.CreateCertificate(withToken(context.Background(), tc.token), impersonationRequest(t, tc.id, map[string]any{"ImpersonatedIdentity": tc.id}))
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "is off") {
			t.Fatalf("%s impersonating %s: %v, want PermissionDenied (off)", tc.token, tc.id, err)
		}
	}
	// A typed nil Authorizer (a wiring mistake) refuses too.
	var na *nodeauth.Authorizer
	if err := na.Authorize(context.Background(), &authn.Caller{}, sid("prod", "web")); ca.KindOf(err) != ca.KindPermissionDenied {
		t.Fatalf("nil Authorizer: %v", err)
	}
}

// TestImpersonationRepeated sends 10,000 impersonation requests an
// attacker might (an untrusted caller, names it rotates, a huge value) and
// checks the CA's heap does not grow with them.
func TestImpersonationRepeated(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 requests")
	}
	e := newAmbientEnv(t, true, false)
	c := e.client(t, "localhost", nil)
	web := sid("prod", "web").String()
	reqs := []struct {
		token string
		req   *securityv1alpha1.IstioCertificateRequest
		want  codes.Code
	}{
		{"web", impersonationRequest(t, web, map[string]any{"ImpersonatedIdentity": web}), codes.PermissionDenied},
		{"ztunnel-a", impersonationRequest(t, web, map[string]any{"ImpersonatedIdentity": strings.Repeat("x", 4096)}), codes.InvalidArgument},
		{"ztunnel-a", impersonationRequest(t, sid("prod", "db").String(), map[string]any{"ImpersonatedIdentity": sid("prod", "db").String()}), codes.PermissionDenied},
	}
	send := func(n int) {
		for i := range n {
			r := reqs[i%len(reqs)]
			if _, err := c.CreateCertificate(withToken(context.Background(), r.token), r.req); status.Code(err) != r.want {
				t.Fatalf("request %d: %v, want %v", i, err, r.want)
			}
		}
	}
	send(500)
	before := heapAlloc()
	send(10000)
	if grown := int64(heapAlloc()) - int64(before); grown > 2<<20 {
		t.Fatalf("the heap grew by %d KiB over 10,000 refused impersonations", grown>>10)
	}
	if got := testkit.Metric(t, e.reg, "meshid_ca_impersonations_total", "result", nodeauth.ResultUntrustedCaller); got < 3500 {
		t.Fatalf("untrusted-caller refusals counted %v", got)
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkImpersonationBurst plays ztunnel starting on a node with 100
// pods (100 service accounts): 8 concurrent CreateCertificate calls over
// one gRPC+TLS connection, each naming a workload in ImpersonatedIdentity,
// P-256 CSRs made beforehand, authentication answered as from a warm
// TokenReview cache, node authorization on a synced informer. "own" is
// the same node agent asking for its own identity, for comparison.
func BenchmarkImpersonationBurst(b *testing.B) {
	const pods, concurrency = 100, 8
	objs := []k8sruntime.Object{ambientPod("istio-system", "ztunnel-a", "ztunnel", "node-a")}
	for i := range pods {
		objs = append(objs, ambientPod("burst", fmt.Sprintf("app-%d", i), fmt.Sprintf("sa-%d", i), "node-a"))
	}
	na, err := nodeauth.New(nodeauth.Config{
		TrustedAccounts: []identity.ServiceAccount{{Namespace: "istio-system", Name: "ztunnel"}},
		Client:          fake.NewClientset(objs...), TrustDomain: td,
	})
	if err != nil {
		b.Fatal(err)
	}
	testkit.Run(b, "node authorizer", na.Run)
	waitUntil(b, na.HasSynced)
	e := newEnv(b, envOpts{
		auths: func(*env) []authn.Authenticator { return []authn.Authenticator{ambientCallers} },
		cfg:   func(c *certservice.Config) { c.NodeAuthorizer = na },
	})
	imp := make([]*securityv1alpha1.IstioCertificateRequest, pods)
	own := make([]*securityv1alpha1.IstioCertificateRequest, pods)
	for i := range pods {
		id := sid("burst", fmt.Sprintf("sa-%d", i)).String()
		imp[i] = impersonationRequest(b, id, map[string]any{certservice.ImpersonatedIdentityKey: id})
		own[i] = &securityv1alpha1.IstioCertificateRequest{Csr: csrFor(b, testkit.Key(b, certs.ECP256), sid("istio-system", "ztunnel"), nil)}
	}
	c := e.client(b, "localhost", nil)
	ctx := withToken(context.Background(), "ztunnel-a")
	for _, run := range []struct {
		name string
		reqs []*securityv1alpha1.IstioCertificateRequest
	}{{"impersonated", imp}, {"own", own}} {
		reqs := run.reqs
		b.Run(run.name, func(b *testing.B) {
			if _, err := c.CreateCertificate(ctx, reqs[0]); err != nil {
				b.Fatal(err)
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, concurrency)
			b.ResetTimer()
			for range concurrency {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := next.Add(1); n <= int64(b.N); n = next.Add(1) {
						if _, err := c.CreateCertificate(ctx, reqs[int(n)%len(reqs)]); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			select {
			case err := <-errs:
				b.Fatal(err)
			default:
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
		})
	}
}
