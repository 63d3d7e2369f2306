package main

import (
	"github.com/spf13/pflag"

	"github.com/meshid/meshid/cmd/internal/cli"
)

// serverEnv are istiod's environment names for the server's flags: applied
// by cli.EnvDefaults, the only place meshid reads the environment (the
// agent's names are in cli).
var serverEnv = []cli.EnvPair{
	{Flag: "default-ttl", Env: "DEFAULT_WORKLOAD_CERT_TTL"},
	{Flag: "max-ttl", Env: "MAX_WORKLOAD_CERT_TTL"},
	{Flag: "token-audiences", Env: "TOKEN_AUDIENCES"},
	{Flag: "ca-dir", Env: "ROOT_CA_DIR"},
	{Flag: "trust-domain", Env: "TRUST_DOMAIN"},
	{Flag: "namespace", Env: "POD_NAMESPACE"},
	{Flag: "pod-name", Env: "POD_NAME"},
	{Flag: "trusted-node-accounts", Env: "CA_TRUSTED_NODE_ACCOUNTS"},
	{Flag: "cluster-id", Env: "CLUSTER_ID"},
}

// serverEnvDefaults applies serverEnv from lookup to the flags not set.
func serverEnvDefaults(fs *pflag.FlagSet, lookup cli.Lookup) error {
	return cli.EnvDefaults(fs, lookup, serverEnv...)
}
