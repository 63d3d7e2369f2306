package caserver

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"sync"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/server"
	"github.com/meshid/meshid/internal/monitor"
)

// Server is an assembled CA. With a plugged-in or self-signed root it is
// complete after New; with KubeCASecret, Run first waits for the CA Secret
// (created by the elected leader) and builds the authority from it.
type Server struct {
	cfg     Config
	log     *slog.Logger
	kc      kubernetes.Interface // nil without a cluster
	kube    *kubeStack           // nil without KubeCASecret
	monitor *monitor.Server      // nil when disabled

	mu        sync.Mutex
	authority *ca.Authority
	grpc      *server.Server
	jwt       *authn.JWT // nil without offline JWT; Run refreshes its keys
}

// New validates cfg, applies its defaults and builds the CA. It binds no
// address: Listen or Run does.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, kc: cfg.KubeClient}
	if s.kc == nil {
		if s.kc, err = kubeClient(cfg.Kubeconfig); err != nil {
			return nil, err
		}
	}
	if cfg.MonitoringListen != "" {
		s.monitor, err = monitor.New(monitor.Config{
			Listen:   cfg.MonitoringListen,
			Gatherer: cfg.Gatherer,
			Ready:    s.Ready,
			Handlers: pprofHandlers(cfg.Pprof),
			Logger:   cfg.Logger,
		})
		if err != nil {
			return nil, err
		}
	}
	switch {
	case cfg.Bundle != nil:
		return s, s.build(cfg.Bundle)
	case cfg.CADir != "":
		b, err := keystore.LoadDir(cfg.CADir, cfg.Clock.Now())
		if err != nil {
			return nil, err
		}
		return s, s.build(b)
	case s.kc != nil && cfg.KubeCASecret:
		s.kube, err = newKubeStack(cfg, s.kc)
		return s, err
	case cfg.KubeCASecret:
		return nil, errors.New("caserver: KubeCASecret needs a Kubernetes client (--kubeconfig or in-cluster config)")
	default:
		b, err := keystore.LoadOrCreateSelfSigned(keystore.SelfSignedConfig{
			Dir: cfg.StateDir, TrustDomain: cfg.TrustDomain.Name(), KeyType: cfg.RootKeyType, Clock: cfg.Clock,
		})
		if err != nil {
			return nil, err
		}
		return s, s.build(b)
	}
}

