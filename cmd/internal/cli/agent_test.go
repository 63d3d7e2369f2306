package cli_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/cmd/internal/cli"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/rootfile"
)

// agentEnvNames are the istio-agent variables the agent documents.
var agentEnvNames = []string{
	"CA_ADDR", "CA_ROOT_CA", "TRUST_DOMAIN", "SECRET_TTL", "SECRET_GRACE_PERIOD_RATIO",
	"SECRET_GRACE_PERIOD_RATIO_JITTER", "ECC_SIGNATURE_ALGORITHM", "ECC_CURVE",
	"WORKLOAD_RSA_KEY_SIZE", "ISTIO_META_CLUSTER_ID", "POD_NAMESPACE", "SERVICE_ACCOUNT",
}

// AgentConfigOf runs the real agent command (cli.AgentCommand, what
// `meshid agent` and meshid-agent run) with args and the process
// environment, and returns the Config it would run the agent with.
func AgentConfigOf(t *testing.T, args ...string) (agent.Config, error) {
	t.Helper()
	var got agent.Config
	cmd := cli.AgentCommand("agent", func(_ context.Context, cfg agent.Config) error {
		got = cfg
		return nil
	})
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	err := cmd.Execute()
	return got, err
}

// clearAgentEnv unsets every documented variable for the test.
func clearAgentEnv(t *testing.T) {
	for _, name := range agentEnvNames {
		t.Setenv(name, "")
	}
}

