package node_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/test/kube/node"
)

// TestCACutOffFromAPIServer: the pods are cut off from the API server
// (an iptables rule on the node drops what the pod network sends to its
// port: only the CA's pods talk to it here) while a pair hands shake every
// 50 ms. The CA replicas that verify tokens locally (the chart's default,
// auto) notice (their probe of the API server fails for the chart's
// apiserverReadinessGrace, 5 s here instead of the server's 30 s: the
// outage lasts seconds, not a minute) and stay Ready, since they still
// authenticate the callers their informers know. A replica that starts during the outage cannot authenticate
// anyone: its /readyz says so, and the Service's endpoints hold it
// not ready until the rule is removed; then it returns. No handshake
// fails.
func TestCACutOffFromAPIServer(t *testing.T) {
	need(t)
	installMeshid(t)
	p := newPair(t, "cutoff")
	ctx := context.Background()
	c := cluster.Client()
	before := p.waitMoreHandshakes(t, 0, 20)
	old := waitPodsReady(t, caNS, "app.kubernetes.io/name=meshid", 2)

	cut := cutOffPods(t)
	// Both replicas' probes of the API server fail past the grace.
	for _, pod := range old {
		waitLogMatch(t, caNS, pod.Name, "meshid", "the Kubernetes API server does not answer: not ready")
	}
	// They stay Ready and keep signing for the pods they know: the pair's
	// handshakes go on (checked below). A pod created during the outage is
	// not asserted here: its token is bound to a pod the CA's informer has
	// not seen, which only TokenReview can judge, and the API server is
	// out of reach (the CA answers Unavailable and the agent retries).

	// A replica that starts now: not ready, for the reason, and not
	// ready in the Service's endpoints.
	zero := int64(0)
	if err := c.CoreV1().Pods(caNS).Delete(ctx, old[0].Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	var fresh corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := c.CoreV1().Pods(caNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=meshid"})
		if err != nil {
			return false, nil
		}
		for _, pod := range list.Items {
			if pod.Name != old[0].Name && pod.Name != old[1].Name && pod.Status.PodIP != "" && started(pod) {
				fresh = pod
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no new CA replica started: %v", err)
	}
	var code int
	var body string
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		code, body = readyz(fresh.Status.PodIP)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "cannot authenticate the cluster's callers"), nil
	})
	if err != nil {
		t.Fatalf("the replica started during the outage: /readyz %d %q, want 503 saying it cannot authenticate callers", code, body)
	}
	waitEndpoint(t, fresh.Name, false)
	waitEndpoint(t, old[1].Name, true)

	cut()
	restored := time.Now()
	waitEndpoint(t, fresh.Name, true)
	if code, body := readyz(fresh.Status.PodIP); code != http.StatusOK {
		t.Errorf("/readyz of %s after the outage: %d %q", fresh.Name, code, body)
	}
	if pod, err := c.CoreV1().Pods(caNS).Get(ctx, fresh.Name, metav1.GetOptions{}); err != nil || readySince(pod).Before(restored.Truncate(time.Second)) {
		t.Errorf("the replica started during the outage was Ready before its end (%v)", err)
	}
	if pod, err := c.CoreV1().Pods(caNS).Get(ctx, old[1].Name, metav1.GetOptions{}); err != nil || !podReady(pod) || readySince(pod).After(cutAt) {
		t.Errorf("the replica that verifies locally was not Ready throughout the outage (%v)", err)
	}
	p.waitMoreHandshakes(t, before, 100)
}

// cutAt is when cutOffPods inserted its rule.
var cutAt time.Time

// cutOffPods inserts an iptables rule on the node that drops every packet
// from the pod network to the API server's port (after kube-proxy's DNAT
// of the kubernetes Service), and returns the function that removes it,
// which t.Cleanup also calls.
func cutOffPods(t *testing.T) (restore func()) {
	t.Helper()
	u, err := url.Parse(cluster.Host())
	if err != nil {
		t.Fatal(err)
	}
	rule := []string{"INPUT", "-s", node.DefaultPodCIDR, "-p", "tcp", "--dport", u.Port(), "-m", "comment", "--comment", "meshid-test: pods cut off from the API server", "-j", "DROP"}
	if out, err := exec.Command("iptables", append([]string{"-I"}, rule...)...).CombinedOutput(); err != nil {
		t.Fatalf("iptables -I %v: %v: %s", rule, err, out)
	}
	cutAt = time.Now()
	removed := false
	restore = func() {
		if removed {
			return
		}
		removed = true
		if out, err := exec.Command("iptables", append([]string{"-D"}, rule...)...).CombinedOutput(); err != nil {
			t.Errorf("iptables -D %v: %v: %s", rule, err, out)
		}
	}
	t.Cleanup(restore)
	return restore
}

// readyz is the CA pod's /readyz (its monitoring port, from the node).
func readyz(ip string) (int, string) {
	client := &http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://%s:15014/readyz", ip))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// waitEndpoint waits until the CA Service's endpoint slices hold pod with
// the ready condition ready.
func waitEndpoint(t *testing.T, pod string, ready bool) {
	t.Helper()
	var seen string
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		slices, err := cluster.Client().DiscoveryV1().EndpointSlices(caNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + release})
		if err != nil {
			return false, nil
		}
		seen = ""
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.TargetRef == nil {
					continue
				}
				r := e.Conditions.Ready != nil && *e.Conditions.Ready
				seen += fmt.Sprintf("%s ready=%v; ", e.TargetRef.Name, r)
				if e.TargetRef.Name == pod && r == ready {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the CA Service's endpoints never held %s ready=%v: %s", pod, ready, seen)
	}
}

func started(p corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Started != nil && *cs.Started {
			return true
		}
	}
	return false
}

func podReady(p *corev1.Pod) bool { return !readySince(p).IsZero() }

// readySince is when p last became Ready, zero when it is not.
func readySince(p *corev1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}
