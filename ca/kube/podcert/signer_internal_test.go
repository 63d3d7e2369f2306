package podcert

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	metadatafake "k8s.io/client-go/metadata/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kube/election"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/certs"
)

const testSigner = "meshid.io/workload"

var testTD = spiffeid.RequireTrustDomainFromString("cluster.local")

// newAuthority is a real CA with a fresh self-signed root (made now: a
// CA younger than its backdating).
func newAuthority(t *testing.T) *ca.Authority {
	t.Helper()
	b, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: testTD.Name(), KeyType: certs.ECP256})
	if err != nil {
		t.Fatal(err)
	}
	a, err := ca.New(ca.Config{TrustDomain: testTD, Bundle: b})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// flaky fails its first n calls with err, then signs with the Authority.
type flaky struct {
	*ca.Authority
	n     atomic.Int32
	err   error
	calls atomic.Int32
}

func (f *flaky) Sign(ctx context.Context, req ca.Request) (*ca.Issued, error) {
	f.calls.Add(1)
	if f.n.Add(-1) >= 0 {
		return nil, f.err
	}
	return f.Authority.Sign(ctx, req)
}

// signerEnv is a Controller's signer on fake clients holding pod shop/app-0
// (service account app, node node-a, a volume of the signer).
type signerEnv struct {
	c      *Controller
	client *fake.Clientset
	reg    *prometheus.Registry
	ctx    context.Context
}

func newSignerEnv(t *testing.T, signer Signer, maxRetries int, edits ...func(*corev1.Pod)) *signerEnv {
	t.Helper()
	client := fake.NewClientset(testPod(edits...))
	scheme := metadatafake.NewTestScheme()
	metav1.AddMetaToScheme(scheme)
	md := metadatafake.NewSimpleMetadataClient(scheme,
		&metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}, ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "app", UID: "sa-uid"}},
		&metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "node-uid"}},
	)
	reg := prometheus.NewRegistry()
	c, err := New(Config{
		SignerName: testSigner, Client: client, Metadata: md, Namespace: "ca",
		Candidate:   election.Candidate{Identity: "test"},
		TrustDomain: testTD,
		Signer:      signer, Roots: fixedRoots{signer.(*flaky).Bundle()},
		MaxRetries: maxRetries, Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.sign(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &signerEnv{c: c, client: client, reg: reg, ctx: ctx}
}

// testPod is pod shop/app-0, changed by edits.
func testPod(edits ...func(*corev1.Pod)) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "app-0", UID: "pod-uid"},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "app", Volumes: []corev1.Volume{{Name: "id", VolumeSource: corev1.VolumeSource{
			Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{PodCertificate: &corev1.PodCertificateProjection{SignerName: testSigner}}}},
		}}}},
	}
	for _, edit := range edits {
		edit(pod)
	}
	return pod
}

// TestPodBoundAfterTheCacheSawIt: the signer's pod informer still holds
// the pod as created, before the scheduler bound it (no nodeName), when
// the kubelet of its node asks (on a real node the request came right
// after the binding, and the signer denied it NodeMismatch "runs on node
// \"\"": the pod never started). The signer reads the pod from the API
// server, where it is bound, and issues.
func TestPodBoundAfterTheCacheSawIt(t *testing.T) {
	f := &flaky{Authority: newAuthority(t)}
	e := newSignerEnv(t, f, 1, func(p *corev1.Pod) { p.Spec.NodeName = "" })
	var gets atomic.Int32
	e.client.PrependReactor("get", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		gets.Add(1)
		return true, testPod(), nil
	})
	got := e.create(t)
	if c := got.Status.Conditions[0]; c.Type != certificatesv1.PodCertificateRequestConditionTypeIssued {
		t.Fatalf("answered %s %s: %s", c.Type, c.Reason, c.Message)
	}
	if gets.Load() == 0 {
		t.Fatal("the pod was not read from the API server")
	}
}

// create makes a request for app-0 and waits for its answer.
func (e *signerEnv) create(t *testing.T) *certificatesv1.PodCertificateRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	pcrs := e.client.CertificatesV1().PodCertificateRequests("shop")
	r, err := pcrs.Create(e.ctx, &certificatesv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "app-0-req"},
		Spec: certificatesv1.PodCertificateRequestSpec{
			SignerName: testSigner, PodName: "app-0", PodUID: "pod-uid", ServiceAccountName: "app", ServiceAccountUID: "sa-uid",
			NodeName: "node-a", NodeUID: "node-uid", StubPKCS10Request: csr,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got *certificatesv1.PodCertificateRequest
	if err := wait.PollUntilContextTimeout(e.ctx, 5*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = pcrs.Get(ctx, r.Name, metav1.GetOptions{})
		return err == nil && terminal(got), nil
	}); err != nil {
		t.Fatalf("not answered: %v", err)
	}
	return got
}

// TestTransientFailuresRetried: the CA unavailable (three times) and a
// status write conflict (once) are retried with backoff, never answered
// Failed: the request ends Issued.
func TestTransientFailuresRetried(t *testing.T) {
	auth := newAuthority(t)
	f := &flaky{Authority: auth, err: ca.Errorf(ca.KindUnavailable, "the CA is not ready")}
	f.n.Store(3)
	e := newSignerEnv(t, f, 1)
	var conflicts atomic.Int32
	e.client.PrependReactor("update", "podcertificaterequests", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" && conflicts.Add(1) == 1 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "certificates.k8s.io", Resource: "podcertificaterequests"}, "app-0-req", nil)
		}
		return false, nil, nil
	})
	got := e.create(t)
	if typ := got.Status.Conditions[0].Type; typ != certificatesv1.PodCertificateRequestConditionTypeIssued {
		t.Fatalf("answered %s %s: %s", typ, got.Status.Conditions[0].Reason, got.Status.Conditions[0].Message)
	}
	if u, c := testutil.ToFloat64(e.c.metrics.retries.WithLabelValues("unavailable")), testutil.ToFloat64(e.c.metrics.retries.WithLabelValues("conflict")); u != 3 || c != 1 {
		t.Fatalf("retries: unavailable %v (want 3), conflict %v (want 1)", u, c)
	}
}

// TestInternalFailureFailsAfterRetries: an internal signing error that does
// not pass is retried MaxRetries times, then answered Failed
// (SigningFailed), once.
func TestInternalFailureFailsAfterRetries(t *testing.T) {
	auth := newAuthority(t)
	f := &flaky{Authority: auth, err: ca.Errorf(ca.KindInternal, "the HSM is gone")}
	f.n.Store(1 << 20)
	e := newSignerEnv(t, f, 3)
	got := e.create(t)
	c := got.Status.Conditions[0]
	if c.Type != certificatesv1.PodCertificateRequestConditionTypeFailed || c.Reason != reasonSigningFailed || got.Status.CertificateChain != "" {
		t.Fatalf("answered %s %s %q", c.Type, c.Reason, c.Message)
	}
	if n := f.calls.Load(); n != 4 {
		t.Fatalf("%d signing attempts, want 1 + 3 retries", n)
	}
	if v := testutil.ToFloat64(e.c.metrics.requests.WithLabelValues(resultFailed, reasonSigningFailed)); v != 1 {
		t.Fatalf("failed answers %v", v)
	}
}
