package e2e_test

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	securityapi "istio.io/api/security/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/ca/nodeauth"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/test/kube/harness"
	"github.com/meshid/meshid/testkit"
)

// Ambient mode on the real API server (issue 11): a ztunnel service
// account in istio-system with a pod on node-a (and one on node-b),
// workloads on node-a and node-b. Pods are created with spec.nodeName and
// no kubelet: they stay Pending, which is what TokenRequest binding,
// TokenReview and informers need.
const ambientNS = "ambient"

var ztunnelAccount = identity.ServiceAccount{Namespace: "istio-system", Name: "ztunnel"}

// scheduledPod creates a pod of sa in ns that the scheduler "placed" on
// node.
func scheduledPod(t *testing.T, ns, name, sa, node string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	if err := cluster.CreateServiceAccount(ctx, ns, sa); err != nil {
		t.Fatal(err)
	}
	pod, err := cluster.Client().CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa,
			NodeName:           node,
			Containers:         []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("pod %s/%s: %v", ns, name, err)
	}
	t.Cleanup(func() { _ = cluster.DeletePod(context.Background(), pod) })
	return pod
}

func boundToken(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	tok, err := cluster.Token(context.Background(), harness.TokenSpec{
		Namespace: pod.Namespace, ServiceAccount: pod.Spec.ServiceAccountName, Audiences: []string{"istio-ca"}, Pod: pod,
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// ambientCA is an in-process CA (ca.Authority, ca/certservice, TokenReview or
// offline JWT authentication, node authorization) against the real API
// server, as the CA process assembles it.
type ambientCA struct {
	authority *ca.Authority
	nodeAuth  *nodeauth.Authorizer
	reg       *prometheus.Registry
	client    securityapi.IstioCertificateServiceClient
}

// startAmbientCA runs node authorization (not waiting for it to sync) and
// the gRPC server with authenticator, until the test ends.
func startAmbientCA(t *testing.T, authenticator authn.Authenticator) *ambientCA {
	t.Helper()
	reg := prometheus.NewRegistry()
	a := &ambientCA{authority: testkit.NewAuthority(t, trustDomain, nil, nil), reg: reg}
	var err error
	a.nodeAuth, err = nodeauth.New(nodeauth.Config{
		TrustedAccounts: []identity.ServiceAccount{ztunnelAccount},
		Client:          cluster.MeshClient(),
		TrustDomain:     trustDomain,
		LookupTimeout:   2 * time.Second,
		Registerer:      reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "node authorizer", a.nodeAuth.Run)
	addr, _ := testkit.ServeCA(t, certservice.Config{Authority: a.authority, Authenticator: authenticator, NodeAuthorizer: a.nodeAuth})
	s := &caServer{addr: addr}
	s.connect(t, a.authority.Bundle().Roots)
	t.Cleanup(func() { s.conn.Close() })
	a.client = s.client
	return a
}

func (a *ambientCA) waitSynced(t *testing.T) {
	t.Helper()
	eventually(t, time.Minute, "the pod informer to sync", func(context.Context) error {
		if !a.nodeAuth.HasSynced() {
			return fmt.Errorf("not synced")
		}
		return nil
	})
}

// impersonate asks, with token, for a certificate for impersonated
// (ImpersonatedIdentity) with a CSR whose URI SAN is san, as ztunnel does.
func (a *ambientCA) impersonate(ctx context.Context, token string, san, impersonated spiffeid.ID) ([]*x509.Certificate, error) {
	key, err := certs.GenerateKey(certs.ECP256)
	if err != nil {
		return nil, err
	}
	der, err := certs.NewCSR(key, san)
	if err != nil {
		return nil, err
	}
	md, err := structpb.NewStruct(map[string]any{certservice.ImpersonatedIdentityKey: impersonated.String()})
	if err != nil {
		return nil, err
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := a.client.CreateCertificate(ctx, &securityapi.IstioCertificateRequest{Csr: string(certs.EncodeCSR(der)), Metadata: md})
	if err != nil {
		return nil, err
	}
	var chain []*x509.Certificate
	for _, p := range resp.GetCertChain() {
		cs, err := certs.ParseCertificates([]byte(p))
		if err != nil {
			return nil, err
		}
		chain = append(chain, cs...)
	}
	return chain, nil
}

func tokenReview(t *testing.T) authn.Authenticator {
	t.Helper()
	tr, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: cluster.MeshClient(), Audiences: []string{"istio-ca"}})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestAmbient covers the cases with TokenReview authentication.
func TestAmbient(t *testing.T) {
	ctx := context.Background()
	ztA := scheduledPod(t, "istio-system", "ztunnel-a", "ztunnel", "node-a")
	scheduledPod(t, "istio-system", "ztunnel-b", "ztunnel", "node-b")
	untrusted := scheduledPod(t, "istio-system", "not-ztunnel-a", "not-ztunnel", "node-a")
	scheduledPod(t, ambientNS, "web-a", "web", "node-a")
	scheduledPod(t, ambientNS, "db-b", "db", "node-b")
	ztTok := boundToken(t, ztA)
	unbound, err := cluster.Token(ctx, harness.TokenSpec{Namespace: "istio-system", ServiceAccount: "ztunnel", Audiences: []string{"istio-ca"}})
	if err != nil {
		t.Fatal(err)
	}

	// What the rest builds on: the API server names the node of a pod
	// bound token in its review.
	st, err := cluster.Review(ctx, ztTok, []string{"istio-ca"})
	if err != nil {
		t.Fatal(err)
	}
	if got := st.User.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != "node-a" {
		t.Fatalf("node-name extra = %v, want [node-a]", got)
	}

	a := startAmbientCA(t, tokenReview(t))
	a.waitSynced(t)
	web, db := workloadID(ambientNS, "web"), workloadID(ambientNS, "db")
	cases := []struct {
		name              string
		token             string
		san, impersonated spiffeid.ID
		want              codes.Code
		msg               string
	}{
		{"pod on the caller's node", ztTok, web, web, codes.OK, ""},
		{"pod only on the other node", ztTok, db, db, codes.PermissionDenied, "condition 3"},
		{"untrusted caller", boundToken(t, untrusted), web, web, codes.PermissionDenied, "condition 1"},
		{"trusted account's token not bound to a pod", unbound, web, web, codes.PermissionDenied, "condition 2"},
		{"CSR SAN is not the impersonated identity", ztTok, workloadID("istio-system", "ztunnel"), web, codes.PermissionDenied, "condition 4"},
		{"CSR SAN is the other node's pod", ztTok, db, web, codes.PermissionDenied, "condition 4"},
		{"another trust domain", ztTok, spiffeid.RequireFromString("spiffe://evil.example/ns/ambient/sa/web"), spiffeid.RequireFromString("spiffe://evil.example/ns/ambient/sa/web"), codes.PermissionDenied, "condition 4"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			chain, err := a.impersonate(ctx, tc.token, tc.san, tc.impersonated)
			if got := status.Code(err); got != tc.want || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("code %v (%v), want %v with %q", got, err, tc.want, tc.msg)
			}
			if tc.want == codes.OK {
				verifySVID(t, chain, a.authority.Bundle().Roots, tc.impersonated)
			}
		})
	}

	t.Run("a pod created later becomes impersonable, a deleted one stops", func(t *testing.T) {
		late := workloadID(ambientNS, "late")
		if _, err := a.impersonate(ctx, ztTok, late, late); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("before the pod exists: %v", err)
		}
		pod := scheduledPod(t, ambientNS, "late-a", "late", "node-a")
		eventually(t, 10*time.Second, "the new pod to become impersonable", func(ctx context.Context) error {
			_, err := a.impersonate(ctx, ztTok, late, late)
			return err
		})
		if err := cluster.DeletePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the deleted pod to stop being impersonable", func(ctx context.Context) error {
			_, err := a.impersonate(ctx, ztTok, late, late)
			if status.Code(err) != codes.PermissionDenied {
				return fmt.Errorf("still %v", err)
			}
			return nil
		})
	})
	if got := testkit.Metric(t, a.reg, "meshid_ca_impersonations_total", "result", nodeauth.ResultNoPodOnNode); got < 2 {
		t.Errorf("meshid_ca_impersonations_total{result=no_pod_on_node} = %v", got)
	}
}

