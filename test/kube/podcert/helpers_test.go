package podcert_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/meshid/meshid/ca/authn/boundtoken"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

var trustDomain = spiffeid.RequireTrustDomainFromString("cluster.local")

// startCA runs the CA assembly as `meshid server --kubeconfig <the CA's
// ServiceAccount> --pod-certificate-signer meshid.io/workload` runs it,
// with cfg's other fields (a state directory of its own unless set).
func startCA(t testing.TB, cfg caserver.Config) (*caserver.Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.TrustDomain = trustDomain
	cfg.Kube.Kubeconfig = caKubeconfig
	cfg.Kube.Namespace = caNamespace
	cfg.Kube.PodCertificateSigner = signerName
	cfg.Kube.DisableRootConfigMap = true
	cfg.Authn.TokenVerification = boundtoken.ModeTokenReview
	cfg.Registerer = reg
	return testkit.CA(t, cfg), reg
}

// kubelet is a node and the client of its kubelet (the node's credential,
// judged by the Node authorizer and NodeRestriction).
type kubelet struct {
	node   *corev1.Node
	client kubernetes.Interface
}

// newKubelet registers node name as its kubelet does (the node creates
// its own Node object) and returns it. Its client is not rate limited by
// client-go (a storm measures the signer, not the test's token bucket).
func newKubelet(t testing.TB, ctx context.Context, name string) *kubelet {
	t.Helper()
	cfg := cluster.NodeConfig(name)
	cfg.QPS, cfg.Burst = 5000, 10000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	node, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		node, err = client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatalf("node %s registers itself: %v", name, err)
	}
	return &kubelet{node: node, client: client}
}

// createPod creates (as the admin) pod ns/name of service account sa,
// scheduled on node, mounting a podCertificate volume of each signer.
func createPod(t testing.TB, ctx context.Context, ns, name, sa, node string, signers ...string) *corev1.Pod {
	t.Helper()
	var sources []corev1.VolumeProjection
	for i, s := range signers {
		sources = append(sources, corev1.VolumeProjection{PodCertificate: &corev1.PodCertificateProjection{
			SignerName: s, KeyType: "ECDSAP256", CredentialBundlePath: fmt.Sprintf("credentialbundle-%d.pem", i),
		}})
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: sa,
			Containers:         []corev1.Container{{Name: "app", Image: "app:latest"}},
		},
	}
	if len(sources) > 0 {
		pod.Spec.Volumes = []corev1.Volume{{Name: "identity", VolumeSource: corev1.VolumeSource{
			Projected: &corev1.ProjectedVolumeSource{Sources: sources},
		}}}
	}
	p, err := cluster.Client().CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("pod %s/%s: %v", ns, name, err)
	}
	return p
}

// workload is a namespace with a service account.
func workload(t testing.TB, ctx context.Context, ns, sa string) *corev1.ServiceAccount {
	t.Helper()
	if err := cluster.CreateServiceAccount(ctx, ns, sa); err != nil {
		t.Fatal(err)
	}
	got, err := cluster.Client().CoreV1().ServiceAccounts(ns).Get(ctx, sa, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// newKey makes a key of the podCertificate volume's keyType.
func newKey(t testing.TB, keyType string) crypto.Signer {
	t.Helper()
	var (
		k   crypto.Signer
		err error
	)
	switch keyType {
	case "RSA3072":
		k, err = rsa.GenerateKey(rand.Reader, 3072)
	case "RSA4096":
		k, err = rsa.GenerateKey(rand.Reader, 4096)
	case "ECDSAP256":
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "ECDSAP384":
		k, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case "ECDSAP521":
		k, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	case "ED25519":
		_, k, err = ed25519.GenerateKey(rand.Reader)
	default:
		t.Fatalf("key type %s", keyType)
	}
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// request is the PodCertificateRequest a kubelet makes for pod: an empty
// CSR signed with key, the pod's, node's and service account's names and
// UIDs.
func request(t testing.TB, pod *corev1.Pod, node *corev1.Node, sa *corev1.ServiceAccount, signer string, key crypto.Signer) *certificatesv1.PodCertificateRequest {
	t.Helper()
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return &certificatesv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + "-", Namespace: pod.Namespace},
		Spec: certificatesv1.PodCertificateRequestSpec{
			SignerName:           signer,
			PodName:              pod.Name,
			PodUID:               pod.UID,
			ServiceAccountName:   sa.Name,
			ServiceAccountUID:    sa.UID,
			NodeName:             types.NodeName(node.Name),
			NodeUID:              node.UID,
			MaxExpirationSeconds: ptr.To[int32](86400),
			StubPKCS10Request:    csr,
		},
	}
}

// answered waits until the request has a condition and returns it.
func answered(t testing.TB, ctx context.Context, r *certificatesv1.PodCertificateRequest) *certificatesv1.PodCertificateRequest {
	t.Helper()
	var got *certificatesv1.PodCertificateRequest
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = cluster.Client().CertificatesV1().PodCertificateRequests(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
		return err == nil && len(got.Status.Conditions) > 0, nil
	})
	if err != nil {
		t.Fatalf("request %s/%s not answered: %v (last %+v)", r.Namespace, r.Name, err, got)
	}
	return got
}

// condition is the request's one condition: type and reason.
func condition(r *certificatesv1.PodCertificateRequest) (typ, reason, message string) {
	if len(r.Status.Conditions) != 1 {
		return fmt.Sprintf("%d conditions", len(r.Status.Conditions)), "", ""
	}
	c := r.Status.Conditions[0]
	return c.Type, c.Reason, c.Message
}

// mustChain parses an issued request's chain.
func mustChain(t testing.TB, r *certificatesv1.PodCertificateRequest) []*x509.Certificate {
	t.Helper()
	chain, err := certs.ParseCertificates([]byte(r.Status.CertificateChain))
	if err != nil || len(chain) == 0 {
		t.Fatalf("chain: %v", err)
	}
	return chain
}

// createPCR creates r as client (a node's kubelet). The API server's
// admission looks up the pod the request names in its own informer,
// which may not hold a pod created a moment ago (it answers that the pod
// was not found): that answer is retried until the informer has the pod,
// as the kubelet's own retries would; every other answer is returned.
func createPCR(ctx context.Context, client kubernetes.Interface, ns string, r *certificatesv1.PodCertificateRequest) (*certificatesv1.PodCertificateRequest, error) {
	var created *certificatesv1.PodCertificateRequest
	var err error
	_ = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		created, err = client.CertificatesV1().PodCertificateRequests(ns).Create(ctx, r, metav1.CreateOptions{})
		return err == nil || !(strings.Contains(err.Error(), "named in the PodCertificateRequest") && strings.Contains(err.Error(), "not found")), nil
	})
	return created, err
}
