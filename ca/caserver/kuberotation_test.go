package caserver_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/testkit"
)

// kubeCA runs a replica of the CA kept in a Secret of client, and returns
// it once it serves (its rotation exists).
func kubeCA(t *testing.T, client *fake.Clientset, pod string) *caserver.Server {
	t.Helper()
	logs := testkit.NewLogRecorder()
	s := testkit.CA(t, caserver.Config{Kube: caserver.KubeConfig{Client: client, PodName: pod}, KubeCASecret: true, Logger: logs.Logger()})
	logs.WaitFor(t, "meshid CA serving", 1)
	return s
}

// cluster watches the fake cluster's Secrets and ConfigMaps, to wait on
// their changes (informer-style events) rather than poll them.
type cluster struct {
	client *fake.Clientset
	events chan struct{}
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	client := fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}})
	c := &cluster{client: client, events: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, watch := range []func() (<-chan struct{}, error){
		func() (<-chan struct{}, error) { return results(ctx, client.CoreV1().Secrets("istio-system").Watch) },
		func() (<-chan struct{}, error) { return results(ctx, client.CoreV1().ConfigMaps("app").Watch) },
	} {
		ch, err := watch()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for range ch {
				select {
				case c.events <- struct{}{}:
				default:
				}
			}
		}()
	}
	return c
}

func results[W interface{ ResultChan() <-chan E }, E any](ctx context.Context, watch func(context.Context, metav1.ListOptions) (W, error)) (<-chan struct{}, error) {
	w, err := watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make(chan struct{})
	go func() {
		defer close(out)
		for range w.ResultChan() {
			out <- struct{}{}
		}
	}()
	return out, nil
}

// until waits, on the cluster's events and the rotations' changes, until
// cond holds.
func (c *cluster) until(t *testing.T, what string, cond func() bool, rots ...*rotation.Manager) {
	t.Helper()
	guard := time.NewTimer(testkit.Guard)
	defer guard.Stop()
	for {
		changed := make([]<-chan struct{}, len(rots))
		for i, r := range rots {
			changed[i] = r.Changed()
		}
		if cond() {
			return
		}
		anyChange := make(chan struct{})
		stop := make(chan struct{})
		for _, ch := range changed {
			go func() {
				select {
				case <-ch:
					select {
					case anyChange <- struct{}{}:
					case <-stop:
					}
				case <-stop:
				}
			}()
		}
		select {
		case <-c.events:
		case <-anyChange:
		case <-guard.C:
			close(stop)
			t.Fatalf("not within %v: %s", testkit.Guard, what)
		}
		close(stop)
	}
}

func (c *cluster) rootConfigMap() string {
	cm, err := c.client.CoreV1().ConfigMaps("app").Get(context.Background(), "istio-ca-root-cert", metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return cm.Data["root-cert.pem"]
}

// state returns the shared rotation record, if any.
func (c *cluster) state() (rotation.Record, bool) {
	var rec rotation.Record
	sec, err := c.client.CoreV1().Secrets("istio-system").Get(context.Background(), caserver.RotationStateSecret, metav1.GetOptions{})
	if err != nil {
		return rec, false
	}
	return rec, json.Unmarshal(sec.Data["rotation.json"], &rec) == nil
}

func (c *cluster) plugCACerts(t *testing.T) *keystore.Bundle {
	t.Helper()
	plugged, files, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: "operator"})
	if err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "cacerts", Namespace: "istio-system"}, Data: files}
	if _, err := c.client.CoreV1().Secrets("istio-system").Create(context.Background(), sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return plugged
}

// With the CA in a Kubernetes Secret, a new CA plugged in as cacerts is
// prepared, not signing, and the istio-ca-root-cert ConfigMaps carry the
// union of the old and new roots (the Secret holds only the new one).
func TestKubeSecretRotationPublishesUnion(t *testing.T) {
	c := newCluster(t)
	s := kubeCA(t, c.client, "ca-0")
	oldRoot := s.Authority().Bundle().Roots[0]
	c.until(t, "old root published", func() bool { return c.rootConfigMap() == string(certs.EncodeCertificates(oldRoot)) })

	plugged := c.plugCACerts(t)
	union := string(certs.EncodeCertificates(oldRoot, plugged.Roots[0]))
	c.until(t, "union published", func() bool { return c.rootConfigMap() == union })
	if st := s.Rotation().Status(); st.Phase != rotation.Prepared || s.Authority().Bundle().Cert.Equal(plugged.Cert) {
		t.Fatalf("after cacerts appeared: %v", st.Phase)
	}
	if err := s.Rotation().Activate(); err != nil {
		t.Fatal(err)
	}
	if !s.Authority().Bundle().Cert.Equal(plugged.Cert) {
		t.Fatal("after activation: not signing with cacerts")
	}
	// The publisher rewrites the ConfigMap with the active root first:
	// the same two roots, in another order.
	if got := c.rootConfigMap(); !sameRoots(got, oldRoot, plugged.Roots[0]) {
		t.Fatalf("after activation the ConfigMap holds %q, want the old and the new root", got)
	}
}

// sameRoots reports whether the PEM bundle holds exactly want, in any
// order.
func sameRoots(bundle string, want ...*x509.Certificate) bool {
	got, err := certs.ParseCertificates([]byte(bundle))
	if err != nil || len(got) != len(want) {
		return false
	}
	for _, w := range want {
		if !slices.ContainsFunc(got, w.Equal) {
			return false
		}
	}
	return true
}

// Two replicas keep one propagation clock: the leader writes the rotation
// state Secret and the follower takes the leader's activation time. A
// replica that starts (or restarts) while the cacerts Secret is prepared
// restores the state: the old root stays in its bundle although only
// cacerts is left to sign with.
func TestKubeSecretReplicasShareOneClock(t *testing.T) {
	c := newCluster(t)
	a, b := kubeCA(t, c.client, "ca-0"), kubeCA(t, c.client, "ca-1")
	oldRoot := a.Authority().Bundle().Roots[0]
	c.until(t, "the leader writes the stable state", func() bool { rec, ok := c.state(); return ok && rec.Phase == "stable" })

	plugged := c.plugCACerts(t)
	var rec rotation.Record
	c.until(t, "the leader writes the prepared state", func() bool {
		var ok bool
		rec, ok = c.state()
		return ok && rec.Phase == "prepared"
	})
	c.until(t, "both replicas activate at the leader's time", func() bool {
		return a.Rotation().Status().ActivateAt.Equal(rec.ActivateAt) && b.Rotation().Status().ActivateAt.Equal(rec.ActivateAt)
	}, a.Rotation(), b.Rotation())

	fresh := kubeCA(t, c.client, "ca-2")
	st := fresh.Rotation().Status()
	roots := fresh.Authority().Bundle().Roots
	if !st.Signing.Equal(plugged.Cert) || !slices.ContainsFunc(roots, oldRoot.Equal) || len(roots) != 2 {
		t.Fatalf("a replica started mid-rotation signs with %q and trusts %d roots; want cacerts, and the old root kept", st.Signing.Subject, len(roots))
	}
	if min := time.Now().Add(caserver.DefaultMaxTTL + ca.DefaultClockSkew - time.Minute); st.NextStep != "retire" || st.NextStepAt.Before(min) {
		t.Fatalf("the old root retires (%q) at %v, want a whole RetireAfter from the start", st.NextStep, st.NextStepAt)
	}
}
