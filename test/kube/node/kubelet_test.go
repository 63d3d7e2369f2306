package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/test/kube/node"
)

// TestKubeletRestartUnderTraffic: a pair in continuous mTLS while 20
// more workload pods with the agent sidecar start at once, then the
// kubelet stops and starts again (a node reboot in small, the containers
// left running): the node is Ready again, every pod is Ready again
// without a container restarted, and no handshake fails. (It runs before
// the pod certificate test, whose pod a kubelet restart would give a new
// certificate: kubelet_test.go sorts first.)
func TestKubeletRestartUnderTraffic(t *testing.T) {
	need(t)
	installMeshid(t)
	ctx := context.Background()
	c := cluster.Client()
	const many = 20
	p := newPair(t, "reboot")
	before := p.waitMoreHandshakes(t, 0, 20)
	if _, err := c.CoreV1().ServiceAccounts("reboot").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "many"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range many {
		pod := sidecarPod(t, "reboot", fmt.Sprintf("w%02d", i), "many", map[string]string{"app": "many"}, "serve", ":8443")
		if _, err := c.CoreV1().Pods("reboot").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { deletePods(t, "reboot") })
	waitPodsReady(t, "reboot", "app=many", many)
	before = p.waitMoreHandshakes(t, before, 20)
	restarts := containerRestarts(t, "reboot")
	if err := nd.StopKubelet(); err != nil {
		t.Fatal(err)
	}
	if err := nd.StartKubelet(); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		return err == nil && node.Ready(n), nil
	})
	if err != nil {
		t.Fatalf("the node is not Ready again: %v\n%s", err, nd.KubeletLog())
	}
	waitPodsReady(t, "reboot", "app=many", many)
	p.waitMoreHandshakes(t, before, 200)
	if after := containerRestarts(t, "reboot"); after != restarts {
		t.Errorf("containers restarted across the kubelet's restart: %d restarts before, %d after", restarts, after)
	}
}

// containerRestarts sums the restart counts of every container in ns.
func containerRestarts(t *testing.T, ns string) int32 {
	t.Helper()
	pods, err := cluster.Client().CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, p := range pods.Items {
		for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			n += cs.RestartCount
		}
	}
	return n
}

// deletePods deletes every pod of ns at once, so that the next tests do
// not share the node's two cores with them.
func deletePods(t *testing.T, ns string) {
	zero := int64(0)
	if err := cluster.Client().CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		t.Errorf("deleting the pods of %s: %v", ns, err)
	}
}
