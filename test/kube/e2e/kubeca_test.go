package e2e_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/test/kube/harness"
	"github.com/meshid/meshid/testkit"
)

const (
	caNamespace   = "istio-system"
	caSecret      = "meshid-ca"
	pluggedSecret = "cacerts"
	rootConfigMap = "istio-ca-root-cert"
)

// eventually polls cond every 100ms until it returns nil, failing the test
// with cond's last error after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func(context.Context) error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		last = cond(ctx)
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("%s: not within %s: %v", what, timeout, last)
	}
}

// metric reads an unlabelled metric (its one sample) from a /metrics page.
func metric(monitor, name string) (float64, error) { return metricSum(monitor, name) }

// secretRoots returns the roots of a CA Secret in the cacerts layout.
func secretRoots(ctx context.Context, name string) ([]*x509.Certificate, error) {
	s, err := cluster.Client().CoreV1().Secrets(caNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return certs.ParseCertificates(s.Data[keystore.RootCertFile])
}

// configMapHolds checks that ns's root ConfigMap holds exactly roots.
func configMapHolds(ctx context.Context, ns string, roots []*x509.Certificate) error {
	cm, err := cluster.Client().CoreV1().ConfigMaps(ns).Get(ctx, rootConfigMap, metav1.GetOptions{})
	if err != nil {
		return err
	}
	got, err := certs.ParseCertificates([]byte(cm.Data["root-cert.pem"]))
	if err != nil {
		return fmt.Errorf("%s/%s: %w", ns, rootConfigMap, err)
	}
	if !sameSet(got, roots) {
		return fmt.Errorf("%s/%s holds %d other certificate(s)", ns, rootConfigMap, len(got))
	}
	return nil
}

// everyConfigMapHolds checks configMapHolds in every namespace the CA
// publishes to by default: all but Kubernetes' own.
func everyConfigMapHolds(ctx context.Context, roots []*x509.Certificate) error {
	nss, err := cluster.Client().CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, ns := range nss.Items {
		switch ns.Name {
		case "kube-system", "kube-public", "kube-node-lease":
			continue
		}
		if err := configMapHolds(ctx, ns.Name, roots); err != nil {
			return err
		}
	}
	return nil
}

// signsUnder checks that s issues a certificate for w that verifies to
// roots and, when signer is set, is issued by it.
func signsUnder(ctx context.Context, s *caServer, token string, id spiffeid.ID, roots []*x509.Certificate, signer *x509.Certificate) error {
	chain, err := s.sign(ctx, token, id)
	if err != nil {
		return err
	}
	var svid []*x509.Certificate
	for _, c := range chain {
		if !isRoot(c, roots) {
			svid = append(svid, c)
		}
	}
	if _, _, err := x509svid.Verify(svid, x509bundle.FromX509Authorities(trustDomain, roots)); err != nil {
		return err
	}
	if signer != nil && svid[0].CheckSignatureFrom(signer) != nil {
		return fmt.Errorf("leaf not signed by %s", signer.Subject)
	}
	return nil
}

// sameSet reports whether a and b hold the same certificates in any order:
// during a CA rotation the bundle is a union whose order follows the phase.
func sameSet(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for _, c := range a {
		if !slices.ContainsFunc(b, c.Equal) {
			return false
		}
	}
	return true
}

func sameCerts(a, b []*x509.Certificate) bool {
	return slices.EqualFunc(a, b, (*x509.Certificate).Equal)
}

// podCertificatesDir holds the opt-in RBAC of the pod certificate signer
// (--pod-certificate-signer); test/kube/podcert runs the CA with it and
// checks it is minimal.
const podCertificatesDir = "pod-certificates/"

// deployRBAC applies deploy/'s namespace, ServiceAccount and RBAC (without
// local verification's, 15-local-verification.yaml) for real,
// and returns a kubeconfig that authenticates as that ServiceAccount.
func deployRBAC(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	a := newApplier(t, cluster.AdminConfig())
	var n int
	for _, m := range loadManifests(t) {
		if strings.HasPrefix(m.file, nodeModeDir) || strings.HasPrefix(m.file, localVerificationDir) || strings.HasPrefix(m.file, podCertificatesDir) {
			continue // opt-in RBAC (TestNodeModeRBAC, test/kube/podcert), local verification's (TestLocalVerificationRBAC)
		}
		switch m.obj.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if m.obj.GetKind() != "Namespace" && m.obj.GetNamespace() != caNamespace && m.obj.GetNamespace() != "" {
				continue // the agent example's own objects
			}
			if err := a.apply(ctx, m.obj, false); err != nil {
				t.Fatalf("%s: %v", m, err)
			}
			n++
		}
	}
	if n < 5 {
		t.Fatalf("deploy/ holds only %d namespace/RBAC objects for the CA", n)
	}
	tok, err := cluster.Token(ctx, harness.TokenSpec{Namespace: caNamespace, ServiceAccount: "meshid", Expiration: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	kc, err := cluster.TokenKubeconfig("meshid-ca-sa", tok)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// resetCAState deletes what an earlier CA left in its namespace.
func resetCAState(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	c := cluster.Client()
	for _, name := range []string{caSecret, pluggedSecret, caserver.RotationStateSecret} {
		if err := c.CoreV1().Secrets(caNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	if err := c.CoordinationV1().Leases(caNamespace).Delete(ctx, "meshid-ca", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

func startKubeCA(t *testing.T, kubeconfig, pod string) *caServer {
	t.Helper()
	// A new root signs 2 s after it is trusted (issue 13's rotation).
	return startCA(t, kubeconfig, "--kube-ca-secret", "--namespace", caNamespace, "--pod-name", pod, "--rotation-propagation", "2s")
}

func leaseHolder(ctx context.Context) (string, error) { return holderOf(ctx, "meshid-ca") }

// holderOf returns the holder of the Lease name in the CA's namespace.
func holderOf(ctx context.Context, name string) (string, error) {
	l, err := cluster.Client().CoordinationV1().Leases(caNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return "", fmt.Errorf("lease has no holder")
	}
	return *l.Spec.HolderIdentity, nil
}

// gaugeLeader checks that, of replicas (by --pod-name), the holder of the
// Lease lease alone reports gauge 1 and every other 0, and returns it.
func gaugeLeader(ctx context.Context, replicas map[string]*caServer, lease, gauge string) (string, error) {
	holder, err := holderOf(ctx, lease)
	if err != nil {
		return "", err
	}
	if replicas[holder] == nil {
		return "", fmt.Errorf("Lease %s held by %q, not a replica", lease, holder)
	}
	for pod, r := range replicas {
		v, err := metric(r.monitor, gauge)
		if err != nil {
			return "", fmt.Errorf("%s: %w", pod, err)
		}
		if want := map[bool]float64{true: 1}[pod == holder]; v != want {
			return "", fmt.Errorf("%s: %s %v, want %v (Lease %s held by %s)", pod, gauge, v, want, lease, holder)
		}
	}
	return holder, nil
}

// TestKubeCA runs two `meshid server --kube-ca-secret` replicas as the
// meshid ServiceAccount, with exactly the RBAC of deploy/, and checks the
// Kubernetes-native features step by step: leader election, the root Secret
// created by the leader only, active-active signing, the root ConfigMap in
// every namespace (new ones too) with repair, hot Secret rotation, cacerts
// precedence, leader failover, and that the RBAC is no wider than needed.
func TestKubeCA(t *testing.T) {
	ctx := context.Background()
	kubeconfig := deployRBAC(t)
	resetCAState(t)
	t.Cleanup(func() { resetCAState(t) })

	replicas := map[string]*caServer{
		"ca-0": startKubeCA(t, kubeconfig, "ca-0"),
		"ca-1": startKubeCA(t, kubeconfig, "ca-1"),
	}
	w := newWorkload(t, "kube-ca-workload")
	token := w.token(t, "istio-ca")
	id := workloadID(w.ns, w.sa)
	const wait = 30 * time.Second

	var leader, follower string
	t.Run("one replica leads", func(t *testing.T) {
		eventually(t, wait, "lease holder and meshid_ca_leader agree", func(ctx context.Context) error {
			h, err := leaseHolder(ctx)
			if err != nil {
				return err
			}
			if replicas[h] == nil {
				return fmt.Errorf("lease held by unknown %q", h)
			}
			for name, r := range replicas {
				v, err := metric(r.monitor, "meshid_ca_leader")
				if err != nil {
					return err
				}
				if want := map[bool]float64{true: 1, false: 0}[name == h]; v != want {
					return fmt.Errorf("%s: meshid_ca_leader = %v, want %v", name, v, want)
				}
			}
			leader = h
			return nil
		})
		follower = map[string]string{"ca-0": "ca-1", "ca-1": "ca-0"}[leader]
	})
	if leader == "" {
		t.FailNow()
	}

	var root0 []*x509.Certificate
	t.Run("the leader alone created the root Secret", func(t *testing.T) {
		s, err := cluster.Client().CoreV1().Secrets(caNamespace).Get(ctx, caSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Type != "istio.io/ca-root" {
			t.Errorf("Secret type %q, want istio.io/ca-root", s.Type)
		}
		if root0, err = secretRoots(ctx, caSecret); err != nil || len(root0) != 1 {
			t.Fatalf("roots in %s: %d, %v", caSecret, len(root0), err)
		}
		for name, want := range map[string]float64{leader: 1, follower: 0} {
			if v, err := metric(replicas[name].monitor, "meshid_ca_secret_creations_total"); err != nil || v != want {
				t.Errorf("%s: meshid_ca_secret_creations_total = %v (%v), want %v", name, v, err, want)
			}
		}
	})
	if root0 == nil {
		t.FailNow()
	}
	for _, r := range replicas {
		r.connect(t, root0)
	}

	t.Run("every replica signs with the Secret's CA", func(t *testing.T) {
		for name, r := range replicas {
			if err := signsUnder(ctx, r, token, id, root0, root0[0]); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	})

	t.Run("root ConfigMap in every namespace", func(t *testing.T) {
		eventually(t, wait, "every namespace has the root", func(ctx context.Context) error { return everyConfigMapHolds(ctx, root0) })
	})
	t.Run("root ConfigMap in a new namespace", func(t *testing.T) {
		if err := cluster.EnsureNamespace(ctx, "kube-ca-created-later"); err != nil {
			t.Fatal(err)
		}
		eventually(t, wait, "the new namespace has the root", func(ctx context.Context) error { return configMapHolds(ctx, "kube-ca-created-later", root0) })
	})
	t.Run("edited ConfigMap is repaired", func(t *testing.T) {
		cms := cluster.Client().CoreV1().ConfigMaps(w.ns)
		cm, err := cms.Get(ctx, rootConfigMap, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data["root-cert.pem"] = "tampered"
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, wait, "the edit is undone", func(ctx context.Context) error { return configMapHolds(ctx, w.ns, root0) })
	})
	t.Run("deleted ConfigMap is recreated", func(t *testing.T) {
		if err := cluster.Client().CoreV1().ConfigMaps(w.ns).Delete(ctx, rootConfigMap, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, wait, "the ConfigMap is back", func(ctx context.Context) error { return configMapHolds(ctx, w.ns, root0) })
	})

	// An operator rotates the self-signed root by rewriting the Secret: no
	// restart, every replica and every namespace follows.
	rotated, files, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: trustDomain.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("a rewritten root Secret is picked up", func(t *testing.T) {
		secrets := cluster.Client().CoreV1().Secrets(caNamespace)
		s, err := secrets.Get(ctx, caSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Data = files
		if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		for name, r := range replicas {
			r.connect(t, append(root0, rotated.Roots...)) // the serving cert may still chain to the old root
			eventually(t, wait, name+" signs under the new root", func(ctx context.Context) error {
				return signsUnder(ctx, r, token, id, rotated.Roots, rotated.Cert)
			})
		}
		// The old root stays until the old CA's last leaf expires (--max-ttl).
		union := append(slices.Clone(root0), rotated.Roots...)
		eventually(t, wait, "every namespace has the old and the new root", func(ctx context.Context) error { return everyConfigMapHolds(ctx, union) })
	})

	plugged, pInter, pRoot := testkit.Plugged(t, "operator")
	t.Run("cacerts takes precedence", func(t *testing.T) {
		_, err := cluster.Client().CoreV1().Secrets(caNamespace).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: pluggedSecret, Namespace: caNamespace},
			Data:       plugged,
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		roots := []*x509.Certificate{pRoot}
		for name, r := range replicas {
			r.connect(t, append(append(root0, rotated.Roots...), pRoot))
			eventually(t, wait, name+" signs with the plugged intermediate", func(ctx context.Context) error {
				return signsUnder(ctx, r, token, id, roots, pInter)
			})
		}
		all := append(append(slices.Clone(root0), rotated.Roots...), pRoot)
		eventually(t, wait, "every namespace has the plugged root with the earlier ones", func(ctx context.Context) error { return everyConfigMapHolds(ctx, all) })
	})
	t.Run("deleting cacerts falls back to the root Secret", func(t *testing.T) {
		if err := cluster.Client().CoreV1().Secrets(caNamespace).Delete(ctx, pluggedSecret, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		for name, r := range replicas {
			eventually(t, wait, name+" signs under the root Secret again", func(ctx context.Context) error {
				return signsUnder(ctx, r, token, id, rotated.Roots, rotated.Cert)
			})
		}
		// The root Secret's root is trusted already: it signs at once; the
		// plugged root retires with the others.
		all := append(append(slices.Clone(root0), rotated.Roots...), pRoot)
		eventually(t, wait, "every namespace keeps every root until retired", func(ctx context.Context) error { return everyConfigMapHolds(ctx, all) })
	})

	t.Run("the follower takes over when the leader stops", func(t *testing.T) {
		if err := replicas[leader].proc.Stop(20 * time.Second); err != nil {
			t.Fatal(err)
		}
		eventually(t, wait, "the follower holds the lease", func(ctx context.Context) error {
			h, err := leaseHolder(ctx)
			if err == nil && h != follower {
				err = fmt.Errorf("lease held by %s", h)
			}
			return err
		})
		// Leader-only work moved: the new leader repairs a deletion.
		if err := cluster.Client().CoreV1().ConfigMaps(w.ns).Delete(ctx, rootConfigMap, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		all := append(append(slices.Clone(root0), rotated.Roots...), pRoot)
		eventually(t, wait, "the new leader recreates the ConfigMap", func(ctx context.Context) error { return configMapHolds(ctx, w.ns, all) })
		if err := signsUnder(ctx, replicas[follower], token, id, rotated.Roots, rotated.Cert); err != nil {
			t.Fatal(err)
		}
	})
}
