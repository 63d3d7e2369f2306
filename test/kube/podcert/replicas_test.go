package podcert_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/testkit"
)

// TestReplicasSignOnce: two CA replicas sharing the CA Secret
// (--kube-ca-secret) both run the signer; every request is issued, and
// the replicas together signed exactly one certificate per request (the
// Authority's issued counter, which counts every signature): no double
// issuance.
func TestReplicasSignOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var regs []*prometheus.Registry
	for i := range 2 {
		_, reg := startCA(t, caserver.Config{KubeCASecret: true, Kube: caserver.KubeConfig{PodName: fmt.Sprintf("meshid-replica-%d", i)}})
		regs = append(regs, reg)
	}
	ns := "pc-replicas"
	sa := workload(t, ctx, ns, "app")
	k := newKubelet(t, ctx, "node-replicas")
	const n = 60
	reqs := make([]*certificatesv1.PodCertificateRequest, n)
	for i := range n {
		pod := createPod(t, ctx, ns, fmt.Sprintf("app-%d", i), sa.Name, k.node.Name, signerName)
		reqs[i] = request(t, pod, k.node, sa, signerName, newKey(t, "ECDSAP256"))
	}
	var g errgroup.Group
	g.SetLimit(8)
	created := make([]*certificatesv1.PodCertificateRequest, n)
	for i := range n {
		g.Go(func() (err error) {
			created[i], err = createPCR(ctx, k.client, ns, reqs[i])
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	for _, r := range created {
		if typ, reason, msg := condition(answered(t, ctx, r)); typ != certificatesv1.PodCertificateRequestConditionTypeIssued {
			t.Fatalf("%s: %s %s %s", r.Name, typ, reason, msg)
		}
	}
	signed, answers := 0.0, 0.0
	for _, reg := range regs {
		v, _ := testkit.LookupMetric(t, reg, "meshid_ca_certificates_issued_total")
		signed += v
		v, _ = testkit.LookupMetric(t, reg, "meshid_ca_pod_certificates_total", "result", "issued", "reason", "Issued")
		answers += v
	}
	// Each replica also issued its own serving certificate.
	if signed-2 != n || answers != n {
		t.Fatalf("%v leaves signed and %v answers written for %d requests", signed-2, answers, n)
	}
}
