package e2e_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityapi "istio.io/api/security/v1alpha1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/testkit"
	"github.com/meshid/meshid/test/kube/harness"
)

// Issue 15: local verification of bound tokens (ca/authn/boundtoken,
// --token-verification) against the real API server, with its own
// apiserver_request_total as the count of TokenReviews.

// localVerificationDir is the file of local verification's RBAC, which
// `kubectl apply -f deploy/` applies (the default, auto, needs it) and
// deployRBAC leaves out, to show auto falling back without it.
const localVerificationDir = "15-local-verification.yaml"

// metricValue reads one sample, name{labels}, of a /metrics page.
func metricValue(monitor, name, labels string) (float64, error) {
	return harness.ScrapeMetric(monitor, name, labels)
}

// waitLocal waits until the CA verifies tokens locally.
func waitLocal(t *testing.T, ca *caServer) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		v, err := metricValue(ca.monitor, "meshid_ca_token_verification_mode", `mode="local"`)
		return err == nil && v == 1, nil
	})
	if err != nil {
		t.Fatalf("the CA never verified tokens locally: %v", err)
	}
}

func tokenReviews(t *testing.T) float64 {
	t.Helper()
	n, err := cluster.APIServerRequests(context.Background(), "tokenreviews")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// podToken creates pod ns/name of service account sa and returns it with
// an istio-ca token bound to it.
func podToken(t *testing.T, ns, name, sa string) (*corev1.Pod, string) {
	t.Helper()
	ctx := context.Background()
	pod, err := cluster.CreatePodOnNode(ctx, ns, name, sa, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := cluster.Token(ctx, harness.TokenSpec{Namespace: ns, ServiceAccount: sa, Audiences: []string{"istio-ca"}, Pod: pod})
	if err != nil {
		t.Fatal(err)
	}
	return pod, tok
}

// refused signs with token until the CA refuses it Unauthenticated. It is
// called once the CA's informer has seen the change that invalidates the
// token; the CA then refuses it itself, or (an object it no longer holds)
// asks TokenReview, whose answer follows the API server's own informer.
// The deadline only detects a token that stays accepted: the lag of an
// event depends on the machine's load, so it is logged, not asserted.
func refused(t *testing.T, ca *caServer, token, ns, sa string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := ca.sign(ctx, token, workloadID(ns, sa))
		switch status.Code(err) {
		case codes.Unauthenticated:
			return true, nil
		case codes.OK:
			return false, nil
		}
		return false, fmt.Errorf("sign: %w, want OK or Unauthenticated", err)
	})
	if err != nil {
		t.Fatalf("a token whose bound object was deleted was not refused: %v", err)
	}
}

// waitInformerCount waits until the CA's informer of resource holds want
// objects: the informer has processed the events up to a create or delete
// the test made. Its store is updated before the event handler that
// counts runs, so the verifier sees the change once the count does.
func waitInformerCount(t *testing.T, ca *caServer, resource string, want int) time.Duration {
	t.Helper()
	start := time.Now()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		v, err := metricValue(ca.monitor, "meshid_ca_bound_token_informer_objects", `resource="`+resource+`"`)
		return err == nil && int(v) == want, nil
	})
	if err != nil {
		t.Fatalf("the CA's %s informer never held %d objects: %v", resource, want, err)
	}
	return time.Since(start)
}

