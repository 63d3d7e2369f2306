package podagent_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/inspect/podagent"
)

func pod(init, containers []corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"},
		Spec:       corev1.PodSpec{InitContainers: init, Containers: containers},
	}
}

func TestMonitoringPort(t *testing.T) {
	agent := func(args ...string) corev1.Container { return corev1.Container{Name: "meshid-agent", Args: args} }
	app := corev1.Container{Name: "app", Args: []string{"--monitoring-listen=0.0.0.0:1"}}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want int
		err  string
	}{
		{"native sidecar, = form", pod([]corev1.Container{agent("--ca-addr=x", "--monitoring-listen=0.0.0.0:15999")}, []corev1.Container{app}), 15999, ""},
		{"container, split form", pod(nil, []corev1.Container{app, agent("--monitoring-listen", "127.0.0.1:16000")}), 16000, ""},
		{"in command", pod(nil, []corev1.Container{{Name: "meshid-agent", Command: []string{"meshid-agent", "--monitoring-listen=:17000"}}}), 17000, ""},
		{"last wins", pod(nil, []corev1.Container{agent("--monitoring-listen=:1", "--monitoring-listen=:2")}), 2, ""},
		{"default", pod(nil, []corev1.Container{agent("--ca-addr=x")}), podagent.DefaultPort, ""},
		{"off", pod(nil, []corev1.Container{agent("--monitoring-listen=")}), 0, "monitoring off"},
		{"bad", pod(nil, []corev1.Container{agent("--monitoring-listen=15020")}), 0, "not HOST:PORT"},
		{"port out of range", pod(nil, []corev1.Container{agent("--monitoring-listen=:70000")}), 0, "not HOST:PORT"},
		{"no such container", pod(nil, []corev1.Container{app}), 0, `pod shop/cart has no container "meshid-agent" (it has: app); name the agent's with --container`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := podagent.MonitoringPort(tc.pod, podagent.DefaultContainer)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("%d, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("%d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := podagent.New(podagent.Config{Namespace: "a", Pod: "b"}); err == nil {
		t.Error("no REST config accepted")
	}
}

func TestParseRef(t *testing.T) {
	if ns, name, err := podagent.ParseRef("shop/cart-7d9f"); err != nil || ns != "shop" || name != "cart-7d9f" {
		t.Fatalf("ParseRef = %q %q %v", ns, name, err)
	}
	for _, bad := range []string{"", "cart", "shop/", "/cart", "a/b/c", "/", strings.Repeat("a/", 1000)} {
		if _, _, err := podagent.ParseRef(bad); err == nil || !strings.Contains(err.Error(), "want NAMESPACE/NAME") {
			t.Errorf("ParseRef(%.20q) = %v, want a NAMESPACE/NAME error", bad, err)
		}
	}
}
