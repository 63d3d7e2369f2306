package caserver_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/testkit"
)

// With the CA in a Kubernetes Secret, a new CA plugged in as cacerts is
// prepared, not signing, and the istio-ca-root-cert ConfigMaps carry the
// union of the old and new roots (the Secret holds only the new one).
func TestKubeSecretRotationPublishesUnion(t *testing.T) {
	client := fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}})
	s := testkit.CA(t, caserver.Config{KubeClient: client, KubeCASecret: true, PodName: "ca-0"})
	deadline := time.Now().Add(testkit.Guard)
	for s.Rotation() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the CA did not load its Secret")
		}
		time.Sleep(10 * time.Millisecond)
	}
	oldRoot := s.Authority().Bundle().Roots[0]
	cm := func() string {
		c, err := client.CoreV1().ConfigMaps("app").Get(context.Background(), "istio-ca-root-cert", metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return c.Data["root-cert.pem"]
	}
	eventually(t, "old root published", func() bool { return cm() == string(certs.EncodeCertificates(oldRoot)) })

	plugged, files, err := keystore.NewSelfSignedRoot(keystore.SelfSignedConfig{TrustDomain: "operator"})
	if err != nil {
		t.Fatal(err)
	}
	plugCA, plugRoot := plugged.Cert, plugged.Roots[0]
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "cacerts", Namespace: "istio-system"}, Data: files}
	if _, err := client.CoreV1().Secrets("istio-system").Create(context.Background(), sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	union := string(certs.EncodeCertificates(oldRoot, plugRoot))
	eventually(t, "union published", func() bool { return cm() == union })
	if st := s.Rotation().Status(); st.Phase != rotation.Prepared || s.Authority().Bundle().Cert.Equal(plugCA) {
		t.Fatalf("after cacerts appeared: %v", st.Phase)
	}
	if err := s.Rotation().Activate(); err != nil {
		t.Fatal(err)
	}
	if !s.Authority().Bundle().Cert.Equal(plugCA) || cm() != union {
		t.Fatal("after activation: not signing with cacerts, or the ConfigMap lost the old root")
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testkit.Guard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", testkit.Guard, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
