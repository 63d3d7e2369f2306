package main

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/authn/boundtoken"
	"github.com/meshid/meshid/ca/caserver"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/ca/jwtkeys"
	"github.com/meshid/meshid/ca/keystore/pkcs11"
	"github.com/meshid/meshid/ca/kube/podcert"
	"github.com/meshid/meshid/ca/kube/rootpublisher"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/ca/nodeauth"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/cmd/internal/cli"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/reachability"
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
	logFormat        string
	pprof            bool
	kubeCASecret     bool
	podCertSigner    string
	podCertRefresh   float64
	namespace        string
	podName          string

	caKey               string
	capTTLToToken       bool
	maxTokenLifetime    time.Duration
	tokenReviewIssuers  []string
	tokenVerification   string
	maxConnections      int
	maxConnectionsPerIP int
	firstRequestTimeout time.Duration
	apiServerGrace      time.Duration
	servingTTL          time.Duration
	jwtSVIDTTL          time.Duration
	jwtKeyLifetime      time.Duration
	kubeQPS             float32
	kubeBurst           int
	publishRootCM       bool
	rootCMNamespaces    string
	trustedNodeAccounts string
	cluster             clusterFlags
	rotation            rotationFlags
	upstream            upstreamFlags
	federation          federationFlags
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
	fs.StringVar(&f.logFormat, "log-format", "text", cli.LogFormatUsage)
	fs.BoolVar(&f.pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on --monitoring-listen (performance work; keep that listener private)")
	fs.BoolVar(&f.kubeCASecret, "kube-ca-secret", false, "keep the CA in the Secret meshid-ca (or Istio's cacerts; with --upstream, meshid-ca-upstream, which the leader mints) of --namespace, elect a leader with a Lease, and publish the istio-ca-root-cert ConfigMap to every namespace (needs a Kubernetes client)")
	fs.StringVar(&f.podCertSigner, "pod-certificate-signer", "", "sign Kubernetes PodCertificateRequests of this signer name (e.g. meshid.io/workload) and publish the roots as its ClusterTrustBundle; empty = off (docs/pod-certificates.md; needs a Kubernetes client)")
	fs.Float64Var(&f.podCertRefresh, "pod-certificate-refresh-ratio", podcert.DefaultGraceRatio, "with --pod-certificate-signer, the fraction of a pod certificate's lifetime at which the kubelet is told to refresh it (status.beginRefreshAt, ±1%), in (0,1); kept inside the API server's bounds, at least 10 minutes after notBefore and before notAfter")
	fs.StringVar(&f.namespace, "namespace", caserver.DefaultNamespace, "the CA's own namespace (env POD_NAMESPACE)")
	fs.StringVar(&f.podName, "pod-name", "", "this replica's identity for leader election (env POD_NAME; default the hostname and a random suffix)")
	f.registerHardening(fs)
	f.cluster.register(fs)
	f.rotation.register(fs)
	f.upstream.register(fs)
	f.federation.register(fs)
}

