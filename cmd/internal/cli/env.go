package cli

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/meshid/meshid/certs"
)

// Lookup reads an environment variable, like os.LookupEnv (which the
// commands use; tests may pass their own).
type Lookup func(string) (string, bool)

// Env is the process environment.
var Env Lookup = os.LookupEnv

// EnvPair names a flag and the environment variable that supplies its value
// when the user did not set the flag.
type EnvPair struct{ Flag, Env string }

// EnvDefaults applies environment variables as the values of flags the user
// did not set. This is the only place meshid reads the environment, so that
// operators can swap istiod or istio-agent for meshid with their env intact.
func EnvDefaults(fs *pflag.FlagSet, lookup Lookup, pairs ...EnvPair) error {
	for _, p := range pairs {
		if err := envDefault(fs, lookup, p); err != nil {
			return err
		}
	}
	return nil
}

func envDefault(fs *pflag.FlagSet, lookup Lookup, p EnvPair) error {
	f := fs.Lookup(p.Flag)
	if f == nil || f.Changed {
		return nil
	}
	v, ok := lookup(p.Env)
	if !ok || v == "" {
		return nil
	}
	if f.Value.Type() == "duration" {
		// Istio's env durations are Go durations; accept plain seconds
		// too, as some charts write them.
		if n, err := strconv.Atoi(v); err == nil {
			v = (time.Duration(n) * time.Second).String()
		}
	}
	if err := fs.Set(p.Flag, strings.TrimSpace(v)); err != nil {
		return fmt.Errorf("environment %s: %w", p.Env, err)
	}
	return nil
}

// Getenv is lookup's value of name, "" when unset.
func (lookup Lookup) Getenv(name string) string {
	v, _ := lookup(name)
	return v
}

// agentEnv are istio-agent's environment names for the agent's flags.
var agentEnv = []EnvPair{
	{"ca-addr", "CA_ADDR"},
	{"ca-root", "CA_ROOT_CA"},
	{"trust-domain", "TRUST_DOMAIN"},
	{"cert-ttl", "SECRET_TTL"},
	{"grace-ratio", "SECRET_GRACE_PERIOD_RATIO"},
	{"grace-ratio-jitter", "SECRET_GRACE_PERIOD_RATIO_JITTER"},
	{"cluster-id", "ISTIO_META_CLUSTER_ID"},
	{"namespace", "POD_NAMESPACE"},
	{"service-account", "SERVICE_ACCOUNT"},
}

// envKeyType is --key-type, or when unset istio-agent's choice:
// ECC_SIGNATURE_ALGORITHM=ECDSA selects EC keys (ECC_CURVE P256|P384);
// otherwise RSA of WORKLOAD_RSA_KEY_SIZE bits when that is set.
func envKeyType(fs *pflag.FlagSet, flag string, lookup Lookup) string {
	if fs.Changed("key-type") {
		return flag
	}
	switch {
	case strings.EqualFold(lookup.Getenv("ECC_SIGNATURE_ALGORITHM"), "ECDSA"):
		if strings.EqualFold(lookup.Getenv("ECC_CURVE"), "P384") {
			return string(certs.ECP384)
		}
		return string(certs.ECP256)
	case lookup.Getenv("WORKLOAD_RSA_KEY_SIZE") != "":
		return "rsa-" + lookup.Getenv("WORKLOAD_RSA_KEY_SIZE")
	}
	return flag
}
