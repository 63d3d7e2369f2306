package main

import (
	"strings"
	"testing"
	"time"
)

// TestServerUpstreamFlags: --upstream and its options reach
// caserver.Config typed; a bad URL or credentials without a URL is a usage
// error.
func TestServerUpstreamFlags(t *testing.T) {
	clearServerEnv(t)
	if cfg := serverConfigOf(t); cfg.Upstream.URL != nil {
		t.Fatal("an upstream by default")
	}
	cfg := serverConfigOf(t, "--upstream", "cfssl+https://ca.corp:8888?profile=mesh", "--upstream-credentials", "/etc/meshid/upstream/key",
		"--upstream-lifetime", "48h", "--upstream-renew-at", "0.6")
	u := cfg.Upstream
	if u.URL == nil || u.URL.Scheme != "cfssl+https" || u.URL.Query.Get("profile") != "mesh" || u.CredentialsFile != "/etc/meshid/upstream/key" || u.Lifetime != 48*time.Hour || u.RenewAt != 0.6 {
		t.Fatalf("%+v", u)
	}
	for _, args := range [][]string{
		{"--upstream", "cfssl+https://user:pw@ca.corp:8888?profile=mesh"},
		{"--upstream-credentials", "/etc/key"},
	} {
		if _, _, err := configsOf(t, append([]string{"server"}, args...)...); err == nil || !strings.Contains(err.Error(), "upstream") {
			t.Errorf("%v: %v", args, err)
		}
	}
}
