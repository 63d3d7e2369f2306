package caserver

import (
	"os"
	"strings"
	"testing"
)

// TestPodNameDefault: without a pod name (no downward API, e.g. two
// replicas started on one host) each Config gets its own leader-election
// identity, the hostname and a random suffix; a given pod name is kept.
func TestPodNameDefault(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	a, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if a.Kube.PodName == b.Kube.PodName {
		t.Fatalf("two replicas without a pod name share the identity %q", a.Kube.PodName)
	}
	for _, c := range []Config{a, b} {
		if !strings.HasPrefix(c.Kube.PodName, host+"_") || len(c.Kube.PodName) != len(host)+13 {
			t.Errorf("identity %q, want %q, '_' and 12 random characters", c.Kube.PodName, host)
		}
	}
	if c, err := (Config{Kube: KubeConfig{PodName: "meshid-0"}}).withDefaults(); err != nil || c.Kube.PodName != "meshid-0" {
		t.Errorf("PodName meshid-0: %q, %v", c.Kube.PodName, err)
	}
}
