package cluster_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/cluster"
	"github.com/meshid/meshid/ca/kubeclient/fake"
	"github.com/meshid/meshid/testkit"
)

// kubeconfigOf writes what istioctl create-remote-secret would for a.
func kubeconfigOf(t *testing.T, a *apiServer) []byte {
	t.Helper()
	rc := a.config()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: secretToken}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "c"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func remoteSecret(name string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "istio-system", Labels: map[string]string{cluster.LabelMultiCluster: "true"}},
		Data:       data,
	}
}

// TestWatcher follows remote secrets through an informer (on client-go's
// fake clientset; test/kube runs a real API server): add, change, bad
// kubeconfig, conflicting and ignored keys, delete.
func TestWatcher(t *testing.T) {
	ctx := context.Background()
	logs := testkit.NewLogRecorder()
	b := newAPIServer(t, "b-token", "shop", "cart")
	r, reg := newRouter(t, cluster.Config{LocalID: "a", Local: &localAuth{}, Logger: logs.Logger()})
	client := fake.NewClientset()
	w, err := cluster.NewWatcher(cluster.WatcherConfig{Client: client, Namespace: "istio-system", Router: r, Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "watcher", w.Run)
	secrets := client.CoreV1().Secrets("istio-system")

	if _, err := secrets.Create(ctx, remoteSecret("istio-remote-secret-b", map[string][]byte{"b": kubeconfigOf(t, b)}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	logs.WaitForContaining(t, "remote cluster configured", 1)
	c, err := r.Authenticate(ctx, authn.Credentials{Token: "b-token", ClusterID: "b"})
	if err != nil || c.Cluster != "b" {
		t.Fatalf("after the secret: %v %+v", err, c)
	}

	// Another secret cannot take b over; its bad key, the local ID and a
	// broken kubeconfig are logged by secret and key, never by content.
	other := remoteSecret("other", map[string][]byte{
		"b":          kubeconfigOf(t, b),
		"a":          kubeconfigOf(t, b),
		"bad/key":    kubeconfigOf(t, b),
		"broken":     []byte("users: [{name: u, user: {token: " + secretToken + "}}]\n\t: ["),
		"exec-users": kubeconfig("https://x.example", "", "    exec: {command: /bin/sh}\n    token: "+secretToken),
	})
	if _, err := secrets.Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	logs.WaitForContaining(t, "key=exec-users", 1)
	for _, want := range []string{"already configured by secret istio-system/istio-remote-secret-b", "the local cluster's ID", "not a cluster ID", "secret=istio-system/other key=broken", "exec"} {
		if !strings.Contains(logs.All(), want) {
			t.Errorf("logs lack %q:\n%s", want, logs.All())
		}
	}
	if strings.Contains(logs.All(), secretToken) {
		t.Fatal("a kubeconfig's token reached the log")
	}
	for _, id := range []string{"broken", "exec-users"} {
		if got := testkit.Metric(t, reg, "meshid_ca_remote_cluster_state", "cluster", id, "state", cluster.StateInvalid); got != 1 {
			t.Fatalf("%s invalid = %v", id, got)
		}
	}
	if got := r.Clusters(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("clusters %v", got)
	}

	// Deleting the secret removes b: its requests are then refused.
	if err := secrets.Delete(ctx, "istio-remote-secret-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	logs.WaitForContaining(t, "remote cluster removed", 1)
	if _, err := r.Authenticate(ctx, authn.Credentials{Token: "b-token", ClusterID: "b"}); err == nil || !strings.Contains(err.Error(), "unknown cluster") {
		t.Fatalf("after delete: %v", err)
	}
	// Removing a key from a secret removes its cluster and its series.
	other.Data = map[string][]byte{"exec-users": other.Data["exec-users"]}
	if _, err := secrets.Update(ctx, other, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	logs.WaitForContaining(t, "cluster=broken", 1)
	if strings.Count(logs.All(), "remote cluster removed") != 2 {
		t.Fatalf("broken not removed:\n%s", logs.All())
	}
}
