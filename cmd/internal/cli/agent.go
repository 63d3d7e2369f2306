package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/sds/agent"
	"github.com/meshid/meshid/sds/rootfile"
	"github.com/meshid/meshid/sds/secretcache"
)

// AgentFlags are the flags of `meshid agent` and `meshid-agent`.
type AgentFlags struct {
	caAddr           string
	caRoot           string
	tokenFile        string
	sdsSocket        string
	socketGroup      bool
	certTTL          time.Duration
	graceRatio       float64
	jitter           float64
	keyType          string
	monitoringListen string
	trustDomain      string
	clusterID        string
	namespace        string
	serviceAccount   string
	logLevel         string
	logFormat        string
	debugEndpoints   bool
	fileSecretDirs   []string
	workloadSocket   string
	caRootRefresh    time.Duration
	caRootMax        int
	debugSecrets     bool
}

// Register adds the agent's flags, with agent.Config's defaults, to fs.
func (f *AgentFlags) Register(fs *pflag.FlagSet) {
	fs.StringVar(&f.caAddr, "ca-addr", agent.DefaultCAAddr, "address of the CA's CreateCertificate API")
	fs.StringVar(&f.caRoot, "ca-root", "", "PEM roots that verify the CA's serving certificate")
	fs.DurationVar(&f.caRootRefresh, "ca-root-refresh", secretcache.DefaultRootRefresh, "re-read --ca-root this often; its roots join the CA's in ROOTCA (0 = never)")
	fs.IntVar(&f.caRootMax, "ca-root-max", rootfile.DefaultMaxRoots, "refuse a --ca-root of more roots than this (a system CA bundle would make the mesh trust every public CA); the system bundle itself is always refused")
	fs.StringVar(&f.tokenFile, "token-file", agent.DefaultTokenFile, "service-account token, re-read for every CA request")
	fs.StringVar(&f.sdsSocket, "sds-socket", agent.DefaultSDSSocket, "Unix socket to serve Envoy SDS on")
	fs.BoolVar(&f.socketGroup, "sds-socket-group", false, "make the SDS socket 0660 instead of 0600 so the group can connect")
	fs.DurationVar(&f.certTTL, "cert-ttl", agent.DefaultCertTTL, "requested workload certificate TTL")
	fs.Float64Var(&f.graceRatio, "grace-ratio", agent.DefaultGraceRatio, "renew after this fraction of the certificate lifetime")
	fs.Float64Var(&f.jitter, "grace-ratio-jitter", agent.DefaultJitter, "± fraction of the lifetime by which renewal moves at random (0 = none)")
	fs.StringVar(&f.keyType, "key-type", string(agent.DefaultKeyType), "workload key: "+certs.KeyTypeNames(certs.KeyTypes))
	fs.StringVar(&f.monitoringListen, "monitoring-listen", agent.DefaultMonitoringListen, "address of /metrics /healthz /readyz (empty disables)")
	fs.StringVar(&f.trustDomain, "trust-domain", agent.DefaultTrustDomain, "SPIFFE trust domain of the workload identity")
	fs.StringVar(&f.clusterID, "cluster-id", "", "ClusterID sent in CSR metadata")
	fs.StringVar(&f.namespace, "namespace", "", "workload namespace when the token carries no kubernetes.io claims")
	fs.StringVar(&f.serviceAccount, "service-account", "", "workload service account when the token carries no kubernetes.io claims")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug | info | warn | error")
	fs.StringVar(&f.workloadSocket, "workload-api-socket", "", "Unix socket to serve the SPIFFE Workload API on, from the same cache as SDS (empty = off)")
	fs.StringVar(&f.logFormat, "log-format", "text", LogFormatUsage)
	fs.BoolVar(&f.debugEndpoints, "debug-endpoints", false, "serve POST /debug/rotate on --monitoring-listen, which must then be a loopback address (no authentication)")
	fs.BoolVar(&f.debugSecrets, "debug-secrets", true, "serve GET /debug/secrets on --monitoring-listen to loopback peers only: the chain and roots held, never a key (meshid inspect --pod reads it); false turns it off")
	fs.StringSliceVar(&f.fileSecretDirs, "file-secret-dirs", secretcache.DefaultFileSecretDirs, "the only directories file-cert: and file-root: SDS resources may read (empty = none)")
}