// build creates the authority, the authenticators and the gRPC server on
// the CA material b.
func (s *Server) build(b *keystore.Bundle) error {
	cfg := s.cfg
	authority, err := ca.New(ca.Config{
		TrustDomain: cfg.TrustDomain,
		Bundle:      b,
		DefaultTTL:  cfg.DefaultTTL,
		MaxTTL:      cfg.MaxTTL,
		Clock:       cfg.Clock,
		Logger:      cfg.Logger,
		Registerer:  cfg.Registerer,
	})
	if err != nil {
		return err
	}
	auths, jwt, err := s.authenticators(authority)
	if err != nil {
		return err
	}
	grpcSrv, err := server.New(server.Config{
		Authority:     authority,
		Authenticator: authn.NewChain(append(auths, cfg.ExtraAuthenticators...)...),
		Listen:        cfg.Listen,
		ServingDNS:    cfg.ServingDNS,
		ServingTTL:    cfg.ServingTTL,
		RateLimit:     cfg.RateLimit,
		RateBurst:     cfg.RateBurst,
		Clock:         cfg.Clock,
		Logger:        cfg.Logger,
		Registerer:    cfg.Registerer,
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.authority, s.grpc, s.jwt = authority, grpcSrv, jwt
	s.mu.Unlock()
	return nil
}

// authenticators returns the configured authenticators in the order they are
// tried: TokenReview, offline JWT, then a client certificate this CA issued.
func (s *Server) authenticators(authority *ca.Authority) ([]authn.Authenticator, *authn.JWT, error) {
	cfg := s.cfg
	var (
		out []authn.Authenticator
		jwt *authn.JWT
	)
	if s.kc != nil {
		tr, err := authn.NewTokenReview(authn.TokenReviewConfig{
			Client:     s.kc,
			Audiences:  cfg.TokenAudiences,
			Logger:     cfg.Logger,
			Registerer: cfg.Registerer,
		})
		if err != nil {
			return nil, nil, err
		}
		out = append(out, tr)
	}
	if cfg.JWKSFile != "" || cfg.JWTIssuer != "" {
		j, err := authn.NewJWT(authn.JWTConfig{
			Issuer:     cfg.JWTIssuer,
			Audiences:  cfg.TokenAudiences,
			JWKSFile:   cfg.JWKSFile,
			Clock:      cfg.Clock,
			Logger:     cfg.Logger,
			Registerer: cfg.Registerer,
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
		Clock: cfg.Clock,
	})
	if err != nil {
		return nil, nil, err
	}
	out = append(out, cc)
	if s.kc == nil && cfg.JWKSFile == "" && cfg.JWTIssuer == "" && len(cfg.ExtraAuthenticators) == 0 {
		s.log.Warn("no token authenticator configured (--kubeconfig, --jwks-file or --jwt-issuer); only client-certificate renewals will be accepted")
	}
	return out, jwt, nil
}

// Authority returns the CA's authority; nil while Run waits for the
// Kubernetes CA Secret.
func (s *Server) Authority() *ca.Authority {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.authority
}

func (s *Server) grpcServer() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grpc
}

// Listen binds the gRPC and monitoring addresses, so that Addr and
// MonitoringAddr are known before Run. Run calls it when needed. With
// KubeCASecret the gRPC address is bound only by Run, once the CA exists.
func (s *Server) Listen() error {
	if g := s.grpcServer(); g != nil {
		if err := g.Listen(); err != nil {
			return err
		}
	}
	if s.monitor != nil {
		return s.monitor.Listen()
	}
	return nil
}

// Addr is the bound gRPC address, or nil before Listen.
func (s *Server) Addr() net.Addr {
	if g := s.grpcServer(); g != nil {
		return g.Addr()
	}
	return nil
}

// MonitoringAddr is the bound monitoring address, or nil before Listen or
// when monitoring is disabled.
func (s *Server) MonitoringAddr() net.Addr {
	if s.monitor == nil {
		return nil
	}
	return s.monitor.Addr()
}

// Ready is the CA's readiness (/readyz): nil once it serves, and, in a
// cluster, once the Kubernetes controller is ready.
func (s *Server) Ready() error {
	if s.kube != nil {
		if err := s.kube.ready(); err != nil {
			return err
		}
	}
	g := s.grpcServer()
	if g == nil {
		return errors.New("caserver: waiting for the CA Secret")
	}
	return g.Ready()
}

// Run serves until ctx ends or a component fails.
func (s *Server) Run(ctx context.Context) error {
	if s.monitor != nil {
		if err := s.monitor.Listen(); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, ctx := errgroup.WithContext(ctx)
	// fail stops what already runs and returns err.
	fail := func(err error) error {
		cancel()
		_ = g.Wait()
		return err
	}
	if s.monitor != nil {
		g.Go(func() error { return s.monitor.Run(ctx) })
	}
	if s.kube != nil {
		g.Go(func() error { return s.kube.run(ctx) })
		b, err := s.kube.waitForBundle(ctx, s.log, s.cfg.Namespace)
		if err == nil {
			err = s.build(b)
		}
		if err != nil {
			return fail(err)
		}
		s.kube.attach(s.Authority())
	}
	grpcSrv := s.grpcServer()
	if err := grpcSrv.Listen(); err != nil {
		return fail(err)
	}
	g.Go(func() error { return grpcSrv.Run(ctx) })
	s.mu.Lock()
	jwt := s.jwt
	s.mu.Unlock()
	if jwt != nil {
		g.Go(func() error { return jwt.Run(ctx) })
	}
	attrs := []any{"grpc", grpcSrv.Addr().String(), "trust_domain", s.cfg.TrustDomain.Name()}
	if s.monitor != nil {
		attrs = append(attrs, "monitoring", s.monitor.Addr().String())
	}
	s.log.Info("meshid CA serving", attrs...)
	return g.Wait()
}
