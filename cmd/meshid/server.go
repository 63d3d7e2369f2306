package main

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/klog/v2"

	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/cmd/internal/cli"
)

// serverFlags are the flags of `meshid server` (docs/architecture.md).
type serverFlags struct {
	listen           string
	trustDomain      string
	caDir            string
	stateDir         string
	rootKeyType      string
	defaultTTL       time.Duration
	maxTTL           time.Duration
	kubeconfig       string
	tokenAudiences   []string
	jwtIssuer        string
	jwksFile         string
	monitoringListen string
	servingDNS       []string
	rateLimit        float64
	logLevel         string
	pprof            bool
	kubeCASecret     bool
	namespace        string
	podName          string
}

func (f *serverFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.listen, "listen", caserver.DefaultListen, "address of the gRPC CSR API (always TLS)")
	fs.StringVar(&f.trustDomain, "trust-domain", caserver.DefaultTrustDomain, "SPIFFE trust domain of issued identities")
	fs.StringVar(&f.caDir, "ca-dir", "", "plugged-in CA directory (ca-cert.pem ca-key.pem cert-chain.pem root-cert.pem, or tls.crt tls.key ca.crt); unset = self-signed root in --state-dir")
	fs.StringVar(&f.stateDir, "state-dir", caserver.DefaultStateDir, "directory of the self-signed root (key mode 0600); root-cert.pem is written here for clients")
	fs.StringVar(&f.rootKeyType, "root-key-type", string(caserver.DefaultRootKeyType), "self-signed root key: ec-p256 | ec-p384 | rsa-2048 | rsa-3072 | rsa-4096")
	fs.DurationVar(&f.defaultTTL, "default-ttl", caserver.DefaultTTL, "workload certificate TTL when the request asks for none")
	fs.DurationVar(&f.maxTTL, "max-ttl", caserver.DefaultMaxTTL, "longest workload certificate TTL; longer requests are refused")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig for TokenReview authentication (in-cluster config when running in a pod)")
	fs.StringSliceVar(&f.tokenAudiences, "token-audiences", []string{caserver.DefaultTokenAudience}, "audiences a service-account token must carry")
	fs.StringVar(&f.jwtIssuer, "jwt-issuer", "", "issuer URL for offline JWT authentication (JWKS from its OIDC discovery unless --jwks-file)")
	fs.StringVar(&f.jwksFile, "jwks-file", "", "JWKS file for offline JWT authentication")
	fs.StringVar(&f.monitoringListen, "monitoring-listen", caserver.DefaultMonitoringListen, "address of /metrics /healthz /readyz (empty disables)")
	fs.StringSliceVar(&f.servingDNS, "serving-dns-names", nil, "extra DNS SANs of the CA's serving certificate (localhost, istiod.istio-system.svc and 127.0.0.1 are always present)")
	fs.Float64Var(&f.rateLimit, "rate-limit", 0, "per-caller CreateCertificate requests per second (0 = unlimited); excess gets ResourceExhausted")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug | info | warn | error")
	fs.BoolVar(&f.pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on --monitoring-listen (performance work; keep that listener private)")
	fs.BoolVar(&f.kubeCASecret, "kube-ca-secret", false, "keep the CA in the Secret meshid-ca (or Istio's cacerts) of --namespace, elect a leader with a Lease, and publish the istio-ca-root-cert ConfigMap to every namespace (needs a Kubernetes client)")
	fs.StringVar(&f.namespace, "namespace", caserver.DefaultNamespace, "the CA's own namespace (env POD_NAMESPACE)")
	fs.StringVar(&f.podName, "pod-name", "", "this replica's identity for leader election (env POD_NAME; default the hostname)")
}

// serverConfig turns the parsed flags in fs, with lookup's istiod
// environment as fallbacks for flags not set, into a caserver.Config
// (Logger and metrics left to the caller).
func serverConfig(fs *pflag.FlagSet, f *serverFlags, lookup cli.Lookup) (caserver.Config, error) {
	if err := serverEnvDefaults(fs, lookup); err != nil {
		return caserver.Config{}, err
	}
	td, err := spiffeid.TrustDomainFromString(f.trustDomain)
	if err != nil {
		return caserver.Config{}, fmt.Errorf("--trust-domain: %w", err)
	}
	keyType, err := certs.ParseKeyType(f.rootKeyType)
	if err != nil {
		return caserver.Config{}, fmt.Errorf("--root-key-type: %w", err)
	}
	return caserver.Config{
		Listen:           f.listen,
		TrustDomain:      td,
		CADir:            f.caDir,
		StateDir:         f.stateDir,
		RootKeyType:      keyType,
		DefaultTTL:       f.defaultTTL,
		MaxTTL:           f.maxTTL,
		ServingDNS:       f.servingDNS,
		RateLimit:        f.rateLimit,
		Kubeconfig:       f.kubeconfig,
		KubeCASecret:     f.kubeCASecret,
		Namespace:        f.namespace,
		PodName:          f.podName,
		TokenAudiences:   f.tokenAudiences,
		JWTIssuer:        f.jwtIssuer,
		JWKSFile:         f.jwksFile,
		MonitoringListen: f.monitoringListen,
		Pprof:            f.pprof,
	}, nil
}

// serverRun runs a CA built from cfg; tests replace it to see the Config.
type serverRun func(ctx context.Context, cfg caserver.Config) error

// runServer builds the CA from cfg and serves until ctx ends.
func runServer(ctx context.Context, cfg caserver.Config) error {
	// client-go (informers, leader election) logs through klog.
	klog.SetSlogLogger(cfg.Logger.With("component", "client-go"))
	cfg.Registerer = prometheus.NewRegistry()
	s, err := caserver.New(cfg)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

func newServerCmd(run serverRun) *cobra.Command {
	f := &serverFlags{}
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the certificate authority (istio.v1.auth.IstioCertificateService)",
		Long: `meshid server is an Istio-compatible CA. It serves CreateCertificate over
TLS, authenticates callers with Kubernetes service-account tokens (TokenReview
or offline JWT) or a client certificate it issued, and signs only the SPIFFE
identity the caller proved.

Environment fallbacks (istiod names): DEFAULT_WORKLOAD_CERT_TTL,
MAX_WORKLOAD_CERT_TTL, TOKEN_AUDIENCES, ROOT_CA_DIR, TRUST_DOMAIN,
POD_NAMESPACE, POD_NAME.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := serverConfig(cmd.Flags(), f, cli.Env)
			if err != nil {
				return err
			}
			if cfg.Logger, err = cli.NewLogger(cmd.ErrOrStderr(), f.logLevel); err != nil {
				return err
			}
			return run(cmd.Context(), cfg)
		},
	}
	f.register(cmd.Flags())
	return cmd
}
