package main

import (
	"testing"
	"time"

	"github.com/meshid/meshid/ca/spiffefed"
)

// TestServerFederationFlags: the federation flags reach the Config through
// the real command, parsed by ca/spiffefed, and bad values are refused.
func TestServerFederationFlags(t *testing.T) {
	clearServerEnv(t)
	if got := serverConfigOf(t); got.Federation.BundleEndpoint.Listen != "" || got.Federation.Peers != nil {
		t.Fatalf("defaults: %+v %v", got.Federation.BundleEndpoint, got.Federation.Peers)
	}
	got := serverConfigOf(t, "--trust-domain", "a.example", "--bundle-endpoint-listen", "127.0.0.1:8443",
		"--bundle-endpoint-profile", "https_web", "--bundle-endpoint-cert", "/c.pem", "--bundle-endpoint-key", "/k.pem",
		"--bundle-endpoint-refresh-hint", "30s",
		"--federate-with", "b.example=https://b.example:8443/,endpoint-id=spiffe://b.example/meshid/bundle-endpoint,bundle=/b.json",
		"--federate-with", "spire.example=https://spire.example/,profile=https_web")
	be := got.Federation.BundleEndpoint
	if be.Listen != "127.0.0.1:8443" || be.Profile != spiffefed.ProfileWeb || be.CertFile != "/c.pem" || be.KeyFile != "/k.pem" || be.RefreshHint != 30*time.Second {
		t.Fatalf("bundle endpoint %+v", be)
	}
	if len(got.Federation.Peers) != 2 || got.Federation.Peers[0].BundleFile != "/b.json" || got.Federation.Peers[1].Profile != spiffefed.ProfileWeb {
		t.Fatalf("federate-with %+v", got.Federation.Peers)
	}
	for _, bad := range [][]string{
		{"--bundle-endpoint-listen", ":1", "--bundle-endpoint-profile", "ftp"},
		{"--federate-with", "b.example=http://b/"},
		{"--trust-domain", "a.example", "--federate-with", "a.example=https://a/,profile=https_web"},
	} {
		if _, _, err := configsOf(t, append([]string{"server"}, bad...)...); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
