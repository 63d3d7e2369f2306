package e2e_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kube"
	"github.com/meshid/meshid/ca/kube/election"
	"github.com/meshid/meshid/ca/kube/rootpublisher"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/testkit"
)

// publishLabel marks the namespaces these tests publish to, so that the
// CAs of other tests' namespaces are left alone and vice versa.
const publishLabel = "meshid-test/rootpublisher"

// replica is one CA replica's Kubernetes controller, with its key held
// outside Kubernetes (Config.Roots = its Authority).
type replica struct {
	ctrl *kube.Controller
	reg  *prometheus.Registry
}

func (r replica) writes(t *testing.T) float64 {
	return testkit.Metric(t, r.reg, "meshid_ca_root_configmap_writes_total", "op", "create") +
		testkit.Metric(t, r.reg, "meshid_ca_root_configmap_writes_total", "op", "update")
}

func startReplica(t *testing.T, kubeconfig, id string, authority *ca.Authority, clk clock.Clock, run string) replica {
	t.Helper()
	clients, err := kubeclient.NewClients(kubeclient.Config{Kubeconfig: kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	sel, err := labels.Parse(publishLabel + "=" + run)
	if err != nil {
		t.Fatal(err)
	}
	r := replica{reg: prometheus.NewRegistry()}
	r.ctrl, err = kube.New(kube.Config{
		Client:            clients.Controllers,
		Namespace:         caNamespace,
		Candidate:         election.Candidate{Identity: id, LeaseDuration: 5 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 250 * time.Millisecond},
		Roots:             authority,
		PublishNamespaces: sel,
		Clock:             clk,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("replica", id),
		Registerer:        r.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, id, r.ctrl.Run)
	return r
}

func labelledNamespace(t *testing.T, name, run string) {
	t.Helper()
	_, err := cluster.Client().CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{publishLabel: run}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// touchNamespace changes an annotation, which makes the leader reconcile
// the namespace now instead of after its retry backoff.
func touchNamespace(t *testing.T, name string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"meshid-test/touched":%q}}}`, time.Now().String())
	if _, err := cluster.Client().CoreV1().Namespaces().Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestRootPublisherWhateverHoldsTheKey runs two replicas of the CA's
// Kubernetes controller as the meshid ServiceAccount of deploy/ with the
// key held outside Kubernetes (a --state-dir root, a plugged --ca-dir):
// one of them publishes the Authority's roots to existing and new
// namespaces, repairs deletion and edits, follows a root change, and
// reports a namespace it cannot write to in Ready and a gauge.
func TestRootPublisherWhateverHoldsTheKey(t *testing.T) {
	kubeconfig := deployRBAC(t)
	sources := []struct {
		name   string
		bundle func(t *testing.T) *keystore.Bundle
	}{
		{"state-dir", func(t *testing.T) *keystore.Bundle {
			b, err := keystore.LoadOrCreateSelfSigned(keystore.SelfSignedConfig{Dir: t.TempDir(), TrustDomain: trustDomain.Name()})
			if err != nil {
				t.Fatal(err)
			}
			return b
		}},
		{"ca-dir", func(t *testing.T) *keystore.Bundle {
			files, _, _ := testkit.Plugged(t, "operator")
			dir := t.TempDir()
			for name, data := range files {
				if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			b, err := keystore.LoadDir(dir, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			return b
		}},
	}
	for _, src := range sources {
		t.Run(src.name, func(t *testing.T) {
			ctx := context.Background()
			resetCAState(t)
			run := src.name
			existing := "rootpub-" + run + "-existing"
			labelledNamespace(t, existing, run)
			authority, err := ca.New(ca.Config{TrustDomain: trustDomain, Bundle: src.bundle(t), Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			clk := clock.NewFake(time.Now())
			replicas := []replica{
				startReplica(t, kubeconfig, run+"-0", authority, clk, run),
				startReplica(t, kubeconfig, run+"-1", authority, clk, run),
			}
			roots := authority.Bundle().Roots
			eventually(t, time.Minute, "root in the existing namespace", func(ctx context.Context) error { return configMapHolds(ctx, existing, roots) })

			fresh := "rootpub-" + run + "-new"
			labelledNamespace(t, fresh, run)
			eventually(t, time.Minute, "root in a new namespace", func(ctx context.Context) error { return configMapHolds(ctx, fresh, roots) })
			unselected := "rootpub-" + run + "-other"
			labelledNamespace(t, unselected, "someone-else")

			// Repair: deleted, then edited.
			expectRepaired(t, ctx, existing, roots, time.Minute)

			// A root change in the Authority (rotation: old and new root
			// trusted together) reaches every namespace.
			next, _, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: trustDomain.Name()})
			if err != nil {
				t.Fatal(err)
			}
			next.Roots = append([]*x509.Certificate{next.Cert}, roots...)
			if err := authority.SetBundle(next); err != nil {
				t.Fatal(err)
			}
			for _, ns := range []string{existing, fresh} {
				eventually(t, time.Minute, "new roots in "+ns, func(ctx context.Context) error {
					clk.Add(kube.DefaultRootPollInterval) // the Controller polls the Authority
					return configMapHolds(ctx, ns, next.Roots)
				})
			}

			// Two replicas, one publisher.
			var leaders, writers int
			for _, r := range replicas {
				if r.ctrl.IsLeader() {
					leaders++
				}
				if r.writes(t) > 0 {
					writers++
				}
			}
			if leaders != 1 || writers != 1 {
				t.Errorf("%d leaders and %d replicas writing ConfigMaps, want 1 and 1", leaders, writers)
			}
			if _, err := cluster.Client().CoreV1().ConfigMaps(unselected).Get(ctx, rootConfigMap, metav1.GetOptions{}); err == nil {
				t.Errorf("published to %s, which the selector leaves out", unselected)
			}

			// A namespace the CA cannot write to (an admission policy
			// refuses the ConfigMap, as a cluster's policy engine might)
			// makes the publishing replica not ready after the grace
			// period, with the namespace named.
			locked := "rootpub-" + run + "-locked"
			lift := lockedNamespace(t, ctx, locked, run)
			leader := replicas[0]
			if replicas[1].ctrl.IsLeader() {
				leader = replicas[1]
			}
			eventually(t, time.Minute, "the failure counted", func(context.Context) error {
				if v := testkit.Metric(t, leader.reg, "meshid_ca_root_configmap_failing_namespaces"); v != 1 {
					return fmt.Errorf("failing namespaces %v", v)
				}
				return nil
			})
			clk.Add(rootpublisher.DefaultFailureGrace)
			if err := leader.ctrl.Ready(); !errors.Is(err, rootpublisher.ErrNotPublished) || !strings.Contains(err.Error(), locked) {
				t.Errorf("leader Ready with %s unwritable: %v", locked, err)
			}
			// The operator lifts the policy: the leader recovers.
			lift()
			eventually(t, time.Minute, "published after the policy is lifted", func(ctx context.Context) error {
				touchNamespace(t, locked)
				return configMapHolds(ctx, locked, next.Roots)
			})
			eventually(t, time.Minute, "ready again", func(context.Context) error { return leader.ctrl.Ready() })
		})
	}
}

// expectRepaired deletes the root ConfigMap of namespace ns, then edits it,
// and expects the publisher to repair it to roots (within wait) each time.
func expectRepaired(t *testing.T, ctx context.Context, ns string, roots []*x509.Certificate, wait time.Duration) {
	t.Helper()
	cms := cluster.Client().CoreV1().ConfigMaps(ns)
	if err := cms.Delete(ctx, rootConfigMap, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, wait, "repaired after deletion", func(ctx context.Context) error { return configMapHolds(ctx, ns, roots) })
	cm, err := cms.Get(ctx, rootConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[rootpublisher.DefaultKey] = "-----BEGIN CERTIFICATE-----\nattacker\n-----END CERTIFICATE-----\n"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, wait, "repaired after an edit", func(ctx context.Context) error { return configMapHolds(ctx, ns, roots) })
}

// lockedNamespace creates namespace ns where every ConfigMap write is
// refused (denyConfigMaps), then labels it for the publisher of run, and
// returns the function that lifts the lock.
func lockedNamespace(t *testing.T, ctx context.Context, ns, run string) (lift func()) {
	t.Helper()
	if err := cluster.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	lift = denyConfigMaps(t, ns)
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, publishLabel, run)
	if _, err := cluster.Client().CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	return lift
}

// denyConfigMaps makes the API server refuse every ConfigMap write in
// namespace ns with a ValidatingAdmissionPolicy, waits until it is in
// force, and returns the function that lifts it.
func denyConfigMaps(t *testing.T, ns string) (lift func()) {
	t.Helper()
	ctx := context.Background()
	name := "meshid-test-deny-" + ns
	adm := cluster.Client().AdmissionregistrationV1()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
				}}},
			},
			Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "configmaps are locked in this namespace"}},
		},
	}
	if _, err := adm.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	if _, err := adm.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lift = func() {
		t.Helper()
		_ = adm.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = adm.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	}
	t.Cleanup(lift)
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns}}
	eventually(t, time.Minute, "the policy in force", func(ctx context.Context) error {
		_, err := cluster.Client().CoreV1().ConfigMaps(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			return errors.New("a ConfigMap was admitted")
		}
		return nil
	})
	return lift
}
