package multicluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/cluster"
	"github.com/meshid/meshid/testkit"
)

func remoteSecret(name string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: caNamespace, Labels: map[string]string{cluster.LabelMultiCluster: "true"}},
		Data:       data,
	}
}

// until polls cond every 50ms until it holds or 15s pass, and returns how
// long it took.
func until(t *testing.T, what string, cond func(context.Context) error) time.Duration {
	t.Helper()
	start := time.Now()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		last = cond(ctx)
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("%s: %v (last: %v)", what, err, last)
	}
	return time.Since(start)
}

// TestRemoteSecret: an Istio remote secret created in the CA's namespace
// while the CA runs makes cluster B's proxies work within seconds; deleting
// it refuses them again. Bad secrets (huge, malformed, exec, bad
// credentials) are logged by name and key and shown in the gauge, and
// never stop the CA.
func TestRemoteSecret(t *testing.T) {
	ctx := context.Background()
	logs := testkit.NewLogRecorder()
	c := startCA(t, func(cfg *caserver.Config) { cfg.Clusters.RemoteSecrets = true; cfg.Logger = logs.Logger() })
	wa := newWorkload(t, clusterA, "secret-a", "frontend")
	wb := newWorkload(t, clusterB, "secret-b", "backend")
	secrets := clusterA.Client().CoreV1().Secrets(caNamespace)
	reader := readerKubeconfig(t, clusterB)

	wantCode(t, "before the secret", c.sign(ctx, wb.token(t), idB, wb.id()), codes.Unauthenticated, idB)

	if _, err := secrets.Create(ctx, remoteSecret("istio-remote-secret-b", map[string][]byte{idB: reader}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	took := until(t, "B after the secret was created", func(ctx context.Context) error { return c.sign(ctx, wb.token(t), idB, wb.id()) })
	t.Logf("remote secret created: B's proxies signed after %s", took.Round(time.Millisecond))
	until(t, "B probed ready", func(context.Context) error {
		if c.state(t, idB, cluster.StateReady) != 1 {
			return errNotYet
		}
		return nil
	})

	t.Run("bad secrets never stop the CA", func(t *testing.T) { badSecrets(t, c, logs, wa, wb) })

	if err := secrets.Delete(ctx, "istio-remote-secret-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	took = until(t, "B refused after the secret was deleted", func(ctx context.Context) error {
		err := c.sign(ctx, wb.token(t), idB, wb.id())
		if status.Code(err) == codes.Unauthenticated && strings.Contains(err.Error(), "unknown cluster") {
			return nil
		}
		return errNotYet
	})
	t.Logf("remote secret deleted: B's proxies refused after %s", took.Round(time.Millisecond))
	if err := c.sign(ctx, wa.token(t), "", wa.id()); err != nil {
		t.Fatalf("A after B left: %v", err)
	}
}

type notYet struct{}

func (notYet) Error() string { return "not yet" }

var errNotYet error = notYet{}

// badSecrets adds secrets an attacker (or a mistake) could write: a
// kubeconfig near the 1 MiB Secret limit, garbage, an exec plugin, a
// token B does not know. Each is logged by secret and key, its cluster
// shown in the gauge; the CA keeps signing A and the B it already has.
func badSecrets(t *testing.T, c *ca, logs *testkit.LogRecorder, wa, wb workload) {
	ctx := context.Background()
	const marker = "attacker-marker-token-0123456789"
	huge := []byte("apiVersion: v1\nkind: Config\nusers: [{name: u, user: {token: " + marker + strings.Repeat("x", 900<<10) + "}}]\n")
	exec := []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "` + clusterB.Host() + `"}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, "echo ` + marker + `"], interactiveMode: Never}}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`)
	// The local cluster's ID in a secret is ignored (as Istio does).
	wrongToken := []byte(strings.Replace(string(readerKubeconfig(t, clusterB)), "token: ", "token: "+marker, 1))
	secrets := clusterA.Client().CoreV1().Secrets(caNamespace)
	for name, data := range map[string]map[string][]byte{
		"huge":    {"huge": huge},
		"garbage": {"garbage": []byte(marker + "\x00\xff{{{: :"), idA: readerKubeconfig(t, clusterB)},
		"exec":    {"exec": exec},
		"creds":   {"creds": wrongToken},
	} {
		if _, err := secrets.Create(ctx, remoteSecret(name, data), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = secrets.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	for _, key := range []string{"huge", "garbage", "exec"} {
		logs.WaitForContaining(t, "key="+key, 1)
		until(t, key+" invalid in the gauge", func(context.Context) error {
			if c.state(t, key, cluster.StateInvalid) != 1 {
				return errNotYet
			}
			return nil
		})
	}
	until(t, "bad credentials shown as unauthorized", func(context.Context) error {
		if c.state(t, "creds", cluster.StateUnauthorized) != 1 {
			return errNotYet
		}
		return nil
	})
	if all := logs.All(); strings.Contains(all, marker) {
		t.Fatal("a secret's content reached the log")
	}
	for _, want := range []string{"secret=istio-system/huge key=huge", "64 KiB limit", "secret=istio-system/garbage key=garbage", "exec (runs a program", "local cluster's ID; ignored secret=istio-system/garbage key=" + idA} {
		if !strings.Contains(logs.All(), want) {
			t.Errorf("logs lack %q", want)
		}
	}
	if err := c.sign(ctx, wa.token(t), "", wa.id()); err != nil {
		t.Fatalf("A with bad secrets around: %v", err)
	}
	if err := c.sign(ctx, wb.token(t), idB, wb.id()); err != nil {
		t.Fatalf("B with bad secrets around: %v", err)
	}
	if err := c.srv.Ready(); err != nil {
		t.Fatalf("not ready: %v", err)
	}
}
