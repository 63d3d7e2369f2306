package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/monitor"
	"github.com/meshid/meshid/sds"
	"github.com/meshid/meshid/sds/caclient"
	"github.com/meshid/meshid/sds/secretcache"
)

// agentFlags are the flags of `meshid agent` (DESIGN.md section 2).
type agentFlags struct {
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
}

func (f *agentFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.caAddr, "ca-addr", "127.0.0.1:15012", "address of the CA's CreateCertificate API")
	fs.StringVar(&f.caRoot, "ca-root", "", "PEM roots that verify the CA's serving certificate")
	fs.StringVar(&f.tokenFile, "token-file", "./var/run/secrets/tokens/istio-token", "service-account token, re-read for every CA request")
	fs.StringVar(&f.sdsSocket, "sds-socket", "./var/run/secrets/workload-spiffe-uds/socket", "Unix socket to serve Envoy SDS on")
	fs.BoolVar(&f.socketGroup, "sds-socket-group", false, "make the SDS socket 0660 instead of 0600 so the group can connect")
	fs.DurationVar(&f.certTTL, "cert-ttl", 24*time.Hour, "requested workload certificate TTL")
	fs.Float64Var(&f.graceRatio, "grace-ratio", 0.5, "renew after this fraction of the certificate lifetime")
	fs.Float64Var(&f.jitter, "grace-ratio-jitter", 0.01, "± fraction of the lifetime by which renewal moves at random")
	fs.StringVar(&f.keyType, "key-type", "ec-p256", "workload key: ec-p256 | ec-p384 | rsa-2048 | rsa-3072")
	fs.StringVar(&f.monitoringListen, "monitoring-listen", "127.0.0.1:15020", "address of /metrics /healthz /readyz (empty disables)")
	fs.StringVar(&f.trustDomain, "trust-domain", "cluster.local", "SPIFFE trust domain of the workload identity")
	fs.StringVar(&f.clusterID, "cluster-id", "", "ClusterID sent in CSR metadata")
	fs.StringVar(&f.namespace, "namespace", "", "workload namespace when the token carries no kubernetes.io claims")
	fs.StringVar(&f.serviceAccount, "service-account", "", "workload service account when the token carries no kubernetes.io claims")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug | info | warn | error")
}

// applyEnv honours istio-agent's environment names as fallbacks for flags
// the user did not set (REFERENCE.md), so operators can swap agents.
func (f *agentFlags) applyEnv(fs *pflag.FlagSet) error {
	if err := envDefaults(fs,
		[2]string{"ca-addr", "CA_ADDR"},
		[2]string{"ca-root", "CA_ROOT_CA"},
		[2]string{"trust-domain", "TRUST_DOMAIN"},
		[2]string{"cert-ttl", "SECRET_TTL"},
		[2]string{"grace-ratio", "SECRET_GRACE_PERIOD_RATIO"},
		[2]string{"grace-ratio-jitter", "SECRET_GRACE_PERIOD_RATIO_JITTER"},
		[2]string{"cluster-id", "ISTIO_META_CLUSTER_ID"},
		[2]string{"namespace", "POD_NAMESPACE"},
		[2]string{"service-account", "SERVICE_ACCOUNT"},
	); err != nil {
		return err
	}
	if fs.Changed("key-type") {
		return nil
	}
	// ECC_SIGNATURE_ALGORITHM=ECDSA selects EC keys (ECC_CURVE P256|P384);
	// otherwise istio-agent uses RSA of WORKLOAD_RSA_KEY_SIZE bits.
	switch {
	case strings.EqualFold(os.Getenv("ECC_SIGNATURE_ALGORITHM"), "ECDSA"):
		if strings.EqualFold(os.Getenv("ECC_CURVE"), "P384") {
			f.keyType = string(certs.ECP384)
		} else {
			f.keyType = string(certs.ECP256)
		}
	case os.Getenv("WORKLOAD_RSA_KEY_SIZE") != "":
		f.keyType = "rsa-" + os.Getenv("WORKLOAD_RSA_KEY_SIZE")
	}
	return nil
}

