package node_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
)

// pair is two workload pods with the agent sidecar in namespace ns, the
// client completing an mTLS handshake with the server every 50 ms.
type pair struct {
	ns, serverID string
}

// newPair starts a pair in a new namespace ns and waits for its first
// handshake.
func newPair(t *testing.T, ns string) pair {
	t.Helper()
	ctx := context.Background()
	c := cluster.Client()
	if err := cluster.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"server", "client"} {
		if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	p := pair{ns: ns, serverID: fmt.Sprintf("spiffe://cluster.local/ns/%s/sa/server", ns)}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, sidecarPod(t, ns, "server", "server", map[string]string{"app": "server"}, "serve", ":8443"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "server"},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "server"}, Ports: []corev1.ServicePort{{Port: 8443, TargetPort: intstr.FromInt32(8443)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The client dials once kube-proxy routes the Service to the server:
	// a dial before that is never translated (see WaitServiceRouted).
	waitPodsReady(t, ns, "app=server", 1)
	if err := nd.WaitServiceRouted(ctx, svc.Spec.ClusterIP, 8443); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("%s:8443", svc.Spec.ClusterIP)
	if _, err := c.CoreV1().Pods(ns).Create(ctx, sidecarPod(t, ns, "client", "client", nil, "dial", addr, p.serverID), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLogMatch(t, ns, "client", "workload", "handshake ok")
	return p
}

var countsRE = regexp.MustCompile(`handshakes ok=(\d+) failed=(\d+)`)

// counts is the client's last reported handshake counts, and every
// failure line it printed, from its log (read through the API server from
// the kubelet: an error while the kubelet restarts).
func (p pair) counts() (ok, failed int, failures []string, err error) {
	b, err := cluster.Client().CoreV1().Pods(p.ns).GetLogs("client", &corev1.PodLogOptions{Container: "workload"}).DoRaw(context.Background())
	if err != nil {
		return 0, 0, nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if m := countsRE.FindStringSubmatch(line); m != nil {
			ok, _ = strconv.Atoi(m[1])
			failed, _ = strconv.Atoi(m[2])
		}
		if strings.HasPrefix(line, "handshake failed") {
			failures = append(failures, line)
		}
	}
	return ok, failed, failures, nil
}

// waitMoreHandshakes waits until the client has reported at least n more
// successful handshakes than from, and fails on any failed one.
func (p pair) waitMoreHandshakes(t *testing.T, from, n int) int {
	t.Helper()
	var ok, failed int
	var failures []string
	var lastErr error
	err := wait.PollUntilContextTimeout(context.Background(), time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		o, f, fs, err := p.counts()
		if err != nil {
			lastErr = err
			return false, nil
		}
		ok, failed, failures = o, f, fs
		return ok >= from+n || failed > 0, nil
	})
	if failed > 0 || len(failures) > 0 {
		t.Fatalf("%d failed handshakes: %v\n%s\nkube-proxy:\n%s", failed, failures, netDiag(), nd.ProxyLog())
	}
	if err != nil {
		t.Fatalf("the client's handshakes stalled at %d (wanted %d more than %d; last log error: %v)", ok, n, from, lastErr)
	}
	return ok
}

// TestRollCAUnderTraffic: `kubectl rollout restart` of the CA Deployment
// (the same patch of the pod template) while two workloads complete mTLS
// every 50 ms: no handshake fails, and a workload started during the roll
// gets its identity.
func TestRollCAUnderTraffic(t *testing.T) {
	need(t)
	installMeshid(t)
	p := newPair(t, "roll")
	ctx := context.Background()
	c := cluster.Client()
	before := p.waitMoreHandshakes(t, 0, 20)
	dep, err := c.AppsV1().Deployments(caNS).Get(ctx, release, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339))
	if _, err := c.AppsV1().Deployments(caNS).Patch(ctx, release, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// A new workload while the replicas are replaced.
	if _, err := c.CoreV1().ServiceAccounts("roll").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "late"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Pods("roll").Create(ctx, sidecarPod(t, "roll", "late", "late", nil, "serve", ":8443"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := c.AppsV1().Deployments(caNS).Get(ctx, release, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		s := d.Status
		return d.Generation > dep.Generation && s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == 2 && s.ReadyReplicas == 2 && s.Replicas == 2, nil
	})
	if err != nil {
		t.Fatalf("the CA roll did not complete: %v", err)
	}
	waitLogMatch(t, "roll", "late", "workload", "workloadapi spiffe://cluster.local/ns/roll/sa/late")
	p.waitMoreHandshakes(t, before, 100)
}

// TestKillAgentUnderTraffic: the client's agent sidecar is killed (SIGKILL
// to its process, as an OOM kill does); the kubelet restarts it, the
// workload keeps its certificate meanwhile and keeps completing mTLS, and
// the new agent serves it.
func TestKillAgentUnderTraffic(t *testing.T) {
	need(t)
	installMeshid(t)
	p := newPair(t, "kill")
	ctx := context.Background()
	c := cluster.Client()
	before := p.waitMoreHandshakes(t, 0, 20)
	pod, err := c.CoreV1().Pods("kill").Get(ctx, "client", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pid := agentPID(t, string(pod.UID))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pod, err := c.CoreV1().Pods("kill").Get(ctx, "client", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cs := range pod.Status.InitContainerStatuses {
			if cs.Name == "meshid-agent" {
				return cs.RestartCount >= 1 && cs.Started != nil && *cs.Started, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the kubelet did not restart the agent: %v", err)
	}
	if newPID := agentPID(t, string(pod.UID)); newPID == pid {
		t.Fatalf("the agent still runs as pid %d", pid)
	}
	p.waitMoreHandshakes(t, before, 100)
}

// agentPID finds the meshid-agent process of the pod with uid on this
// machine: the process whose cgroup names the pod and whose command is
// /meshid-agent.
func agentPID(t *testing.T, uid string) int {
	t.Helper()
	var found []int
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		found = nil
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if !strings.HasPrefix(string(cmd), "/meshid-agent\x00") {
				continue
			}
			cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
			if strings.Contains(string(cg), "pod"+uid) {
				found = append(found, pid)
			}
		}
		return len(found) == 1, nil
	})
	if err != nil {
		t.Fatalf("no single meshid-agent process for pod %s: %v", uid, found)
	}
	return found[0]
}
