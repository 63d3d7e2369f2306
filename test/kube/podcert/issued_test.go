package podcert_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

// keyTypes are every keyType a podCertificate volume may ask for.
var keyTypes = []string{"RSA3072", "RSA4096", "ECDSAP256", "ECDSAP384", "ECDSAP521", "ED25519"}

// trustBundleRoots waits for the signer's ClusterTrustBundle to hold
// exactly want (any when want is nil) and returns its roots.
func trustBundleRoots(t *testing.T, ctx context.Context, want []*x509.Certificate) []*x509.Certificate {
	t.Helper()
	var (
		roots []*x509.Certificate
		last  string
	)
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		b, err := cluster.Client().CertificatesV1().ClusterTrustBundles().Get(ctx, bundleName, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		if b.Spec.SignerName != signerName {
			last = "signer " + b.Spec.SignerName
			return false, nil
		}
		last = b.Spec.TrustBundle
		roots, err = certs.ParseCertificates([]byte(b.Spec.TrustBundle))
		return err == nil && (want == nil || bytes.Equal([]byte(b.Spec.TrustBundle), certs.EncodeCertificates(want...))), nil
	})
	if err != nil {
		t.Fatalf("ClusterTrustBundle %s: %v (last: %s)", bundleName, err, last)
	}
	return roots
}

// checkIssued checks an Issued request: the chain parses, the leaf is for
// key and carries exactly id, go-spiffe accepts it as an X509-SVID of the
// bundle's roots, and the status' times are the leaf's, with
// beginRefreshAt where the API server allows it.
func checkIssued(t *testing.T, got *certificatesv1.PodCertificateRequest, key crypto.Signer, id string, roots []*x509.Certificate) *x509.Certificate {
	t.Helper()
	if typ, reason, msg := condition(got); typ != certificatesv1.PodCertificateRequestConditionTypeIssued {
		t.Fatalf("condition %s %s: %s", typ, reason, msg)
	}
	chain, err := certs.ParseCertificates([]byte(got.Status.CertificateChain))
	if err != nil || len(chain) == 0 {
		t.Fatalf("chain does not parse: %v", err)
	}
	leaf := chain[0]
	if pub, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(key.Public()) {
		t.Fatal("the leaf is not for the requested key")
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id || len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0 {
		t.Fatalf("leaf SANs: URIs %v DNS %v IPs %v, want exactly %s", leaf.URIs, leaf.DNSNames, leaf.IPAddresses, id)
	}
	ders := make([][]byte, len(chain))
	for i, c := range chain {
		ders[i] = c.Raw
	}
	svid, _, err := x509svid.ParseAndVerify(ders, x509bundle.FromX509Authorities(trustDomain, roots))
	if err != nil || svid.String() != id {
		t.Fatalf("go-spiffe x509svid: %v %v", svid, err)
	}
	st := got.Status
	if !st.NotBefore.Time.Equal(leaf.NotBefore) || !st.NotAfter.Time.Equal(leaf.NotAfter) {
		t.Fatalf("status times %s..%s, leaf %s..%s", st.NotBefore, st.NotAfter, leaf.NotBefore, leaf.NotAfter)
	}
	if r := st.BeginRefreshAt.Time; r.Before(leaf.NotBefore.Add(10*time.Minute)) || r.After(leaf.NotAfter.Add(-10*time.Minute)) {
		t.Fatalf("beginRefreshAt %s outside [notBefore+10m, notAfter-10m]", r)
	}
	return leaf
}

// TestIssuedEveryKeyType: the test is the kubelet of a node. For a pod
// mounting the signer's podCertificate volume, a request of every key type
// kube allows is issued (a leaf for that key with exactly the pod's
// SPIFFE ID, accepted by go-spiffe against the ClusterTrustBundle's roots,
// valid for spec.maxExpirationSeconds) or, for the one the CA does not
// sign, denied UnsupportedKeyType naming a supported one. NodeRestriction
// is on: the same kubelet may not ask for a pod that does not mount the
// signer's volume.
func TestIssuedEveryKeyType(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv, reg := startCA(t, caserver.Config{})
	ns := "pc-issued"
	sa := workload(t, ctx, ns, "app")
	k := newKubelet(t, ctx, "node-issued")
	pod := createPod(t, ctx, ns, "app-0", sa.Name, k.node.Name, signerName)
	roots := trustBundleRoots(t, ctx, srv.Authority().Bundle().Roots)
	id := "spiffe://cluster.local/ns/" + ns + "/sa/" + sa.Name

	bare := createPod(t, ctx, ns, "bare-0", sa.Name, k.node.Name)
	_, err := createPCR(ctx, k.client, ns, request(t, bare, k.node, sa, signerName, newKey(t, "ECDSAP256")))
	if !apierrors.IsForbidden(err) {
		t.Fatalf("NodeRestriction is not on: a request for a pod without the volume: %v", err)
	}

	issued := 0
	for _, kt := range keyTypes {
		t.Run(kt, func(t *testing.T) {
			key := newKey(t, kt)
			r, err := createPCR(ctx, k.client, ns, request(t, pod, k.node, sa, signerName, key))
			if err != nil {
				t.Fatal(err)
			}
			got := answered(t, ctx, r)
			if kt == "ECDSAP521" {
				typ, reason, msg := condition(got)
				if typ != certificatesv1.PodCertificateRequestConditionTypeDenied || reason != certificatesv1.PodCertificateRequestConditionUnsupportedKeyType || !strings.Contains(msg, "ECDSAP256") {
					t.Fatalf("%s: %s %s %q, want Denied UnsupportedKeyType naming ECDSAP256", kt, typ, reason, msg)
				}
				if got.Status.CertificateChain != "" {
					t.Fatal("a denied request carries a chain")
				}
				return
			}
			leaf := checkIssued(t, got, key, id, roots)
			credentialBundle(t, key, got)
			if life := leaf.NotAfter.Sub(leaf.NotBefore); life != 24*time.Hour {
				t.Fatalf("lifetime %s, want spec.maxExpirationSeconds (24h)", life)
			}
			issued++
		})
	}
	// The signer counts an answer once the API server took it, so the
	// last count may lag the status this test read: wait for it, then
	// hold it to exactly one per issued request.
	issuedCount := func() float64 {
		return testkit.Metric(t, reg, "meshid_ca_pod_certificates_total", "result", "issued", "reason", "Issued")
	}
	testkit.Until(t, "the signer's count of issued requests", func() bool { return issuedCount() >= float64(issued) })
	if v := issuedCount(); v != float64(issued) {
		t.Fatalf("meshid_ca_pod_certificates_total{issued} = %v, want %d", v, issued)
	}
}

// credentialBundle writes the credential bundle the kubelet mounts (the
// key as PKCS#8, then the chain) and loads it as docs/pod-certificates.md
// shows an application doing: tls.X509KeyPair of the one file.
func credentialBundle(t *testing.T, key crypto.Signer, got *certificatesv1.PodCertificateRequest) {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	data := append(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), got.Status.CertificateChain...)
	cert, err := tls.X509KeyPair(data, data)
	if err != nil {
		t.Fatalf("the credential bundle does not load: %v", err)
	}
	if cert.Leaf == nil || len(cert.Leaf.URIs) != 1 {
		t.Fatalf("loaded leaf %+v", cert.Leaf)
	}
}
