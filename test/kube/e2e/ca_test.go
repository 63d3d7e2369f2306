package e2e_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/meshid/meshid/test/kube/harness"
)

// workloadFixture is a namespace with two service accounts and a pod, the
// way a workload looks to the CA.
type workloadFixture struct {
	ns  string
	sa  string // the workload's service account
	pod *corev1.Pod
}

func newWorkload(t *testing.T, ns string) workloadFixture {
	t.Helper()
	ctx := context.Background()
	for _, sa := range []string{"workload", "other"} {
		if err := cluster.CreateServiceAccount(ctx, ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	pod, err := cluster.CreatePod(ctx, ns, "workload-0", "workload")
	if err != nil {
		t.Fatal(err)
	}
	return workloadFixture{ns: ns, sa: "workload", pod: pod}
}

func (w workloadFixture) token(t *testing.T, audiences ...string) string {
	t.Helper()
	tok, err := cluster.Token(context.Background(), harness.TokenSpec{
		Namespace: w.ns, ServiceAccount: w.sa, Audiences: audiences, Pod: w.pod,
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// deletedPodToken returns an istio-ca token bound to a pod of the workload's
// service account that is deleted before the token is returned, so no CA
// can have reviewed it while the pod existed. Only TokenReview sees the
// deletion: an offline JWT check would accept the token until its exp.
func (w workloadFixture) deletedPodToken(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	gone, err := cluster.CreatePod(ctx, w.ns, "gone", w.sa)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := cluster.Token(ctx, harness.TokenSpec{Namespace: w.ns, ServiceAccount: w.sa, Audiences: []string{"istio-ca"}, Pod: gone})
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.DeletePod(ctx, gone); err != nil {
		t.Fatal(err)
	}
	return tok
}

// expiredToken re-signs a genuine token's claims with the cluster's
// service-account key and an exp in the past: a real, expired token. The
// API server's minimum TokenRequest lifetime (10m) rules out waiting for one.
func expiredToken(t *testing.T, genuine string, exp time.Time) string {
	t.Helper()
	claims, err := harness.Claims(genuine)
	if err != nil {
		t.Fatal(err)
	}
	claims["iat"] = exp.Add(-time.Hour).Unix()
	claims["nbf"] = exp.Add(-time.Hour).Unix()
	claims["exp"] = exp.Unix()
	tok, err := cluster.SignToken(claims)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestAPIServerTokenFacts checks what the other tests build on: what the
// real API server says about each kind of token. If one of these facts
// changed, a CA rejection could pass for the wrong reason.
func TestAPIServerTokenFacts(t *testing.T) {
	ctx := context.Background()
	w := newWorkload(t, "facts")
	good := w.token(t, "istio-ca")
	goneTok := w.deletedPodToken(t)
	cases := []struct {
		name     string
		token    string
		wantAuth bool
		wantUser string
	}{
		{"bound token", good, true, "system:serviceaccount:facts:workload"},
		{"wrong audience", w.token(t, "not-istio-ca"), false, ""},
		{"re-signed, still valid", expiredToken(t, good, time.Now().Add(time.Hour)), true, "system:serviceaccount:facts:workload"},
		{"re-signed, expired", expiredToken(t, good, time.Now().Add(-time.Minute)), false, ""},
		{"bound pod deleted", goneTok, false, ""},
		{"static user", staticUser.Token, true, staticUser.User},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, err := cluster.Review(ctx, tc.token, []string{"istio-ca"})
			if err != nil {
				t.Fatal(err)
			}
			if st.Authenticated != tc.wantAuth || st.User.Username != tc.wantUser {
				t.Fatalf("review: authenticated=%v user=%q error=%q; want %v %q", st.Authenticated, st.User.Username, st.Error, tc.wantAuth, tc.wantUser)
			}
		})
	}
	st, err := cluster.Review(ctx, good, []string{"istio-ca"})
	if err != nil {
		t.Fatal(err)
	}
	if got := st.User.Extra["authentication.kubernetes.io/pod-name"]; len(got) != 1 || got[0] != w.pod.Name {
		t.Fatalf("pod-name extra = %v, want [%s]", got, w.pod.Name)
	}
}

// TestCAWithTokenReview runs `meshid server --kubeconfig` against the real
// API server and checks every authentication outcome by its gRPC code.
func TestCAWithTokenReview(t *testing.T) {
	ctx := context.Background()
	ca := startCA(t, cluster.AdminKubeconfig())
	ca.connect(t, ca.stateRoots(t))
	w := newWorkload(t, "ca-e2e")
	good := w.token(t, "istio-ca")
	goneTok := w.deletedPodToken(t)

	cases := []struct {
		name  string
		token string
		sa    string // the identity the CSR asks for
		want  codes.Code
	}{
		{"bound token, own identity", good, "workload", codes.OK},
		{"wrong audience", w.token(t, "not-istio-ca"), "workload", codes.Unauthenticated},
		{"expired token", expiredToken(t, good, time.Now().Add(-time.Minute)), "workload", codes.Unauthenticated},
		{"bound pod deleted", goneTok, "workload", codes.Unauthenticated},
		{"another service account's identity", good, "other", codes.PermissionDenied},
		{"non-service-account user", staticUser.Token, "workload", codes.Unauthenticated},
		{"no token", "", "workload", codes.Unauthenticated},
		{"garbage token", "not-a-jwt", "workload", codes.Unauthenticated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := workloadID(w.ns, tc.sa)
			chain, err := ca.sign(ctx, tc.token, id)
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code = %v (%v), want %v", got, err, tc.want)
			}
			if tc.want == codes.OK {
				verifySVID(t, chain, ca.roots, id)
			}
		})
	}
}