// TestAmbientOfflineJWT: offline JWT authentication cannot see a deleted
// pod, node authorization can: the node agent's token outlives its pod,
// and impersonation with it stops with the pod.
func TestAmbientOfflineJWT(t *testing.T) {
	ctx := context.Background()
	ztA := scheduledPod(t, "istio-system", "ztunnel-jwt", "ztunnel", "node-j")
	scheduledPod(t, ambientNS, "web-j", "web", "node-j")
	ztTok := boundToken(t, ztA)
	pub := cluster.ServiceAccountKey().Public()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(der)
	jwks := &jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: pub, KeyID: base64.RawURLEncoding.EncodeToString(sum[:]), Algorithm: string(cluster.ServiceAccountAlgorithm()), Use: "sig"}}}
	j, err := authn.NewJWT(authn.JWTConfig{Issuer: cluster.Issuer(), Audiences: []string{"istio-ca"}, JWKS: jwks})
	if err != nil {
		t.Fatal(err)
	}
	a := startAmbientCA(t, j)
	a.waitSynced(t)
	web := workloadID(ambientNS, "web")
	if _, err := a.impersonate(ctx, ztTok, web, web); err != nil {
		t.Fatalf("offline JWT node agent: %v", err)
	}
	if err := cluster.DeletePod(ctx, ztA); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Authenticate(ctx, authn.Credentials{Token: ztTok}); err != nil {
		t.Fatalf("precondition: the offline check still accepts the deleted pod's token: %v", err)
	}
	eventually(t, 10*time.Second, "the deleted node agent to lose impersonation", func(ctx context.Context) error {
		_, err := a.impersonate(ctx, ztTok, web, web)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "condition 2") {
			return fmt.Errorf("still %v", err)
		}
		return nil
	})
}

