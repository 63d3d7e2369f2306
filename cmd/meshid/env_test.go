package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/sds/agent"
)

// configsOf runs `meshid args...` through the real command tree with the
// process environment, and returns the Configs the server or agent would
// run with.
func configsOf(t *testing.T, args ...string) (caserver.Config, agent.Config, error) {
	t.Helper()
	var (
		sc caserver.Config
		ac agent.Config
	)
	root := newRootCmdWith(io.Discard, io.Discard, runners{
		server: func(_ context.Context, cfg caserver.Config) error { sc = cfg; return nil },
		agent:  func(_ context.Context, cfg agent.Config) error { ac = cfg; return nil },
	})
	root.SetArgs(args)
	err := root.Execute()
	return sc, ac, err
}

func serverConfigOf(t *testing.T, args ...string) caserver.Config {
	t.Helper()
	cfg, _, err := configsOf(t, append([]string{"server"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// clearServerEnv unsets every documented variable for the test.
func clearServerEnv(t *testing.T) {
	for _, p := range serverEnv {
		t.Setenv(p.Env, "")
	}
}

// TestServerGOGC: without GOGC the CA runs with caserver's
// DefaultGCPercent (GCPercent 0); with GOGC set, the runtime's setting is
// kept (GCPercent -1).
func TestServerGOGC(t *testing.T) {
	clearServerEnv(t)
	t.Setenv("GOGC", "")
	if c := serverConfigOf(t); c.Runtime.GCPercent != 0 {
		t.Errorf("without GOGC: GCPercent %d, want 0 (the default)", c.Runtime.GCPercent)
	}
	t.Setenv("GOGC", "200")
	if c := serverConfigOf(t); c.Runtime.GCPercent != -1 {
		t.Errorf("with GOGC=200: GCPercent %d, want -1 (keep the runtime's)", c.Runtime.GCPercent)
	}
}

// TestServerEnv: each documented istiod variable, alone, reaches the CA's
// Config through `meshid server`.
func TestServerEnv(t *testing.T) {
	for _, tc := range []struct {
		env, val string
		check    func(caserver.Config) bool
	}{
		{"DEFAULT_WORKLOAD_CERT_TTL", "1h", func(c caserver.Config) bool { return c.Issuance.DefaultTTL == time.Hour }},
		{"DEFAULT_WORKLOAD_CERT_TTL", "7200", func(c caserver.Config) bool { return c.Issuance.DefaultTTL == 2*time.Hour }},
		{"MAX_WORKLOAD_CERT_TTL", "48h", func(c caserver.Config) bool { return c.Issuance.MaxTTL == 48*time.Hour }},
		{"TOKEN_AUDIENCES", "a,b", func(c caserver.Config) bool {
			return len(c.Authn.TokenAudiences) == 2 && c.Authn.TokenAudiences[0] == "a" && c.Authn.TokenAudiences[1] == "b"
		}},
		{"ROOT_CA_DIR", "/etc/cacerts", func(c caserver.Config) bool { return c.CADir == "/etc/cacerts" }},
		{"TRUST_DOMAIN", "example.org", func(c caserver.Config) bool { return c.TrustDomain.Name() == "example.org" }},
		{"POD_NAMESPACE", "mesh-ca", func(c caserver.Config) bool { return c.Kube.Namespace == "mesh-ca" }},
		{"POD_NAME", "meshid-0", func(c caserver.Config) bool { return c.Kube.PodName == "meshid-0" }},
		{"CLUSTER_ID", "east", func(c caserver.Config) bool { return c.Clusters.ID == "east" }},
		{"CA_TRUSTED_NODE_ACCOUNTS", "istio-system/ztunnel,kube-system/node-agent", func(c caserver.Config) bool {
			return len(c.Authn.TrustedNodeAccounts) == 2 && c.Authn.TrustedNodeAccounts[0].String() == "istio-system/ztunnel" && c.Authn.TrustedNodeAccounts[1].Name == "node-agent"
		}},
	} {
		t.Run(tc.env+"="+tc.val, func(t *testing.T) {
			clearServerEnv(t)
			if tc.check(serverConfigOf(t)) {
				t.Fatal("the default Config already passes the check: the test cannot fail")
			}
			t.Setenv(tc.env, tc.val)
			if got := serverConfigOf(t); !tc.check(got) {
				t.Fatalf("%s=%s did not reach the Config: %+v", tc.env, tc.val, got)
			}
		})
	}
}

// TestServerFlagBeatsEnv: a flag the user set wins over its variable, and a
// bad variable is an error.
func TestServerFlagBeatsEnv(t *testing.T) {
	clearServerEnv(t)
	t.Setenv("TRUST_DOMAIN", "env.example")
	if got := serverConfigOf(t, "--trust-domain", "flag.example"); got.TrustDomain.Name() != "flag.example" {
		t.Fatalf("trust domain %s", got.TrustDomain.Name())
	}
	t.Setenv("MAX_WORKLOAD_CERT_TTL", "forever")
	if _, _, err := configsOf(t, "server"); err == nil {
		t.Fatal("MAX_WORKLOAD_CERT_TTL=forever accepted")
	}
}

// TestServerDefaults: with no flags and no environment, `meshid server`
// runs the CA with caserver's defaults, and monitoring on its default port.
func TestServerDefaults(t *testing.T) {
	clearServerEnv(t)
	got := serverConfigOf(t)
	if got.Listen != caserver.DefaultListen || got.TrustDomain.Name() != caserver.DefaultTrustDomain ||
		got.Issuance.DefaultTTL != caserver.DefaultTTL || got.Issuance.MaxTTL != caserver.DefaultMaxTTL ||
		got.Monitoring.Listen != caserver.DefaultMonitoringListen || got.RootKeyType != caserver.DefaultRootKeyType || got.Logger == nil {
		t.Fatalf("defaults: %+v", got)
	}
}

// TestAgentAlias: `meshid agent` is the lean agent's command, environment
// included.
func TestAgentAlias(t *testing.T) {
	t.Setenv("CA_ADDR", "istiod:15012")
	t.Setenv("SECRET_GRACE_PERIOD_RATIO_JITTER", "0.2")
	_, got, err := configsOf(t, "agent", "--cert-ttl", "2h")
	if err != nil {
		t.Fatal(err)
	}
	if got.CAAddr != "istiod:15012" || got.Jitter != 0.2 || got.CertTTL != 2*time.Hour {
		t.Fatalf("meshid agent: %+v", got)
	}
}

// TestServerJWTFlags: --jwt-svid-ttl and --jwt-key-lifetime reach the CA's
// Config; their limits are caserver's (TestConfigErrors there).
func TestServerJWTFlags(t *testing.T) {
	clearServerEnv(t)
	c := serverConfigOf(t, "--jwt-svid-ttl", "2m", "--jwt-key-lifetime", "6h")
	if c.JWT.SVIDTTL != 2*time.Minute || c.JWT.KeyLifetime != 6*time.Hour {
		t.Errorf("JWTSVIDTTL %s, JWTKeyLifetime %s", c.JWT.SVIDTTL, c.JWT.KeyLifetime)
	}
}

// TestServerPodCertificateSigner: --pod-certificate-signer reaches the
// CA's Config (off by default); a name the API server would refuse is a
// usage error naming the flag.
func TestServerPodCertificateSigner(t *testing.T) {
	clearServerEnv(t)
	if c := serverConfigOf(t); c.Kube.PodCertificateSigner != "" {
		t.Fatalf("default signer %q, want off", c.Kube.PodCertificateSigner)
	}
	if c := serverConfigOf(t, "--pod-certificate-signer", "meshid.io/workload"); c.Kube.PodCertificateSigner != "meshid.io/workload" {
		t.Fatalf("signer %q", c.Kube.PodCertificateSigner)
	}
	for _, bad := range []string{"workload", "kubernetes.io/kube-apiserver-client-pod", "Not_A.Domain/x", "meshid.io/"} {
		_, _, err := configsOf(t, "server", "--pod-certificate-signer", bad)
		if err == nil || !strings.Contains(err.Error(), "--pod-certificate-signer") {
			t.Errorf("--pod-certificate-signer %q: %v", bad, err)
		}
	}
}

// TestServerPodCertificateRefreshRatio: --pod-certificate-refresh-ratio
// reaches the CA's Config (default the agent's renewal point, 0.5); a
// ratio outside (0,1) is a usage error naming the flag.
func TestServerPodCertificateRefreshRatio(t *testing.T) {
	clearServerEnv(t)
	if c := serverConfigOf(t); c.Kube.PodCertificateRefresh != 0.5 {
		t.Fatalf("default refresh ratio %v, want 0.5", c.Kube.PodCertificateRefresh)
	}
	if c := serverConfigOf(t, "--pod-certificate-refresh-ratio", "0.01"); c.Kube.PodCertificateRefresh != 0.01 {
		t.Fatalf("refresh ratio %v", c.Kube.PodCertificateRefresh)
	}
	for _, bad := range []string{"0", "1", "-0.5", "1.5", "NaN", "Inf"} {
		_, _, err := configsOf(t, "server", "--pod-certificate-refresh-ratio", bad)
		if err == nil || !strings.Contains(err.Error(), "--pod-certificate-refresh-ratio") {
			t.Errorf("--pod-certificate-refresh-ratio %q: %v", bad, err)
		}
	}
}
