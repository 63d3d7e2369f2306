package cluster

import (
	"testing"

	"k8s.io/client-go/rest"
)

// TestLimitedClient: each remote client gets its own rate limit and a
// User-Agent naming its use, whatever the kubeconfig said.
func TestLimitedClient(t *testing.T) {
	base := &rest.Config{Host: "https://b.example", QPS: 5000, Burst: 1}
	c := limited(base, DefaultQPS, DefaultBurst, "tokenreview")
	if c.QPS != DefaultQPS || c.Burst != DefaultBurst || c.UserAgent != "meshid/remote-tokenreview" || c.RateLimiter != nil {
		t.Fatalf("limited: QPS %v burst %d UA %q", c.QPS, c.Burst, c.UserAgent)
	}
	if base.QPS != 5000 {
		t.Fatal("the base config was changed")
	}
}
