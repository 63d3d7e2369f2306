package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/server"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/monitor"
)

// serverFlags are the flags of `meshid server` (DESIGN.md section 2).
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
	kube             kubeFlags
}

func newServerCmd() *cobra.Command {
	f := &serverFlags{}
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the certificate authority (istio.v1.auth.IstioCertificateService)",
		Long: `meshid server is an Istio-compatible CA. It serves CreateCertificate over
TLS, authenticates callers with Kubernetes service-account tokens (TokenReview
or offline JWT) or a client certificate it issued, and signs only the SPIFFE
identity the caller proved.

Environment fallbacks (istiod names): DEFAULT_WORKLOAD_CERT_TTL,
MAX_WORKLOAD_CERT_TTL, TOKEN_AUDIENCES, ROOT_CA_DIR, TRUST_DOMAIN.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := envDefaults(cmd.Flags(),
				[2]string{"default-ttl", "DEFAULT_WORKLOAD_CERT_TTL"},
				[2]string{"max-ttl", "MAX_WORKLOAD_CERT_TTL"},
				[2]string{"token-audiences", "TOKEN_AUDIENCES"},
				[2]string{"ca-dir", "ROOT_CA_DIR"},
				[2]string{"trust-domain", "TRUST_DOMAIN"},
				[2]string{"namespace", "POD_NAMESPACE"},
				[2]string{"pod-name", "POD_NAME"},
			); err != nil {
				return err
			}
			logger, err := newLogger(cmd.ErrOrStderr(), f.logLevel)
			if err != nil {
				return err
			}
			// client-go (informers, leader election) logs through klog.
			klog.SetSlogLogger(logger.With("component", "client-go"))
			reg := prometheus.NewRegistry()
			stack, err := buildCA(cmd.Context(), f, nil, reg, logger)
			if err != nil {
				return err
			}
			return stack.run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.listen, "listen", "127.0.0.1:15012", "address of the gRPC CSR API (always TLS)")
	fs.StringVar(&f.trustDomain, "trust-domain", "cluster.local", "SPIFFE trust domain of issued identities")
	fs.StringVar(&f.caDir, "ca-dir", "", "plugged-in CA directory (ca-cert.pem ca-key.pem cert-chain.pem root-cert.pem, or tls.crt tls.key ca.crt); unset = self-signed root in --state-dir")
	fs.StringVar(&f.stateDir, "state-dir", "./var/lib/meshid", "directory of the self-signed root (key mode 0600); root-cert.pem is written here for clients")
	fs.StringVar(&f.rootKeyType, "root-key-type", "ec-p256", "self-signed root key: ec-p256 | ec-p384 | rsa-2048 | rsa-3072 | rsa-4096")
	fs.DurationVar(&f.defaultTTL, "default-ttl", 24*time.Hour, "workload certificate TTL when the request asks for none")
	fs.DurationVar(&f.maxTTL, "max-ttl", 2160*time.Hour, "longest workload certificate TTL; longer requests are refused")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig for TokenReview authentication (in-cluster config when running in a pod)")
	fs.StringSliceVar(&f.tokenAudiences, "token-audiences", []string{"istio-ca"}, "audiences a service-account token must carry")
	fs.StringVar(&f.jwtIssuer, "jwt-issuer", "", "issuer URL for offline JWT authentication (JWKS from its OIDC discovery unless --jwks-file)")
	fs.StringVar(&f.jwksFile, "jwks-file", "", "JWKS file for offline JWT authentication")
	fs.StringVar(&f.monitoringListen, "monitoring-listen", "127.0.0.1:15014", "address of /metrics /healthz /readyz (empty disables)")
	fs.StringSliceVar(&f.servingDNS, "serving-dns-names", nil, "extra DNS SANs of the CA's serving certificate (localhost, istiod.istio-system.svc and 127.0.0.1 are always present)")
	fs.Float64Var(&f.rateLimit, "rate-limit", 0, "per-caller CreateCertificate requests per second (0 = unlimited); excess gets ResourceExhausted")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug | info | warn | error")
	fs.BoolVar(&f.pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on --monitoring-listen (performance work; keep that listener private)")
	f.kube.register(fs)
	return cmd
}

func newLogger(w interface{ Write([]byte) (int, error) }, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// caStack is a wired CA: the authority, its gRPC server, monitoring and,
// in a cluster, the Kubernetes controllers.
type caStack struct {
	authority *ca.Authority
	grpc      *server.Server
	monitor   *monitor.Server
	kube      *kubeStack
	jwt       *authn.JWT // nil without offline JWT; Run refreshes its keys
	logger    *slog.Logger
}

// buildCA turns server flags into running components. extra authenticators
// (dev mode's) are tried after the configured ones.
func buildCA(ctx context.Context, f *serverFlags, extra []authn.Authenticator, reg *prometheus.Registry, logger *slog.Logger) (*caStack, error) {
	td, err := spiffeid.TrustDomainFromString(f.trustDomain)
	if err != nil {
		return nil, fmt.Errorf("--trust-domain: %w", err)
	}
	keyType, err := certs.ParseKeyType(f.rootKeyType)
	if err != nil {
		return nil, fmt.Errorf("--root-key-type: %w", err)
	}
	kc, err := kubeClient(f.kubeconfig)
	if err != nil {
		return nil, err
	}

	var bundle *keystore.Bundle
	var ks *kubeStack
	switch {
	case f.caDir != "":
		if bundle, err = keystore.LoadDir(f.caDir, time.Now()); err != nil {
			return nil, err
		}
	case kc != nil && f.kube.caSecret:
		// The Kubernetes keystore loads (or, as leader, creates) the root
		// in a Secret; the authority is created once it has a bundle.
		if ks, bundle, err = startKubeKeystore(ctx, f, kc, td, keyType, reg, logger); err != nil {
			return nil, err
		}
	default:
		bundle, err = keystore.LoadOrCreateSelfSigned(keystore.SelfSignedConfig{
			Dir: f.stateDir, TrustDomain: td.Name(), KeyType: keyType,
		})
		if err != nil {
			return nil, err
		}
	}

	authority, err := ca.New(ca.Config{
		TrustDomain: td,
		Bundle:      bundle,
		DefaultTTL:  f.defaultTTL,
		MaxTTL:      f.maxTTL,
		Logger:      logger,
		Registerer:  reg,
	})
	if err != nil {
		return nil, err
	}

	auths, jwt, err := authenticators(f, kc, authority, reg, logger)
	if err != nil {
		return nil, err
	}
	auths = append(auths, extra...)

	grpcSrv, err := server.New(server.Config{
		Authority:     authority,
		Authenticator: authn.NewChain(auths...),
		Listen:        f.listen,
		ServingDNS:    f.servingDNS,
		RateLimit:     f.rateLimit,
		Logger:        logger,
		Registerer:    reg,
	})
	if err != nil {
		return nil, err
	}
	s := &caStack{authority: authority, grpc: grpcSrv, kube: ks, jwt: jwt, logger: logger}
	if ks != nil {
		ks.attach(authority)
	}
	if f.monitoringListen != "" {
		s.monitor, err = monitor.New(monitor.Config{
			Listen:   f.monitoringListen,
			Gatherer: reg,
			Ready:    s.ready,
			Handlers: pprofHandlers(f.pprof),
			Logger:   logger,
		})
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *caStack) ready() error {
	if s.kube != nil {
		if err := s.kube.ready(); err != nil {
			return err
		}
	}
	return s.grpc.Ready()
}

// authenticators returns the configured authenticators in the order they are
// tried: TokenReview, offline JWT, then a client certificate this CA issued.
func authenticators(f *serverFlags, kc kubernetes.Interface, authority *ca.Authority, reg prometheus.Registerer, logger *slog.Logger) ([]authn.Authenticator, *authn.JWT, error) {
	var (
		out []authn.Authenticator
		jwt *authn.JWT
	)
	if kc != nil {
		tr, err := authn.NewTokenReview(authn.TokenReviewConfig{
			Client:     kc,
			Audiences:  f.tokenAudiences,
			Logger:     logger,
			Registerer: reg,
		})
		if err != nil {
			return nil, nil, err
		}
		out = append(out, tr)
	}
	if f.jwksFile != "" || f.jwtIssuer != "" {
		j, err := authn.NewJWT(authn.JWTConfig{
			Issuer:     f.jwtIssuer,
			Audiences:  f.tokenAudiences,
			JWKSFile:   f.jwksFile,
			Logger:     logger,
			Registerer: reg,
		})
		if err != nil {
			return nil, nil, err
		}
		out, jwt = append(out, j), j
	}
	cc, err := authn.NewClientCert(authn.ClientCertConfig{
		TrustDomain: authority.TrustDomain(),
		Roots:       func() []*x509.Certificate { return authority.Bundle().Roots },
		// With a plugged intermediate CA, a client presenting only its leaf
		// still chains to the roots through the signing CA.
		Intermediates: func() []*x509.Certificate {
			b := authority.Bundle()
			return append([]*x509.Certificate{b.Cert}, b.Intermediates...)
		},
	})
	if err != nil {
		return nil, nil, err
	}
	out = append(out, cc)
	if kc == nil && f.jwksFile == "" && f.jwtIssuer == "" {
		logger.Warn("no token authenticator configured (--kubeconfig, --jwks-file or --jwt-issuer); only client-certificate renewals will be accepted")
	}
	return out, jwt, nil
}

// run serves until ctx ends or a component fails.
func (s *caStack) run(ctx context.Context) error {
	if err := s.grpc.Listen(); err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.grpc.Run(ctx) })
	attrs := []any{"grpc", s.grpc.Addr().String(), "trust_domain", s.authority.TrustDomain().Name()}
	if s.monitor != nil {
		if err := s.monitor.Listen(); err != nil {
			return err
		}
		g.Go(func() error { return s.monitor.Run(ctx) })
		attrs = append(attrs, "monitoring", s.monitor.Addr().String())
	}
	if s.kube != nil {
		g.Go(func() error { return s.kube.run(ctx) })
	}
	if s.jwt != nil {
		g.Go(func() error { return s.jwt.Run(ctx) })
	}
	s.logger.Info("meshid CA serving", attrs...)
	return g.Wait()
}
