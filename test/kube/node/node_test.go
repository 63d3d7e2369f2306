package node_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/test/kube/node"
)

// TestBoot: the node runs (it fails, with the reason, where it cannot).
func TestBoot(t *testing.T) {
	need(t)
}

// TestNodeReady: the kubelet registered node "localhost", Ready, at the
// pinned version, with the host's address; the controller manager created
// the default service account and published kube-root-ca.crt.
func TestNodeReady(t *testing.T) {
	need(t)
	ctx := context.Background()
	c := cluster.Client()
	n, err := c.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := n.Status.NodeInfo.KubeletVersion; v != "v1.37.2" {
		t.Errorf("kubelet version %q, want v1.37.2", v)
	}
	var internal string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			internal = a.Address
		}
	}
	if internal != nd.HostIP() {
		t.Errorf("InternalIP %q, want %q", internal, nd.HostIP())
	}
	if !strings.HasPrefix(n.Status.NodeInfo.ContainerRuntimeVersion, "containerd://") {
		t.Errorf("runtime %q, want containerd", n.Status.NodeInfo.ContainerRuntimeVersion)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err1 := c.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		_, err2 := c.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err1 == nil && err2 == nil, nil
	})
	if err != nil {
		t.Fatalf("no default service account or kube-root-ca.crt from the controller manager: %v", err)
	}
}

// TestPodsNetworkAndServices: a Deployment's pod (controller manager,
// scheduler, kubelet, containerd, CNI) gets an address on the bridge and
// serves; another pod reaches it through its Service's ClusterIP and
// reaches the API server through the "kubernetes" Service with its
// service-account token (kube-proxy); its log comes back through the API
// server from the kubelet.
func TestPodsNetworkAndServices(t *testing.T) {
	need(t)
	ctx := context.Background()
	c := cluster.Client()
	ns := "node-net"
	if err := cluster.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "hello"}
	one := int32(1)
	never := corev1.PullNever
	_, err := c.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "hello"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "hello", Image: probeRef, ImagePullPolicy: never,
					Args:  []string{"serve", ":8080"},
					Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
						HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
				}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "hello"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods := waitPodsReady(t, ns, "app=hello", 1)
	_, cidr, _ := net.ParseCIDR(node.DefaultPodCIDR)
	if ip := net.ParseIP(pods[0].Status.PodIP); !cidr.Contains(ip) {
		t.Errorf("pod IP %q is not in the bridge's %s", pods[0].Status.PodIP, node.DefaultPodCIDR)
	}
	helloURL := fmt.Sprintf("http://%s/", svc.Spec.ClusterIP)
	apiURL := "https://kubernetes.default.svc.cluster.local/version"
	_, err = c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "client"},
		Spec: corev1.PodSpec{
			// No DNS on this node: the API server's Service name by
			// /etc/hosts, as the chart's workloads reach the CA.
			HostAliases: []corev1.HostAlias{{IP: "10.96.0.1", Hostnames: []string{"kubernetes.default.svc.cluster.local"}}},
			Containers: []corev1.Container{{
				Name: "client", Image: probeRef, ImagePullPolicy: never,
				Args: []string{"get", helloURL, apiURL},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	log := waitLog(t, ns, "client", "client", 2)
	if !strings.Contains(log, "ok "+helloURL+" 200 hello from "+pods[0].Name) {
		t.Errorf("the client did not reach the Deployment's pod through its Service:\n%s", log)
	}
	if !strings.Contains(log, "ok "+apiURL+" 200") || !strings.Contains(log, `"gitVersion": "v1.37.2"`) {
		t.Errorf("the client did not reach the API server through the kubernetes Service:\n%s", log)
	}
}

// waitPodsReady waits until want pods match selector in ns and are Ready.
func waitPodsReady(t testing.TB, ns, selector string, want int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, nil
		}
		pods = list.Items
		ready := 0
		for _, p := range pods {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == want && len(pods) == want, nil
	})
	if err != nil {
		t.Fatalf("pods %q in %s not Ready: %v\n%s\n%s", selector, ns, err, describe(pods), nd.Logs())
	}
	return pods
}

// waitLog waits until the container's log (read through the API server
// from the kubelet) holds lines lines, and returns it.
func waitLog(t *testing.T, ns, pod, container string, lines int) string {
	t.Helper()
	var log string
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		b, err := cluster.Client().CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
		if err != nil {
			log = err.Error()
			return false, nil
		}
		log = string(b)
		return strings.Count(log, "\n") >= lines, nil
	})
	if err != nil {
		p, _ := cluster.Client().CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
		var pods []corev1.Pod
		if p != nil {
			pods = append(pods, *p)
		}
		t.Fatalf("log of %s/%s: %v\n%s\n%s\n%s", ns, pod, err, log, describe(pods), nd.Logs())
	}
	return log
}

// describe sums up pods' phases and container states, for failures.
func describe(pods []corev1.Pod) string {
	var b strings.Builder
	for _, p := range pods {
		fmt.Fprintf(&b, "pod %s: %s %s\n", p.Name, p.Status.Phase, p.Status.Message)
		for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			fmt.Fprintf(&b, "  %s: ready=%v restarts=%d state=%+v\n", cs.Name, cs.Ready, cs.RestartCount, cs.State)
		}
	}
	return b.String()
}