// registerHardening adds the flags of the limits in SECURITY.md, the CA key
// module, and the Kubernetes clients and publisher.
func (f *serverFlags) registerHardening(fs *pflag.FlagSet) {
	fs.StringVar(&f.trustedNodeAccounts, "trusted-node-accounts", "", "ambient: NS/SA,... of node agents (ztunnel) that may impersonate the pods on their node (env CA_TRUSTED_NODE_ACCOUNTS; empty = off)")
	fs.StringVar(&f.caKey, "ca-key", "", "CA signing key in a PKCS#11 module (RFC 7512 URI: pkcs11:token=...;object=...?module-path=...&pin-source=...); certificates still come from --ca-dir or --state-dir; with --upstream, object= is the label of a new key created for each intermediate (no id=). Unset = ca-key.pem")
	fs.BoolVar(&f.capTTLToToken, "cap-ttl-to-token", false, "never sign a token-proved leaf past the token's expiry (off, as Istio; see SECURITY.md)")
	fs.DurationVar(&f.maxTokenLifetime, "max-token-lifetime", authn.DefaultMaxTokenLifetime, "longest accepted offline JWT lifetime past its iat (negative = no bound)")
	fs.StringSliceVar(&f.tokenReviewIssuers, "tokenreview-issuers", nil, "issuers whose tokens TokenReview judges when --kubeconfig and offline JWT are both set (empty = every token)")
	fs.StringVar(&f.tokenVerification, "token-verification", string(boundtoken.DefaultMode), "who verifies the cluster's bound service-account tokens: auto (in the CA once the issuer's keys are discovered and the pod and service-account informers synced, TokenReview until then) | local | tokenreview (see SECURITY.md)")
	fs.IntVar(&f.maxConnections, "max-connections", certservice.DefaultMaxConnections, "connections open at once on --listen")
	fs.IntVar(&f.maxConnectionsPerIP, "max-connections-per-ip", certservice.DefaultMaxConnectionsPerIP, "connections open at once from one peer IP")
	fs.DurationVar(&f.firstRequestTimeout, "first-request-timeout", certservice.DefaultFirstRequestTimeout, "close a connection on which no call has authenticated by then (TLS handshake included; calls without credentials do not count)")
	fs.DurationVar(&f.apiServerGrace, "apiserver-readiness-grace", reachability.DefaultGrace, "with a Kubernetes client, /readyz says not ready once the API server has not answered the CA's probe (its GET /readyz, every 5s) for this long, unless local token verification has synced; a replica never answered since its start is not ready (negative = no check)")
	fs.DurationVar(&f.servingTTL, "serving-ttl", certservice.DefaultServingTTL, "lifetime of the CA's own serving certificate (independent of --max-ttl)")
	fs.DurationVar(&f.jwtSVIDTTL, "jwt-svid-ttl", jwtissuer.DefaultTTL, "lifetime of the JWT-SVIDs the CA mints (at most 1h)")
	fs.DurationVar(&f.jwtKeyLifetime, "jwt-key-lifetime", jwtkeys.DefaultLifetime, "how long one JWT-SVID signing key signs, and is published before it does (10m to 720h)")
	fs.Float32Var(&f.kubeQPS, "kube-qps", kubeclient.DefaultQPS, "TokenReview requests per second to the API server (client-side limit; see docs/guide/authentication.md to size it)")
	fs.IntVar(&f.kubeBurst, "kube-burst", kubeclient.DefaultBurst, "TokenReview burst above --kube-qps")
	fs.BoolVar(&f.publishRootCM, "publish-root-configmap", true, "with a Kubernetes client, elect a leader that publishes istio-ca-root-cert to the selected namespaces (false where istiod still publishes it)")
	fs.StringVar(&f.rootCMNamespaces, "root-configmap-namespaces", rootpublisher.DefaultNamespaceSelector, "label selector of the namespaces that get istio-ca-root-cert (empty = all)")
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
	cfg := caserver.Config{
		Listen:      f.listen,
		TrustDomain: td,
		CADir:       f.caDir,
		StateDir:    f.stateDir,
		RootKeyType: keyType,
		Issuance: caserver.IssuanceConfig{
			DefaultTTL:    f.defaultTTL,
			MaxTTL:        f.maxTTL,
			CapTTLToToken: f.capTTLToToken,
		},
		Serving: caserver.ServingConfig{
			DNSNames: f.servingDNS,
			CertTTL:  f.servingTTL,
		},
		Limits: caserver.LimitsConfig{
			Rate:                f.rateLimit,
			MaxConnections:      f.maxConnections,
			MaxConnectionsPerIP: f.maxConnectionsPerIP,
			FirstRequestTimeout: f.firstRequestTimeout,
		},
		Kube: caserver.KubeConfig{
			Kubeconfig:            f.kubeconfig,
			PodCertificateSigner:  f.podCertSigner,
			PodCertificateRefresh: f.podCertRefresh,
			Namespace:             f.namespace,
			PodName:               f.podName,
			APIServerGrace:        f.apiServerGrace,
			QPS:                   f.kubeQPS,
			Burst:                 f.kubeBurst,
			DisableRootConfigMap:  !f.publishRootCM,
		},
		KubeCASecret: f.kubeCASecret,
		Authn: caserver.AuthnConfig{
			TokenAudiences:     f.tokenAudiences,
			JWTIssuer:          f.jwtIssuer,
			JWKSFile:           f.jwksFile,
			MaxTokenLifetime:   f.maxTokenLifetime,
			TokenReviewIssuers: f.tokenReviewIssuers,
		},
		Monitoring: caserver.MonitoringConfig{
			Listen: f.monitoringListen,
			Pprof:  f.pprof,
		},

		JWT: caserver.JWTConfig{
			SVIDTTL:     f.jwtSVIDTTL,
			KeyLifetime: f.jwtKeyLifetime,
		},
	}
	if v, ok := lookup("GOGC"); ok && v != "" {
		cfg.Runtime.GCPercent = -1 // the runtime applied the operator's GOGC: caserver keeps it
	}
	if err := f.applyParsed(&cfg); err != nil {
		return caserver.Config{}, err
	}
	return cfg, nil
}