// TestLocalVerification runs `meshid server --token-verification local`
// as the admin and checks every outcome against the real API server: fresh
// pod tokens cost no TokenReview; a deleted pod's token, a recreated pod's
// old token and a deleted service account's token are refused as soon as
// the CA's informer has seen the change (the lag is logged); wrong audience, expired, forged
// algorithms, huge tokens and other issuers' tokens are refused; a flood of
// unknown key ids costs at most one JWKS read per 10s.
func TestLocalVerification(t *testing.T) {
	ctx := context.Background()
	ca := startCA(t, cluster.AdminKubeconfig(), "--token-verification", "local")
	ca.connect(t, ca.stateRoots(t))
	waitLocal(t, ca)
	const ns = "boundtoken"
	if err := cluster.CreateServiceAccount(ctx, ns, "app"); err != nil {
		t.Fatal(err)
	}

	t.Run("fresh pod tokens cost no TokenReview", func(t *testing.T) {
		toks := make([]string, 20)
		for i := range toks {
			_, toks[i] = podToken(t, ns, fmt.Sprintf("fresh-%d", i), "app")
		}
		waitForPods(t, ca)
		before := tokenReviews(t)
		for i, tok := range toks {
			chain, err := ca.sign(ctx, tok, workloadID(ns, "app"))
			if err != nil {
				t.Fatalf("token %d: %v", i, err)
			}
			verifySVID(t, chain, ca.roots, workloadID(ns, "app"))
		}
		if n := tokenReviews(t) - before; n != 0 {
			t.Fatalf("%d fresh tokens made %v TokenReviews, want 0", len(toks), n)
		}
	})

	t.Run("deleted pod", func(t *testing.T) {
		pod, tok := podToken(t, ns, "doomed", "app")
		waitForPods(t, ca)
		if _, err := ca.sign(ctx, tok, workloadID(ns, "app")); err != nil {
			t.Fatalf("the pod's token before the delete: %v", err)
		}
		if err := cluster.DeletePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		lag := waitInformerCount(t, ca, "pods", podCount(t))
		t.Logf("informer lag: the CA saw the pod's deletion %s after the delete returned", lag.Round(time.Millisecond))
		refused(t, ca, tok, ns, "app")
	})

	t.Run("recreated pod, old token", func(t *testing.T) {
		old, oldTok := podToken(t, ns, "reborn", "app")
		waitForPods(t, ca)
		if err := cluster.DeletePod(ctx, old); err != nil {
			t.Fatal(err)
		}
		_, newTok := podToken(t, ns, "reborn", "app")
		waitForPods(t, ca)
		if _, err := ca.sign(ctx, newTok, workloadID(ns, "app")); err != nil {
			t.Fatalf("the new pod's token: %v", err)
		}
		// The new pod's token is accepted, so the CA's informer holds the
		// new pod (another UID under the old token's pod name).
		refused(t, ca, oldTok, ns, "app")
	})

	t.Run("deleted service account", func(t *testing.T) {
		if err := cluster.CreateServiceAccount(ctx, ns, "gone"); err != nil {
			t.Fatal(err)
		}
		_, tok := podToken(t, ns, "gone-0", "gone")
		waitForPods(t, ca)
		if _, err := ca.sign(ctx, tok, workloadID(ns, "gone")); err != nil {
			t.Fatalf("the service account's token before the delete: %v", err)
		}
		if err := cluster.Client().CoreV1().ServiceAccounts(ns).Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		lag := waitInformerCount(t, ca, "serviceaccounts", serviceAccountCount(t))
		t.Logf("informer lag: the CA saw the service account's deletion %s after the delete returned", lag.Round(time.Millisecond))
		refused(t, ca, tok, ns, "gone")
	})

	_, good := podToken(t, ns, "victim", "app")
	waitForPods(t, ca)
	claims, err := harness.Claims(good)
	if err != nil {
		t.Fatal(err)
	}
	other := newForeignKey(t)
	resigned := func(mod func(map[string]any)) string {
		c := cloneClaims(claims)
		mod(c)
		tok, err := cluster.SignToken(c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	wrongAud, err := cluster.Token(ctx, harness.TokenSpec{Namespace: ns, ServiceAccount: "app", Audiences: []string{"vault"}})
	if err != nil {
		t.Fatal(err)
	}
	local := []struct{ name, token string }{
		{"wrong audience", wrongAud},
		{"expired", expiredToken(t, good, time.Now().Add(-time.Minute))},
		{"not yet valid", resigned(func(c map[string]any) { c["nbf"] = time.Now().Add(time.Hour).Unix() })},
		{"alg none", unsigned(t, "none", claims)},
		{"HS256 with a public key's bytes", hmacSigned(t, claims)},
		{"another key, the cluster's kid", other.sign(t, kidOf(t, good), claims)},
		{"huge", resigned(func(c map[string]any) { c["pad"] = strings.Repeat("x", 32<<10) })},
	}
	t.Run("refused here, without TokenReview", func(t *testing.T) {
		before := tokenReviews(t)
		for _, tc := range local {
			if _, err := ca.sign(ctx, tc.token, workloadID(ns, "app")); status.Code(err) != codes.Unauthenticated {
				t.Errorf("%s: %v, want Unauthenticated", tc.name, err)
			}
		}
		if n := tokenReviews(t) - before; n != 0 {
			t.Fatalf("%v TokenReviews, want 0", n)
		}
	})

	t.Run("other issuer goes to TokenReview", func(t *testing.T) {
		c := cloneClaims(claims)
		c["iss"] = "https://issuer.example"
		before := tokenReviews(t)
		if _, err := ca.sign(ctx, other.sign(t, "k1", c), workloadID(ns, "app")); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("%v, want Unauthenticated", err)
		}
		if n := tokenReviews(t) - before; n != 1 {
			t.Fatalf("%v TokenReviews, want 1", n)
		}
	})

	t.Run("unknown key id flood", func(t *testing.T) {
		forged := other.sign(t, "made-up-kid", claims)
		refreshes := func() float64 {
			v, err := metricSum(ca.monitor, "meshid_ca_bound_token_key_refreshes_total")
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		beforeRefresh, beforeReviews := refreshes(), tokenReviews(t)
		const n = 2000
		csr := pregenCSR(t, workloadID(ns, "app"))
		start := time.Now()
		for i := range n {
			if code := status.Code(ca.signCSR(ctx, forged, csr)); code != codes.Unauthenticated {
				t.Fatalf("request %d: %v, want Unauthenticated", i, code)
			}
		}
		elapsed := time.Since(start)
		// One read per started 10s (the rate limit), plus the periodic one.
		limit := float64(elapsed/(10*time.Second)) + 2
		if got := refreshes() - beforeRefresh; got > limit {
			t.Fatalf("%d tokens with an unknown kid in %s made %v key reads, want at most %v", n, elapsed, got, limit)
		}
		// Left to TokenReview, whose negative cache answers the repeats.
		if got := tokenReviews(t) - beforeReviews; got > limit {
			t.Fatalf("%d repeats of one forged token made %v TokenReviews", n, got)
		}
	})
}

// waitForPods waits until the CA verifies locally and its pod informer
// holds as many pods as the cluster: a token of a pod it does not hold yet
// would go to TokenReview (and pass), which is not what a test counts.
func waitForPods(t *testing.T, ca *caServer) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		v, err := metricValue(ca.monitor, "meshid_ca_token_verification_mode", `mode="local"`)
		if err != nil || v != 1 {
			return false, nil
		}
		n, err := podsKnown(ca)
		return err == nil && n >= podCount(t), nil
	})
	if err != nil {
		t.Fatalf("the CA's informer never held the test's pods: %v", err)
	}
}