// TestAgentEnv: each documented istio-agent variable, alone, reaches the
// agent's Config through the real command.
func TestAgentEnv(t *testing.T) {
	for _, tc := range []struct {
		env   map[string]string
		check func(agent.Config) bool
		base  map[string]string // set in both runs
	}{
		{map[string]string{"CA_ADDR": "istiod.istio-system.svc:15012"}, func(c agent.Config) bool { return c.CAAddr == "istiod.istio-system.svc:15012" }, nil},
		{map[string]string{"CA_ROOT_CA": "/etc/certs/root.pem"}, func(c agent.Config) bool { return c.CARootFile == "/etc/certs/root.pem" }, nil},
		{map[string]string{"TRUST_DOMAIN": "example.org"}, func(c agent.Config) bool { return c.TrustDomain.Name() == "example.org" }, nil},
		{map[string]string{"SECRET_TTL": "2h"}, func(c agent.Config) bool { return c.CertTTL == 2*time.Hour }, nil},
		{map[string]string{"SECRET_TTL": "600"}, func(c agent.Config) bool { return c.CertTTL == 10*time.Minute }, nil},
		{map[string]string{"SECRET_GRACE_PERIOD_RATIO": "0.25"}, func(c agent.Config) bool { return c.GraceRatio == 0.25 }, nil},
		{map[string]string{"SECRET_GRACE_PERIOD_RATIO_JITTER": "0.2"}, func(c agent.Config) bool { return c.Jitter == 0.2 }, nil},
		{map[string]string{"SECRET_GRACE_PERIOD_RATIO_JITTER": "0"}, func(c agent.Config) bool { return c.Jitter == agent.NoJitter }, nil},
		{map[string]string{"ECC_SIGNATURE_ALGORITHM": "ECDSA"}, func(c agent.Config) bool { return c.KeyType == certs.ECP256 }, map[string]string{"WORKLOAD_RSA_KEY_SIZE": "2048"}},
		{map[string]string{"ECC_SIGNATURE_ALGORITHM": "ECDSA", "ECC_CURVE": "P384"}, func(c agent.Config) bool { return c.KeyType == certs.ECP384 }, nil},
		{map[string]string{"WORKLOAD_RSA_KEY_SIZE": "3072"}, func(c agent.Config) bool { return c.KeyType == "rsa-3072" }, nil},
		{map[string]string{"ISTIO_META_CLUSTER_ID": "east"}, func(c agent.Config) bool { return c.ClusterID == "east" }, nil},
		{map[string]string{"POD_NAMESPACE": "shop"}, func(c agent.Config) bool { return c.Namespace == "shop" }, nil},
		{map[string]string{"SERVICE_ACCOUNT": "cart"}, func(c agent.Config) bool { return c.ServiceAccount == "cart" }, nil},
	} {
		var name []string
		for k, v := range tc.env {
			name = append(name, k+"="+v)
		}
		t.Run(strings.Join(name, ","), func(t *testing.T) {
			clearAgentEnv(t)
			for k, v := range tc.base {
				t.Setenv(k, v)
			}
			unset, err := AgentConfigOf(t)
			if err != nil {
				t.Fatal(err)
			}
			if tc.check(unset) {
				t.Fatalf("the default Config already passes the check: the test cannot fail (%+v)", unset)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			got, err := AgentConfigOf(t)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(got) {
				t.Fatalf("%v did not reach the Config: %+v", tc.env, got)
			}
		})
	}
}

// TestAgentFlagBeatsEnv: a flag the user set wins over its variable.
func TestAgentFlagBeatsEnv(t *testing.T) {
	clearAgentEnv(t)
	t.Setenv("CA_ADDR", "from-env:1")
	t.Setenv("ECC_SIGNATURE_ALGORITHM", "ECDSA")
	t.Setenv("ECC_CURVE", "P384")
	got, err := AgentConfigOf(t, "--ca-addr", "from-flag:1", "--key-type", "rsa-2048")
	if err != nil {
		t.Fatal(err)
	}
	if got.CAAddr != "from-flag:1" || got.KeyType != certs.RSA2048 {
		t.Fatalf("flags lost to the environment: %+v", got)
	}
}

// TestAgentDefaults: with no flags and no environment, the Config carries
// the agent's defaults, and the jitter flag's 0 means none.
func TestAgentDefaults(t *testing.T) {
	clearAgentEnv(t)
	got, err := AgentConfigOf(t)
	if err != nil {
		t.Fatal(err)
	}
	if got.CAAddr != agent.DefaultCAAddr || got.Jitter != agent.DefaultJitter || got.CertTTL != agent.DefaultCertTTL ||
		got.MonitoringListen != agent.DefaultMonitoringListen || got.KeyType != agent.DefaultKeyType || got.Logger == nil {
		t.Fatalf("defaults: %+v", got)
	}
	if got, err = AgentConfigOf(t, "--grace-ratio-jitter", "0"); err != nil || got.Jitter != agent.NoJitter {
		t.Fatalf("--grace-ratio-jitter 0: jitter %v (%v), want NoJitter", got.Jitter, err)
	}
}

// TestAgentRootFlags: --ca-root-max reaches the Config, its default is
// sds/rootfile's.
func TestAgentRootFlags(t *testing.T) {
	clearAgentEnv(t)
	got, err := AgentConfigOf(t)
	if err != nil || got.MaxCARoots != rootfile.DefaultMaxRoots {
		t.Fatalf("default MaxCARoots %d (%v), want %d", got.MaxCARoots, err, rootfile.DefaultMaxRoots)
	}
	if got, err = AgentConfigOf(t, "--ca-root-max", "3"); err != nil || got.MaxCARoots != 3 {
		t.Fatalf("--ca-root-max 3: MaxCARoots %d (%v)", got.MaxCARoots, err)
	}
}

// TestAgentDebugSecretsFlag: /debug/secrets is on unless
// --debug-secrets=false turns it off.
func TestAgentDebugSecretsFlag(t *testing.T) {
	clearAgentEnv(t)
	got, err := AgentConfigOf(t)
	if err != nil || got.DisableDebugSecrets {
		t.Fatalf("default: DisableDebugSecrets %v (%v), want false", got.DisableDebugSecrets, err)
	}
	if got, err = AgentConfigOf(t, "--debug-secrets=false"); err != nil || !got.DisableDebugSecrets {
		t.Fatalf("--debug-secrets=false: DisableDebugSecrets %v (%v), want true", got.DisableDebugSecrets, err)
	}
}

// TestAgentEnvErrors: a bad value in the environment is an error naming the
// variable, not a silent default.
func TestAgentEnvErrors(t *testing.T) {
	for env, val := range map[string]string{"SECRET_TTL": "soon", "SECRET_GRACE_PERIOD_RATIO": "half", "TRUST_DOMAIN": "Bad Domain", "WORKLOAD_RSA_KEY_SIZE": "512"} {
		t.Run(env, func(t *testing.T) {
			clearAgentEnv(t)
			t.Setenv(env, val)
			if _, err := AgentConfigOf(t); err == nil {
				t.Fatalf("%s=%s accepted", env, val)
			}
		})
	}
}

// TestAgentHelpListsEveryKeyType: --key-type's help names every type the
// agent accepts (it once left out rsa-4096), and each is accepted.
func TestAgentHelpListsEveryKeyType(t *testing.T) {
	cmd := cli.AgentCommand("agent", func(context.Context, agent.Config) error { return nil })
	usage := cmd.Flags().Lookup("key-type").Usage
	for _, kt := range certs.KeyTypes {
		if !strings.Contains(usage, string(kt)) {
			t.Errorf("--key-type help %q lacks %s", usage, kt)
		}
		if _, err := certs.ParseKeyType(string(kt)); err != nil {
			t.Errorf("%s listed but refused: %v", kt, err)
		}
	}
}
