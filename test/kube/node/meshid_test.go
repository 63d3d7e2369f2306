package node_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/meshid/meshid/test/kube/harness"
)

// The chart's release, as its README installs it.
const (
	release   = "meshid"
	caNS      = "istio-system"
	caService = "meshid.istio-system.svc" // the agent's --ca-addr host
	// workloadRef is the image of ./node/workload.
	workloadRef = "meshid.test/workload:1"
)

// helm runs the pinned helm CLI as the cluster's admin, with its homes in
// a temporary directory.
func helm(t testing.TB, args ...string) string {
	t.Helper()
	bin, err := harness.EnsureHelm()
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{
		"HOME=" + home, "PATH=/usr/bin:/bin",
		"HELM_CACHE_HOME=" + filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(home, "config"),
		"HELM_DATA_HOME=" + filepath.Join(home, "data"),
		"KUBECONFIG=" + cluster.AdminKubeconfig(),
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// installMeshid installs the chart as its README does (the CA's key in the
// Secret meshid-ca, made by the elected replica: caMode kubeCASecret) with
// meshid's own images, imported into the node, and waits until both CA
// replicas are Ready. Once per package run.
func installMeshid(t testing.TB) {
	t.Helper()
	if meshidInstalled {
		return
	}
	repo, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	installNotes = helm(t, "install", release, filepath.Join(repo, "deploy", "charts", "meshid"),
		"--namespace", caNS, "--create-namespace", "--set", "caMode=kubeCASecret",
		"--set", "podCertificates.signerName="+podCertSigner, "--set", "podCertificates.refreshRatio="+podCertRefreshRatio,
		"--set", "server.apiserverReadinessGrace="+readinessGrace)
	pods := waitPodsReady(t, caNS, "app.kubernetes.io/name=meshid", 2)
	for _, p := range pods {
		if p.Spec.Containers[0].Image != "meshid:latest" {
			t.Errorf("CA pod %s runs %q, want the chart's meshid:latest", p.Name, p.Spec.Containers[0].Image)
		}
	}
	meshidInstalled = true
}

var (
	meshidInstalled bool
	// installNotes is what `helm install` printed: the chart's NOTES.
	installNotes string
)

// readinessGrace is the chart's server.apiserverReadinessGrace here (the
// server's default is 30 s): how long the API server may not answer
// before a CA that does not verify tokens locally leaves its Service;
// short, so that TestCACutOffFromAPIServer's minute of outage is one of
// seconds.
const readinessGrace = "5s"

// TestMeshidChartOnNode: `helm install` of the chart runs two Ready CA
// replicas on the node, which publish the root ConfigMap into every
// namespace but the system ones (the server's default, as istiod's), one
// created after the install too.
func TestMeshidChartOnNode(t *testing.T) {
	need(t)
	installMeshid(t)
	ctx := context.Background()
	c := cluster.Client()
	dep, err := c.AppsV1().Deployments(caNS).Get(ctx, release, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if dep.Status.ReadyReplicas != 2 {
		t.Errorf("CA Deployment: %d Ready replicas, want 2", dep.Status.ReadyReplicas)
	}
	if err := cluster.EnsureNamespace(ctx, "late"); err != nil {
		t.Fatal(err)
	}
	var missing []string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		nss, err := c.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		missing = nil
		for _, ns := range nss.Items {
			switch ns.Name {
			case "kube-system", "kube-public", "kube-node-lease":
				continue
			}
			if _, err := c.CoreV1().ConfigMaps(ns.Name).Get(ctx, "istio-ca-root-cert", metav1.GetOptions{}); err != nil {
				missing = append(missing, ns.Name)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		t.Fatalf("no istio-ca-root-cert in %v", missing)
	}
}

// TestChartHealthyOnNode: the installed CA runs clean: no log line of a
// CA replica says "forbidden" (the chart grants what the server's
// defaults need, local token verification and the pod certificate signer
// included), and no probe of a CA pod failed once it was Ready, nor any
// readiness or liveness probe met a closed port (the startup probe holds
// them back while the CA starts).
func TestChartHealthyOnNode(t *testing.T) {
	need(t)
	installMeshid(t)
	ctx := context.Background()
	c := cluster.Client()
	logs := caLogs(t)
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(strings.ToLower(line), "forbidden") {
			t.Errorf("a CA log line says forbidden: %s", line)
		}
	}
	pods, err := c.CoreV1().Pods(caNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=meshid"})
	if err != nil {
		t.Fatal(err)
	}
	readySince := map[string]time.Time{}
	for _, p := range pods.Items {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				readySince[p.Name] = cond.LastTransitionTime.Time
			}
		}
	}
	events, err := c.CoreV1().Events(caNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod,reason=Unhealthy"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		since, ok := readySince[e.InvolvedObject.Name]
		last := e.LastTimestamp.Time
		if last.IsZero() {
			last = e.EventTime.Time
		}
		switch {
		case ok && last.After(since):
			t.Errorf("CA pod %s Ready since %s, then Unhealthy at %s (x%d): %s", e.InvolvedObject.Name, since.Format(time.TimeOnly), last.Format(time.TimeOnly), e.Count, e.Message)
		case !strings.HasPrefix(e.Message, "Startup probe failed") && strings.Contains(e.Message, "connection refused"):
			t.Errorf("CA pod %s: a probe met a closed port: %s", e.InvolvedObject.Name, e.Message)
		}
	}
}

// sidecarPod is a workload pod as deploy/examples/agent-sidecar.yaml makes
// one: its pod security context, the meshid-agent native sidecar and its
// three volumes, taken from the example file, with the example's Envoy and
// app replaced by ./node/workload, which has Envoy's mounts but its config
// (SDS on the agent's socket where the example mounts it for Envoy, as
// Envoy asks, and the Workload API, which the agent serves beside it with
// --workload-api-socket). No DNS here: the CA's Service name resolves by
// /etc/hosts to its ClusterIP (kube-proxy routes it).
func sidecarPod(t testing.TB, ns, name, sa string, labels map[string]string, args ...string) *corev1.Pod {
	t.Helper()
	example := exampleDeployment(t)
	spec := example.Spec.Template.Spec.DeepCopy()
	spec.ServiceAccountName = sa
	var agent *corev1.Container
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == "meshid-agent" {
			agent = &spec.InitContainers[i]
		}
	}
	if agent == nil {
		t.Fatal("deploy/examples/agent-sidecar.yaml has no meshid-agent init container")
	}
	agent.ImagePullPolicy = corev1.PullNever
	agent.Args = append(agent.Args, "--workload-api-socket=/var/run/secrets/workload-spiffe-uds/workload.sock")
	var volumes []corev1.Volume
	for _, v := range spec.Volumes {
		if v.Name != "envoy-config" {
			volumes = append(volumes, v)
		}
	}
	spec.Volumes = volumes
	// The workload stands in for the example's Envoy, with its resources
	// (a CPU request: without one its cpu.shares are the minimum, 2, and on
	// a busy machine it is starved for seconds) and its mounts but Envoy's
	// config: the agent's socket is where the example mounts it for Envoy.
	proxy := exampleProxy(t)
	var mounts []corev1.VolumeMount
	for _, m := range proxy.VolumeMounts {
		if m.Name != "envoy-config" {
			mounts = append(mounts, m)
		}
	}
	spec.Containers = []corev1.Container{{
		Name: "workload", Image: workloadRef, ImagePullPolicy: corev1.PullNever,
		Args:         args,
		Resources:    proxy.Resources,
		VolumeMounts: mounts,
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr(false), ReadOnlyRootFilesystem: ptr(true),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	}}
	ip := caServiceIP(t)
	spec.HostAliases = []corev1.HostAlias{{IP: ip, Hostnames: []string{caService}}}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Spec: *spec}
}