func podCount(t *testing.T) int {
	pods, err := cluster.Client().CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(pods.Items)
}

func serviceAccountCount(t *testing.T) int {
	sas, err := cluster.Client().CoreV1().ServiceAccounts("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(sas.Items)
}

func podsKnown(ca *caServer) (int, error) {
	v, err := metricValue(ca.monitor, "meshid_ca_bound_token_informer_objects", `resource="pods"`)
	return int(v), err
}

// foreignKey is a signing key the cluster does not know.
type foreignKey struct{ key *ecdsa.PrivateKey }

func newForeignKey(t *testing.T) foreignKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return foreignKey{k}
}

func (f foreignKey) sign(t *testing.T, kid string, claims map[string]any) string {
	t.Helper()
	return signClaims(t, jose.SigningKey{Algorithm: jose.ES256, Key: f.key}, kid, claims)
}

func signClaims(t *testing.T, key jose.SigningKey, kid string, claims map[string]any) string {
	t.Helper()
	tok, err := harness.SignJWT(key, kid, claims)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// hmacSigned is the classic confusion attack: HS256 keyed with the bytes
// of the cluster's public key.
func hmacSigned(t *testing.T, claims map[string]any) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(cluster.ServiceAccountKey().Public())
	if err != nil {
		t.Fatal(err)
	}
	pub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	return signClaims(t, jose.SigningKey{Algorithm: jose.HS256, Key: pub}, "", claims)
}