// TestAmbientAPIServerDownBeforeSync: a CA whose node authorization starts
// while the API server is down answers Unavailable (never
// PermissionDenied: nothing was judged), then recovers on its own.
func TestAmbientAPIServerDownBeforeSync(t *testing.T) {
	ctx := context.Background()
	ztA := scheduledPod(t, "istio-system", "ztunnel-down", "ztunnel", "node-d")
	scheduledPod(t, ambientNS, "web-d", "web", "node-d")
	ztTok := boundToken(t, ztA)
	// The token is reviewed before the outage, so authentication answers
	// from its cache and the request reaches node authorization.
	tr := tokenReview(t)
	if _, err := tr.Authenticate(ctx, authn.Credentials{Token: ztTok}); err != nil {
		t.Fatal(err)
	}
	stopAPIServer(t)
	a := startAmbientCA(t, tr)
	web := workloadID(ambientNS, "web")
	_, err := a.impersonate(ctx, ztTok, web, web)
	if status.Code(err) != codes.Unavailable || a.nodeAuth.HasSynced() {
		t.Fatalf("with the API server down before sync: %v (synced %v), want Unavailable", err, a.nodeAuth.HasSynced())
	}
	if got := testkit.Metric(t, a.reg, "meshid_ca_impersonations_total", "result", nodeauth.ResultUnavailable); got != 1 {
		t.Errorf("unavailable count = %v", got)
	}
	if err := cluster.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "impersonation after the API server is back", func(ctx context.Context) error {
		_, err := a.impersonate(ctx, ztTok, web, web)
		return err
	})
	a.waitSynced(t)
}