func ptr[T any](v T) *T { return &v }

// exampleDeployment decodes the Deployment of the shipped example.
func exampleDeployment(t testing.TB) *appsv1.Deployment {
	t.Helper()
	repo, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := harness.ReadManifests(filepath.Join(repo, "deploy", "examples", "agent-sidecar.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
				t.Fatal(err)
			}
			return &d
		}
	}
	t.Fatal("deploy/examples/agent-sidecar.yaml has no Deployment")
	return nil
}

// exampleProxy is the envoy container of the shipped example, which
// requests CPU.
func exampleProxy(t testing.TB) corev1.Container {
	t.Helper()
	for _, c := range exampleDeployment(t).Spec.Template.Spec.Containers {
		if c.Name == "envoy" {
			if c.Resources.Requests.Cpu().IsZero() {
				t.Fatal("deploy/examples/agent-sidecar.yaml: its envoy container requests no CPU")
			}
			return c
		}
	}
	t.Fatal("deploy/examples/agent-sidecar.yaml has no envoy container")
	return corev1.Container{}
}

func caServiceIP(t testing.TB) string {
	t.Helper()
	svc, err := cluster.Client().CoreV1().Services(caNS).Get(context.Background(), release, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// TestWorkloadIdentityAndMTLS: two workload pods with the agent sidecar
// get their SPIFFE identities over SDS and over the Workload API, and one
// completes mTLS with the other, each verifying the other's identity.
func TestWorkloadIdentityAndMTLS(t *testing.T) {
	need(t)
	installMeshid(t)
	p := newPair(t, "shop")
	serverID := "spiffe://cluster.local/ns/shop/sa/server"
	clientID := "spiffe://cluster.local/ns/shop/sa/client"
	if p.serverID != serverID {
		t.Fatalf("pair's server %q", p.serverID)
	}
	clientLog := waitLogMatch(t, "shop", "client", "workload", "handshake ok")
	for _, want := range []string{"sds " + clientID + " roots=1 at=", "workloadapi " + clientID, "handshake ok peer=" + serverID} {
		if !strings.Contains(clientLog, want) {
			t.Errorf("client log lacks %q:\n%s", want, clientLog)
		}
	}
	serverLog := waitLogMatch(t, "shop", "server", "workload", "peer ")
	for _, want := range []string{"sds " + serverID + " roots=1 at=", "workloadapi " + serverID, "peer " + clientID} {
		if !strings.Contains(serverLog, want) {
			t.Errorf("server log lacks %q:\n%s", want, serverLog)
		}
	}
}

// waitLogMatch waits until the container's log holds substr.
func waitLogMatch(t *testing.T, ns, pod, container, substr string) string {
	t.Helper()
	var log string
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		b, err := cluster.Client().CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
		if err != nil {
			log = err.Error()
			return false, nil
		}
		log = string(b)
		return strings.Contains(log, substr), nil
	})
	if err != nil {
		p, _ := cluster.Client().CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
		var pods []corev1.Pod
		if p != nil {
			pods = append(pods, *p)
		}
		agentLog, _ := cluster.Client().CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: "meshid-agent"}).DoRaw(context.Background())
		t.Fatalf("log of %s/%s has no %q: %v\n%s\nagent:\n%s\n%s", ns, pod, substr, err, log, tail(string(agentLog), 3000), describe(pods))
	}
	return log
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