// applyParsed sets cfg's fields parsed from strings, and the flag groups'.
func (f *serverFlags) applyParsed(cfg *caserver.Config) (err error) {
	if cfg.Authn.TokenVerification, err = boundtoken.ParseMode(f.tokenVerification); err != nil {
		return fmt.Errorf("--token-verification: %w", err)
	}
	f.rotation.apply(cfg)
	if cfg.Kube.PodCertificateSigner != "" {
		if err := podcert.ValidateSignerName(cfg.Kube.PodCertificateSigner); err != nil {
			return fmt.Errorf("--pod-certificate-signer: %w", err)
		}
	}
	if r := cfg.Kube.PodCertificateRefresh; !(r > 0 && r < 1) {
		return fmt.Errorf("--pod-certificate-refresh-ratio %v is not in (0,1)", r)
	}
	if cfg.Kube.RootConfigMapNamespaces, err = labels.Parse(f.rootCMNamespaces); err != nil {
		return fmt.Errorf("--root-configmap-namespaces: %w", err)
	}
	if cfg.Authn.TrustedNodeAccounts, err = nodeauth.ParseTrustedAccounts(f.trustedNodeAccounts); err != nil {
		return fmt.Errorf("--trusted-node-accounts: %w", err)
	}
	if err := f.cluster.apply(cfg); err != nil {
		return err
	}
	if err := f.upstream.apply(cfg); err != nil {
		return err
	}
	if err := f.federation.apply(cfg); err != nil {
		return err
	}
	if cfg.CAKey, err = pkcs11.ParseOptionalURI(f.caKey); err != nil {
		return fmt.Errorf("--ca-key: %w", err)
	}
	return nil
}

// serverRun runs a CA built from cfg; tests replace it to see the Config.
type serverRun func(ctx context.Context, cfg caserver.Config) error

// runServer builds the CA from cfg and serves until ctx ends.
func runServer(ctx context.Context, cfg caserver.Config) error {
	// client-go (informers, leader election) logs through klog.
	klog.SetSlogLogger(cfg.Logger.With(logs.KeyComponent, "client-go"))
	cfg.Registerer = prometheus.NewRegistry()
	if err := caserver.CheckListen(cfg.Listen); err != nil {
		return err
	}
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
POD_NAMESPACE, POD_NAME, CA_TRUSTED_NODE_ACCOUNTS, CLUSTER_ID.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := serverConfig(cmd.Flags(), f, cli.Env)
			if err != nil {
				return err
			}
			logger, logOut, err := cli.NewBufferedLogger(cmd.ErrOrStderr(), f.logLevel, f.logFormat)
			if err != nil {
				return err
			}
			defer logOut.Flush()
			cfg.Logger = logger
			return run(cmd.Context(), cfg)
		},
	}
	f.register(cmd.Flags())
	return cmd
}
