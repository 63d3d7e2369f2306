package podcert_test

import (
	"context"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/testkit"
)

const otherUID = types.UID("00000000-0000-4000-8000-000000000000")

// TestDeniedPastNodeRestriction: requests an admin creates (NodeRestriction
// judges only a node's) whose spec does not match the live cluster are
// Denied, each with the reason of what does not match and a message naming
// the field: the pod's UID, service account, node, a deleted pod, a pod
// without the signer's volume, and an annotation the signer does not
// document. Nothing is signed for any of them.
func TestDeniedPastNodeRestriction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_, reg := startCA(t, caserver.Config{})
	ns := "pc-denied"
	sa := workload(t, ctx, ns, "app")
	other := workload(t, ctx, ns, "other")
	a := newKubelet(t, ctx, "node-denied-a")
	b := newKubelet(t, ctx, "node-denied-b")
	pod := createPod(t, ctx, ns, "app-0", sa.Name, a.node.Name, signerName)
	bare := createPod(t, ctx, ns, "bare-0", sa.Name, a.node.Name, "example.com/other")
	gone := createPod(t, ctx, ns, "gone-0", sa.Name, a.node.Name, signerName)
	if err := cluster.Client().CoreV1().Pods(ns).Delete(ctx, gone.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	// No kubelet finalizes it: wait until the API server forgot it.
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Client().CoreV1().Pods(ns).Get(ctx, gone.Name, metav1.GetOptions{})
		return err != nil, nil
	}); err != nil {
		t.Fatal(err)
	}

	key := newKey(t, "ECDSAP256")
	for _, tc := range []struct {
		name, reason, field string
		edit                func(r *certificatesv1.PodCertificateRequest)
		pod                 *corev1.Pod
	}{
		{"pod UID", "PodMismatch", "spec.podUID", func(r *certificatesv1.PodCertificateRequest) { r.Spec.PodUID = otherUID }, pod},
		{"deleted pod", "PodMismatch", "spec.podName", nil, gone},
		{"pod without the volume", "PodMismatch", "spec.signerName", nil, bare},
		{"service account", "ServiceAccountMismatch", "spec.serviceAccountName", func(r *certificatesv1.PodCertificateRequest) {
			r.Spec.ServiceAccountName, r.Spec.ServiceAccountUID = other.Name, other.UID
		}, pod},
		{"service account UID", "ServiceAccountMismatch", "spec.serviceAccountUID", func(r *certificatesv1.PodCertificateRequest) { r.Spec.ServiceAccountUID = otherUID }, pod},
		{"node", "NodeMismatch", "spec.nodeName", func(r *certificatesv1.PodCertificateRequest) {
			r.Spec.NodeName, r.Spec.NodeUID = types.NodeName(b.node.Name), b.node.UID
		}, pod},
		{"node UID", "NodeMismatch", "spec.nodeUID", func(r *certificatesv1.PodCertificateRequest) { r.Spec.NodeUID = otherUID }, pod},
		{"unknown annotation", "InvalidUnverifiedUserAnnotations", "example.com/ttl", func(r *certificatesv1.PodCertificateRequest) {
			r.Spec.UnverifiedUserAnnotations = map[string]string{"example.com/ttl": "1h"}
		}, pod},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := request(t, tc.pod, a.node, sa, signerName, key)
			if tc.edit != nil {
				tc.edit(r)
			}
			created, err := cluster.Client().CertificatesV1().PodCertificateRequests(ns).Create(ctx, r, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got := answered(t, ctx, created)
			typ, reason, msg := condition(got)
			if typ != certificatesv1.PodCertificateRequestConditionTypeDenied || reason != tc.reason || !strings.Contains(msg, tc.field) {
				t.Fatalf("%s %s %q, want Denied %s naming %s", typ, reason, msg, tc.reason, tc.field)
			}
			if got.Status.CertificateChain != "" || got.Status.NotAfter != nil {
				t.Fatal("a denied request carries a certificate")
			}
		})
	}
	// The one certificate the CA issued is its own serving certificate.
	if v, _ := testkit.LookupMetric(t, reg, "meshid_ca_certificates_issued_total"); v != 1 {
		t.Fatalf("%v certificates issued besides the serving certificate for denied requests", v-1)
	}
}

// TestOtherSignerUntouched: the request of another signer, made by the
// kubelet for a pod mounting that signer's volume, is never written by
// meshid: after a request of meshid's own, made later, is answered, the
// other still has no condition and no field manager but the kubelet's.
func TestOtherSignerUntouched(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	startCA(t, caserver.Config{})
	ns := "pc-other"
	sa := workload(t, ctx, ns, "app")
	k := newKubelet(t, ctx, "node-other")
	pod := createPod(t, ctx, ns, "app-0", sa.Name, k.node.Name, signerName, "example.com/other")
	pcrs := k.client.CertificatesV1().PodCertificateRequests(ns)
	theirs, err := pcrs.Create(ctx, request(t, pod, k.node, sa, "example.com/other", newKey(t, "ECDSAP256")), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ours, err := pcrs.Create(ctx, request(t, pod, k.node, sa, signerName, newKey(t, "ECDSAP256")), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if typ, _, msg := condition(answered(t, ctx, ours)); typ != certificatesv1.PodCertificateRequestConditionTypeIssued {
		t.Fatalf("our request: %s %s", typ, msg)
	}
	got, err := cluster.Client().CertificatesV1().PodCertificateRequests(ns).Get(ctx, theirs.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != theirs.ResourceVersion || len(got.Status.Conditions) != 0 || got.Status.CertificateChain != "" {
		t.Fatalf("another signer's request was written: %+v", got.Status)
	}
	for _, m := range got.ManagedFields {
		if m.Subresource == "status" {
			t.Fatalf("another signer's request has a status manager %s", m.Manager)
		}
	}
}

// TestFailedWhenThePolicyRefuses: a CA whose --max-ttl is under the hour
// the API server demands cannot issue any pod certificate: the request is
// Failed (a permanent refusal, not retried), with the CA's reason, and
// carries no certificate.
func TestFailedWhenThePolicyRefuses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	startCA(t, caserver.Config{Issuance: caserver.IssuanceConfig{MaxTTL: 30 * time.Minute, DefaultTTL: 30 * time.Minute}})
	ns := "pc-failed"
	sa := workload(t, ctx, ns, "app")
	k := newKubelet(t, ctx, "node-failed")
	pod := createPod(t, ctx, ns, "app-0", sa.Name, k.node.Name, signerName)
	r, err := createPCR(ctx, k.client, ns, request(t, pod, k.node, sa, signerName, newKey(t, "ECDSAP256")))
	if err != nil {
		t.Fatal(err)
	}
	got := answered(t, ctx, r)
	typ, reason, msg := condition(got)
	if typ != certificatesv1.PodCertificateRequestConditionTypeFailed || reason != "SigningRefused" || !strings.Contains(msg, "TTL") {
		t.Fatalf("%s %s %q, want Failed SigningRefused about the TTL", typ, reason, msg)
	}
	if got.Status.CertificateChain != "" {
		t.Fatal("a failed request carries a certificate")
	}
}