// AgentConfig turns the parsed flags in fs, with lookup's istio-agent
// environment as fallbacks for flags the user did not set, into an
// agent.Config (Logger and metrics left to the caller).
func AgentConfig(fs *pflag.FlagSet, f *AgentFlags, lookup Lookup) (agent.Config, error) {
	if err := EnvDefaults(fs, lookup, agentEnv...); err != nil {
		return agent.Config{}, err
	}
	td, err := spiffeid.TrustDomainFromString(f.trustDomain)
	if err != nil {
		return agent.Config{}, fmt.Errorf("--trust-domain: %w", err)
	}
	keyType, err := certs.ParseKeyType(envKeyType(fs, f.keyType, lookup))
	if err != nil {
		return agent.Config{}, fmt.Errorf("--key-type: %w", err)
	}
	jitter := f.jitter
	if jitter == 0 {
		jitter = agent.NoJitter // the flag's 0 means none; the Config's 0 means its default
	}
	dirs := f.fileSecretDirs
	if dirs == nil {
		dirs = []string{} // --file-secret-dirs= : none (nil would mean the default)
	}
	return agent.Config{
		DebugEndpoints:      f.debugEndpoints,
		DisableDebugSecrets: !f.debugSecrets,
		WorkloadAPISocket:   f.workloadSocket,
		FileSecretDirs:      dirs,
		CAAddr:              f.caAddr,
		CARootFile:          f.caRoot,
		CARootRefresh:       f.caRootRefresh,
		MaxCARoots:          f.caRootMax,
		TokenFile:           f.tokenFile,
		SDSSocket:           f.sdsSocket,
		SocketGroup:         f.socketGroup,
		CertTTL:             f.certTTL,
		GraceRatio:          f.graceRatio,
		Jitter:              jitter,
		KeyType:             keyType,
		TrustDomain:         td,
		ClusterID:           f.clusterID,
		Namespace:           f.namespace,
		ServiceAccount:      f.serviceAccount,
		MonitoringListen:    f.monitoringListen,
	}, nil
}

// AgentRun runs an agent built from cfg; tests replace it to see the Config.
type AgentRun func(ctx context.Context, cfg agent.Config) error

// RunAgent builds the agent from cfg and runs it until ctx ends.
func RunAgent(ctx context.Context, cfg agent.Config) error {
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// AgentCommand is the agent command named use; run receives its Config,
// with the logger of --log-level writing to the command's stderr.
func AgentCommand(use string, run AgentRun) *cobra.Command {
	f := &AgentFlags{}
	cmd := &cobra.Command{
		Use:   use,
		Short: "Run the node agent: key, CSR, cache, rotation, and Envoy SDS on a Unix socket",
		Long: `The node agent is the SecretManager beside the proxies. It serves Envoy SDS
(default, ROOTCA, file-cert:<cert>~<key>, file-root:<path>) on a Unix socket,
gets certificates from the CA with the workload's service-account token, and
rotates them before they expire.

Environment fallbacks (istio-agent names): CA_ADDR, CA_ROOT_CA, TRUST_DOMAIN,
SECRET_TTL, SECRET_GRACE_PERIOD_RATIO, SECRET_GRACE_PERIOD_RATIO_JITTER,
ECC_SIGNATURE_ALGORITHM, ECC_CURVE, WORKLOAD_RSA_KEY_SIZE,
ISTIO_META_CLUSTER_ID, POD_NAMESPACE, SERVICE_ACCOUNT.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := AgentConfig(cmd.Flags(), f, Env)
			if err != nil {
				return err
			}
			if cfg.Logger, err = NewLogger(cmd.ErrOrStderr(), f.logLevel, f.logFormat); err != nil {
				return err
			}
			return run(cmd.Context(), cfg)
		},
	}
	f.Register(cmd.Flags())
	return cmd
}