func newAgentCmd() *cobra.Command {
	f := &agentFlags{}
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent: key, CSR, cache, rotation, and Envoy SDS on a Unix socket",
		Long: `meshid agent is the SecretManager beside the proxies. It serves Envoy SDS
(default, ROOTCA, file-cert:<cert>~<key>, file-root:<path>) on a Unix socket,
gets certificates from the CA with the workload's service-account token, and
rotates them before they expire.

Environment fallbacks (istio-agent names): CA_ADDR, CA_ROOT_CA, TRUST_DOMAIN,
SECRET_TTL, SECRET_GRACE_PERIOD_RATIO, SECRET_GRACE_PERIOD_RATIO_JITTER,
ECC_SIGNATURE_ALGORITHM, ECC_CURVE, WORKLOAD_RSA_KEY_SIZE,
ISTIO_META_CLUSTER_ID, POD_NAMESPACE, SERVICE_ACCOUNT.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.applyEnv(cmd.Flags()); err != nil {
				return err
			}
			logger, err := newLogger(cmd.ErrOrStderr(), f.logLevel)
			if err != nil {
				return err
			}
			a, err := buildAgent(f, prometheus.NewRegistry(), logger)
			if err != nil {
				return err
			}
			return a.run(cmd.Context())
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// agentStack is a wired agent.
type agentStack struct {
	client  *caclient.Client
	cache   *secretcache.Manager
	sds     *sds.Server
	monitor *monitor.Server
	logger  *slog.Logger
}

func buildAgent(f *agentFlags, reg *prometheus.Registry, logger *slog.Logger) (*agentStack, error) {
	td, err := spiffeid.TrustDomainFromString(f.trustDomain)
	if err != nil {
		return nil, fmt.Errorf("--trust-domain: %w", err)
	}
	keyType, err := certs.ParseKeyType(f.keyType)
	if err != nil {
		return nil, fmt.Errorf("--key-type: %w", err)
	}
	if f.caRoot == "" {
		return nil, fmt.Errorf("--ca-root is required: the agent only talks to a CA it can verify")
	}
	rootPEM, err := os.ReadFile(f.caRoot)
	if err != nil {
		return nil, fmt.Errorf("--ca-root: %w", err)
	}
	roots, err := certs.ParseCertificates(rootPEM)
	if err != nil {
		return nil, fmt.Errorf("--ca-root %s: %w", f.caRoot, err)
	}
	id, err := agentIdentity(f, td)
	if err != nil {
		return nil, err
	}
	client, err := caclient.New(caclient.Config{
		Addr:       f.caAddr,
		Roots:      roots,
		TokenFile:  f.tokenFile,
		ClusterID:  f.clusterID,
		Logger:     logger,
		Registerer: reg,
	})
	if err != nil {
		return nil, err
	}
	jitter := f.jitter
	if jitter == 0 {
		jitter = -1 // the flag's 0 means none; secretcache's 0 means its default
	}
	cache, err := secretcache.New(secretcache.Config{
		Signer:     client,
		ID:         id,
		KeyType:    keyType,
		TTL:        f.certTTL,
		GraceRatio: f.graceRatio,
		Jitter:     jitter,
		Logger:     logger,
		Registerer: reg,
	})
	if err != nil {
		return nil, err
	}
	mode := os.FileMode(0o600)
	if f.socketGroup {
		mode = 0o660
	}
	srv, err := sds.New(sds.Config{
		Source:     cache,
		SocketPath: f.sdsSocket,
		SocketMode: mode,
		Logger:     logger,
		Registerer: reg,
	})
	if err != nil {
		return nil, err
	}
	a := &agentStack{client: client, cache: cache, sds: srv, logger: logger}
	if f.monitoringListen != "" {
		a.monitor, err = monitor.New(monitor.Config{
			Listen:   f.monitoringListen,
			Gatherer: reg,
			Ready:    cache.Ready,
			Logger:   logger,
			Handlers: map[string]http.Handler{"/debug/rotate": rotateHandler(cache)},
		})
		if err != nil {
			return nil, err
		}
	}
	return a, nil
}

// agentIdentity derives the workload identity from the token's kubernetes.io
// claims, or from --namespace/--service-account when the token has none.
func agentIdentity(f *agentFlags, td spiffeid.TrustDomain) (spiffeid.ID, error) {
	if f.namespace != "" && f.serviceAccount != "" {
		return spiffeid.FromSegments(td, "ns", f.namespace, "sa", f.serviceAccount)
	}
	tok, err := os.ReadFile(f.tokenFile)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("--token-file: %w", err)
	}
	id, err := secretcache.IdentityFromToken(strings.TrimSpace(string(tok)), td)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("--token-file %s: %w", f.tokenFile, err)
	}
	return id, nil
}

// rotateHandler forces a renewal of `default` (POST only); meshid bench sds
// --rotate uses it to time a rotation across many streams.
func rotateHandler(cache *secretcache.Manager) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		if err := cache.Rotate(r.Context()); err != nil {
			http.Error(w, "rotate: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "rotated")
	})
}

func (a *agentStack) run(ctx context.Context) error {
	defer a.client.Close()
	if err := a.sds.Listen(); err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.cache.Run(ctx) })
	g.Go(func() error { return a.sds.Run(ctx) })
	attrs := []any{"sds_socket", a.sds.SocketPath(), "identity", a.cache.ID().String()}
	if a.monitor != nil {
		if err := a.monitor.Listen(); err != nil {
			return err
		}
		g.Go(func() error { return a.monitor.Run(ctx) })
		attrs = append(attrs, "monitoring", a.monitor.Addr().String())
	}
	// Fetch the workload certificate at once, so the first proxy does not
	// wait for a CSR; failures are retried by the cache's scheduler.
	g.Go(func() error {
		if _, err := a.cache.Secret(ctx, secretcache.DefaultName); err != nil && ctx.Err() == nil {
			a.logger.Warn("first certificate not obtained yet; retrying", "err", err)
		}
		return nil
	})
	a.logger.Info("meshid agent serving", attrs...)
	return g.Wait()
}
