package podcert_test

import (
	"context"
	"crypto/x509"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/internal/clock"
)

// TestTrustBundleRepaired: the leader recreates the ClusterTrustBundle
// when someone deletes it, and restores its roots when someone edits it.
func TestTrustBundleRepaired(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, _ := startCA(t, caserver.Config{})
	want := srv.Authority().Bundle().Roots
	trustBundleRoots(t, ctx, want)
	ctbs := cluster.Client().CertificatesV1().ClusterTrustBundles()
	if err := ctbs.Delete(ctx, bundleName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	trustBundleRoots(t, ctx, want)
	b, err := ctbs.Get(ctx, bundleName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.Spec.TrustBundle = string(cluster.CACertPEM()) // another CA's root
	if _, err := ctbs.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	trustBundleRoots(t, ctx, want)
}

// verifies reports whether leaf chains to roots alone.
func verifies(leaf *x509.Certificate, inter []*x509.Certificate, roots ...*x509.Certificate) bool {
	pool, ip := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	for _, c := range inter {
		ip.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: ip, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}, CurrentTime: leaf.NotBefore.Add(time.Minute)})
	return err == nil
}

// TestTrustBundleFollowsRotation: during a root rotation of the
// self-signed CA (its injected clock and the rotation the admin socket
// drives), the ClusterTrustBundle holds both roots before any leaf is
// signed by the new one, keeps the old root while a leaf it signed is
// valid, and drops it once the last such leaf has expired.
func TestTrustBundleFollowsRotation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The CA's clock starts 2 minutes behind, so that its root is older
	// than its backdating when the clock catches up, and every status'
	// notBefore stays within the API server's 5 minutes.
	clk := clock.NewFake(time.Now().Add(-2 * time.Minute))
	const maxTTL = 2 * time.Hour
	srv, _ := startCA(t, caserver.Config{Clock: clk, Issuance: caserver.IssuanceConfig{MaxTTL: maxTTL, DefaultTTL: time.Hour}})
	clk.Add(2 * time.Minute)
	old := srv.Authority().Bundle().Roots
	if len(old) != 1 {
		t.Fatalf("%d roots before the rotation", len(old))
	}
	trustBundleRoots(t, ctx, old)

	ns := "pc-rotation"
	sa := workload(t, ctx, ns, "app")
	k := newKubelet(t, ctx, "node-rotation")
	pod := createPod(t, ctx, ns, "app-0", sa.Name, k.node.Name, signerName)
	issue := func() (*x509.Certificate, []*x509.Certificate) {
		t.Helper()
		r, err := createPCR(ctx, k.client, ns, request(t, pod, k.node, sa, signerName, newKey(t, "ECDSAP256")))
		if err != nil {
			t.Fatal(err)
		}
		got := answered(t, ctx, r)
		if typ, reason, msg := condition(got); typ != certificatesv1.PodCertificateRequestConditionTypeIssued {
			t.Fatalf("%s %s %s", typ, reason, msg)
		}
		chain := mustChain(t, got)
		return chain[0], chain[1:]
	}

	if err := srv.Rotation().RotateRoot(); err != nil {
		t.Fatal(err)
	}
	both := srv.Authority().Bundle().Roots
	if len(both) != 2 {
		t.Fatalf("%d roots while the new root is prepared", len(both))
	}
	trustBundleRoots(t, ctx, both)
	newRoot := both[0]
	if newRoot.Equal(old[0]) {
		newRoot = both[1]
	}
	lastOld, inter := issue()
	if !verifies(lastOld, inter, old[0]) {
		t.Fatal("a leaf signed while the new root is only prepared does not chain to the old root")
	}

	if err := srv.Rotation().Activate(); err != nil {
		t.Fatal(err)
	}
	clk.Add(2 * time.Minute) // the new root older than the backdating
	moved, inter := issue()
	if !verifies(moved, inter, newRoot) || verifies(moved, inter, old[0]) {
		t.Fatal("a leaf signed after the activation does not chain to the new root alone")
	}
	trustBundleRoots(t, ctx, both)

	// Until the last leaf of the old root expires, the old root stays.
	clk.Set(lastOld.NotAfter.Add(-time.Minute))
	if got := srv.Authority().Bundle().Roots; len(got) != 2 {
		t.Fatalf("the old root left at %s, before the last leaf it signed expired (%s)", clk.Now(), lastOld.NotAfter)
	}
	trustBundleRoots(t, ctx, both)
	// The rotation retires it a whole maximum TTL (and the backdating)
	// after the activation: the bundle then holds the new root alone.
	clk.Add(maxTTL + ca.DefaultClockSkew)
	trustBundleRoots(t, ctx, []*x509.Certificate{newRoot})
	if !clk.Now().After(lastOld.NotAfter) {
		t.Fatal("the old root left before its last leaf expired")
	}
}
