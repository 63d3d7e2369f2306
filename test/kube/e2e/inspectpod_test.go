package e2e_test

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestInspectPod runs `meshid inspect --pod` against the real API server.
// There is no kubelet, so no port-forward can complete: the test covers the
// pod lookup through the API server, the discovery of the agent's
// container and monitoring port (a native sidecar with its own
// --monitoring-listen), the port-forward request reaching the API server,
// and the one-line error that names the pod, the port and the API server's
// reason.
func TestInspectPod(t *testing.T) {
	const ns, sa = "inspect-pod", "cart"
	ctx := context.Background()
	if err := cluster.CreateServiceAccount(ctx, ns, sa); err != nil {
		t.Fatal(err)
	}
	always := corev1.ContainerRestartPolicyAlways
	mkPod := func(name, node string, init []corev1.Container) {
		t.Helper()
		pod, err := cluster.Client().CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{
				ServiceAccountName: sa,
				NodeName:           node,
				InitContainers:     init,
				Containers:         []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cluster.DeletePod(context.Background(), pod) })
	}
	sidecar := []corev1.Container{{
		Name: "meshid-agent", Image: "meshid-agent:latest", RestartPolicy: &always,
		Args: []string{"--ca-addr=meshid.istio-system.svc:15012", "--monitoring-listen=0.0.0.0:15999"},
	}}
	mkPod("unscheduled", "", sidecar)
	mkPod("on-node", "node-gone", sidecar)
	mkPod("no-agent", "", nil)

	bin := meshid(t)
	run := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"inspect", "--kubeconfig", cluster.AdminKubeconfig(), "--timeout", "20s"}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return stderr.String(), code
	}
	tests := []struct {
		pod  string
		args []string
		code int
		want []string
	}{
		{ns + "/unscheduled", nil, 1, []string{"pod " + ns + "/unscheduled: port-forward to 15999:", "does not have a host assigned"}},
		{ns + "/on-node", nil, 1, []string{"pod " + ns + "/on-node: port-forward to 15999:", "node-gone"}},
		{ns + "/no-agent", nil, 1, []string{`pod ` + ns + `/no-agent has no container "meshid-agent" (it has: app); name the agent's with --container`}},
		{ns + "/unscheduled", []string{"--container", "app"}, 1, []string{"port-forward to 15020"}},
		{ns + "/nope", nil, 1, []string{`pods "nope" not found`}},
		{"nope", nil, 2, []string{"want NAMESPACE/NAME"}},
	}
	for _, tc := range tests {
		t.Run(tc.pod+strings.Join(tc.args, ""), func(t *testing.T) {
			stderr, code := run(append([]string{"--pod", tc.pod}, tc.args...)...)
			if code != tc.code || strings.Count(stderr, "\n") != 1 {
				t.Fatalf("exit %d, want %d, one line: %q", code, tc.code, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Fatalf("stderr %q lacks %q", stderr, w)
				}
			}
		})
	}
}