// unsigned is a token with alg none, which go-jose refuses to make.
func unsigned(t *testing.T, alg string, claims map[string]any) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	hdr := fmt.Sprintf(`{"alg":%q,"typ":"JWT"}`, alg)
	return b64(hdr) + "." + b64(string(payload)) + "."
}

func kidOf(t *testing.T, token string) string {
	t.Helper()
	hdr, _, _ := strings.Cut(token, ".")
	raw, err := b64Decode(hdr)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Kid string `json:"kid"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatal(err)
	}
	return h.Kid
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func b64Decode(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }

// canI asks the RBAC authorizer whether deploy/'s meshid ServiceAccount
// may verb resource (core group, all namespaces).
func canI(t *testing.T, verb, resource string) bool {
	t.Helper()
	sar, err := cluster.Client().AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + caNamespace + ":meshid",
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + caNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Resource: resource},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return sar.Status.Allowed
}

func cloneClaims(c map[string]any) map[string]any {
	raw, _ := json.Marshal(c)
	out := map[string]any{}
	_ = json.Unmarshal(raw, &out)
	return out
}

// pregenCSR is one CSR for id, PEM, reused by a flood of requests.
func pregenCSR(t *testing.T, id spiffeid.ID) string {
	t.Helper()
	return string(testkit.CSRPEM(t, testkit.Key(t, certs.ECP256), id))
}

// signCSR sends csr with token and returns the error.
func (s *caServer) signCSR(ctx context.Context, token, csr string) error {
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	_, err := s.client.CreateCertificate(ctx, &securityapi.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
	return err
}

// TestAutoFallsBack runs the CA in `auto` (the default) where local
// verification cannot work: as deploy/'s meshid ServiceAccount without
// deploy/15-local-verification.yaml (the informers are forbidden), and as a user
// who may list pods and service accounts but not read the issuer's
// discovery URLs (RBAC). Each time the log and the metric say TokenReview,
// and a token works through one TokenReview.
func TestAutoFallsBack(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, wantLog string
		kubeconfig    func(t *testing.T) string
	}{
		{"informers forbidden", "pods is forbidden", deployRBAC},
		{"discovery forbidden", "system:service-account-issuer-discovery", noDiscoveryUser},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca := startCA(t, tc.kubeconfig(t))
			ca.connect(t, ca.stateRoots(t))
			err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				return strings.Contains(ca.proc.Tail(1<<16), tc.wantLog), nil
			})
			if err != nil {
				t.Fatalf("the log never said %q: %v", tc.wantLog, err)
			}
			if log := ca.proc.Tail(1 << 16); !strings.Contains(log, "token verification: tokenreview (auto") {
				t.Fatalf("the log does not say auto uses TokenReview:\n%s", log)
			}
			if v, err := metricValue(ca.monitor, "meshid_ca_token_verification_mode", `mode="tokenreview"`); err != nil || v != 1 {
				t.Fatalf("mode tokenreview = %v, %v; want 1", v, err)
			}
			ns := "boundtoken-auto-" + strings.ReplaceAll(strings.Fields(tc.name)[0], " ", "")
			if err := cluster.CreateServiceAccount(ctx, ns, "app"); err != nil {
				t.Fatal(err)
			}
			_, tok := podToken(t, ns, "app-0", "app")
			before := tokenReviews(t)
			if _, err := ca.sign(ctx, tok, workloadID(ns, "app")); err != nil {
				t.Fatal(err)
			}
			if n := tokenReviews(t) - before; n != 1 {
				t.Fatalf("%v TokenReviews, want 1", n)
			}
		})
	}
}

// noDiscoveryUser returns the kubeconfig of a user (not a service
// account, so outside the API server's default discovery binding) who may
// create TokenReviews and list and watch pods and service accounts, and
// nothing else: local verification lacks only the discovery URLs.
func noDiscoveryUser(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	const name = "meshid-no-discovery"
	rb := cluster.Client().RbacV1()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"pods", "serviceaccounts"}, Verbs: []string{"list", "watch"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: name}},
	}
	if _, err := rb.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := rb.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rb.ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = rb.ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
	})
	kc, err := cluster.UserKubeconfig(name, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// TestLocalVerificationRBAC applies deploy/15-local-verification.yaml for real:
// with it, the CA running as deploy/'s ServiceAccount verifies locally in
// `auto`, and the rules grant nothing more than they say.
func TestLocalVerificationRBAC(t *testing.T) {
	ctx := context.Background()
	kubeconfig := deployRBAC(t)
	a := newApplier(t, cluster.AdminConfig())
	var applied []string
	for _, m := range loadManifests(t) {
		if !strings.HasPrefix(m.file, localVerificationDir) {
			continue
		}
		if err := a.apply(ctx, m.obj, false); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		applied = append(applied, m.obj.GetKind()+"/"+m.obj.GetName())
	}
	t.Cleanup(func() {
		// Other tests check deploy/'s RBAC alone.
		rb := cluster.Client().RbacV1()
		if err := rb.ClusterRoleBindings().Delete(ctx, "meshid-local-verification", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
		if err := rb.ClusterRoles().Delete(ctx, "meshid-local-verification", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	})
	if len(applied) != 2 {
		t.Fatalf("deploy/%s holds %v, want a ClusterRole and its binding", localVerificationDir, applied)
	}
	// The API server's RBAC authorizer sees a new binding through its own
	// informers, a few milliseconds after the create returned: wait for the
	// first grant before judging the rest, so the lag is not read as a denial.
	eventually(t, 30*time.Second, "the local-verification ClusterRoleBinding seen by the authorizer", func(context.Context) error {
		if !canI(t, "list", "pods") {
			return errors.New("list pods not allowed yet")
		}
		return nil
	})
	for _, r := range []struct {
		verb, resource string
		allow          bool
	}{
		{"list", "pods", true}, {"watch", "serviceaccounts", true},
		{"get", "pods", false}, {"list", "secrets", false}, {"watch", "secrets", false},
		{"update", "pods", false}, {"list", "nodes", false},
	} {
		if got := canI(t, r.verb, r.resource); got != r.allow {
			t.Errorf("%s %s: allowed %v, want %v", r.verb, r.resource, got, r.allow)
		}
	}
	ca := startCA(t, kubeconfig)
	ca.connect(t, ca.stateRoots(t))
	waitLocal(t, ca)
	const ns = "boundtoken-rbac"
	if err := cluster.CreateServiceAccount(ctx, ns, "app"); err != nil {
		t.Fatal(err)
	}
	_, tok := podToken(t, ns, "app-0", "app")
	waitForPods(t, ca)
	before := tokenReviews(t)
	if _, err := ca.sign(ctx, tok, workloadID(ns, "app")); err != nil {
		t.Fatal(err)
	}
	if n := tokenReviews(t) - before; n != 0 {
		t.Fatalf("%v TokenReviews, want 0", n)
	}
}
