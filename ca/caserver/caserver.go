package caserver

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/admin"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/authn/boundtoken"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/ca/cluster"
	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/ca/jwtkeys"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/keystore/pkcs11"
	"github.com/meshid/meshid/ca/kube/election"
	"github.com/meshid/meshid/ca/kube/jwtsecret"
	"github.com/meshid/meshid/ca/kube/podcert"
	"github.com/meshid/meshid/ca/nodeauth"
	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/internal/buildinfo"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/monitor"
	"github.com/meshid/meshid/internal/reachability"
)

// Server is an assembled CA. With a plugged-in or self-signed root it is
// complete after New; with KubeCASecret, Run first waits for the CA Secret
// (created by the elected leader) and builds the authority from it.
type Server struct {
	cfg     Config
	log     *slog.Logger
	kc      *kubeClients         // nil without a cluster
	kube    *kubeStack           // nil without a cluster, or with nothing to do there
	key     *pkcs11.Key          // nil unless CAKey; closed when Run returns
	node    *nodeauth.Authorizer // nil unless node mode
	router  *cluster.Router      // nil without a cluster; reviews tokens by ClusterID
	secrets *cluster.Watcher     // nil unless RemoteSecrets
	monitor *monitor.Server      // nil when disabled
	caDir   *keystore.DirWatcher // nil unless the CA comes from CADir
	admin   *admin.Server        // nil without AdminSocket
	jwtKeys jwtissuer.KeySource  // the JWT-SVID signing keys
	jwtKube *jwtsecret.Store     // nil without a cluster; the jwtKeys shared by the replicas
	fed     *federationParts     // nil without federation (federation.go)
	// apiserver tracks whether the local API server answers; nil without
	// a cluster or with APIServerGrace negative.
	apiserver *reachability.Tracker
	podCert   *podcert.Controller // nil unless PodCertificateSigner
	// upstream renews the intermediate; nil unless Config.Upstream.
	upstream       *upstream.Renewer
	upstreamMinted time.Time            // when New minted the intermediate; zero if loaded
	upstreamKeys   *upstream.ModuleKeys // the intermediates' keys with CAKey; nil otherwise
	// upKube keeps the upstream's intermediate in a Secret the replicas
	// share (Upstream with KubeCASecret, upstream_kube.go); nil otherwise.
	upKube *upstreamKube

	mu        sync.Mutex
	authority *ca.Authority
	rotation  *rotation.Manager // every new CA goes through it
	grpc      *certservice.Server
	jwt       *authn.JWT           // nil without offline JWT; Run refreshes its keys
	bound     *boundtoken.Verifier // nil unless local token verification; Run runs it
}

// CheckListen binds the gRPC address addr (DefaultListen if empty) and
// releases it: a command calls it before New, so that an address in use
// stops the CA before it logs or writes anything, with the flag that
// changes it. Listen binds it for good.
func CheckListen(addr string) error {
	addr = cmp.Or(addr, DefaultListen)
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("--listen %s: the address is in use (another meshid dev or server?): stop that process, or choose another address with --listen", addr)
	}
	if err != nil {
		return fmt.Errorf("--listen %s: %w", addr, err)
	}
	return ln.Close()
}

// New validates cfg, applies its defaults and builds the CA. It binds no
// address: Listen or Run does (CheckListen tells beforehand whether the
// gRPC address is free).
func New(cfg Config) (_ *Server, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	defer func() {
		if err != nil {
			s.closeKey()
		}
	}()
	if err := buildinfo.Register(cfg.Registerer); err != nil {
		return nil, err
	}
	if s.kc, err = newKubeClients(cfg); err != nil {
		return nil, err
	}
	if s.node, err = s.nodeAuthorizer(); err != nil {
		return nil, err
	}
	if s.router, err = s.clusterRouter(); err != nil {
		return nil, err
	}
	if s.secrets, err = s.remoteSecrets(); err != nil {
		return nil, err
	}
	if s.apiserver, err = s.apiServerTracker(); err != nil {
		return nil, err
	}
	if cfg.Monitoring.Listen != "" {
		s.monitor, err = monitor.New(monitor.Config{
			Listen:   cfg.Monitoring.Listen,
			Gatherer: cfg.Gatherer,
			Ready:    s.Ready,
			Handlers: pprofHandlers(cfg.Monitoring.Pprof),
			Logger:   cfg.Logger,
		})
		if err != nil {
			return nil, err
		}
	}
	if cfg.AdminSocket != "" {
		s.admin, err = admin.New(admin.Config{Socket: cfg.AdminSocket, Rotation: s.Rotation, Federation: s.Federation, Upstream: s.UpstreamStatus, Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
	}
	// The CA material before anything that writes state (JWT keys,
	// federation, a self-signed root's successor): a refused --ca-dir or
	// module key leaves the state directory as it was.
	var b *keystore.Bundle
	if !cfg.KubeCASecret {
		if b, err = s.loadBundle(); err != nil {
			return nil, err
		}
	}
	if err := s.newJWTKeys(); err != nil {
		return nil, err
	}
	if s.fed, err = s.newFederation(); err != nil {
		return nil, err
	}
	if s.podCert, err = s.podCertificates(); err != nil {
		return nil, err
	}
	if cfg.KubeCASecret {
		if s.kc == nil {
			return nil, errors.New("caserver: KubeCASecret needs a Kubernetes client (--kubeconfig or in-cluster config)")
		}
		if cfg.Bundle != nil || cfg.CADir != "" || cfg.CAKey != nil {
			return nil, errors.New("caserver: KubeCASecret keeps the CA in a Secret: it excludes a plugged-in CA directory and a module key")
		}
		if cfg.Upstream.URL != nil {
			if err := s.newUpstreamKube(); err != nil {
				return nil, err
			}
			return s, nil
		}
		s.kube, err = newKubeStack(cfg, s.kc.controllers, nil, nil)
		return s, err
	}
	var next *keystore.Bundle // a self-signed root or upstream intermediate prepared before a restart
	switch {
	case s.selfSigned():
		b, next, err = loadNext(cfg, cfg.StateDir, b)
	case cfg.Upstream.URL != nil:
		b, next, err = s.loadUpstreamNext(b)
	}
	if err == nil {
		err = s.build(b)
	}
	if err == nil {
		s.rotation, err = s.newRotation(context.Background(), b, next)
	}
	if err == nil {
		s.startUpstream(cmp.Or(next, b))
		s.caDir, err = s.caDirWatcher()
	}
	if err == nil && s.kc != nil && !cfg.Kube.DisableRootConfigMap {
		// Whatever holds the key, a CA with a cluster publishes its roots
		// (istio-ca-root-cert) from the elected leader, as istiod does.
		s.kube, err = newKubeStack(cfg, s.kc.controllers, s.authority, nil)
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

// loadBundle returns the CA material: given, plugged-in or self-signed, with
// the module key when CAKey is set.
func (s *Server) loadBundle() (*keystore.Bundle, error) {
	cfg := s.cfg
	if cfg.Bundle != nil {
		return cfg.Bundle, nil
	}
	if cfg.Upstream.URL != nil {
		return s.upstreamBundle()
	}
	if cfg.CAKey != nil {
		k, err := pkcs11.New(pkcs11.Config{URI: cfg.CAKey})
		if err != nil {
			return nil, fmt.Errorf("caserver: CA key: %w", err)
		}
		s.key = k
	}
	if cfg.CADir != "" {
		load := keystore.LoadDir
		if s.key != nil {
			load = func(dir string, now time.Time) (*keystore.Bundle, error) {
				return keystore.LoadDirSigner(dir, s.key, now)
			}
		}
		b, err := load(cfg.CADir, cfg.Clock.Now())
		if err != nil {
			return nil, fmt.Errorf("--ca-dir %s: %w", cfg.CADir, err)
		}
		return b, nil
	}
	sc := keystore.SelfSignedConfig{
		Dir: cfg.StateDir, TrustDomain: cfg.TrustDomain.Name(), KeyType: cfg.RootKeyType, Clock: cfg.Clock,
	}
	if s.key != nil {
		sc.Key = s.key
	}
	return keystore.LoadOrCreateSelfSigned(sc)
}

// nodeAuthorizer returns the node authorizer of TrustedNodeAccounts, or nil
// when node mode is off or there is no cluster to see pods in.
func (s *Server) nodeAuthorizer() (*nodeauth.Authorizer, error) {
	cfg := s.cfg
	if len(cfg.Authn.TrustedNodeAccounts) == 0 {
		return nil, nil
	}
	if s.kc == nil {
		s.log.Warn("trusted node accounts are configured but there is no Kubernetes client to see their pods: every impersonation will be refused", logs.KeyAccounts, len(cfg.Authn.TrustedNodeAccounts))
		return nil, nil
	}
	return nodeauth.New(nodeauth.Config{
		TrustedAccounts: cfg.Authn.TrustedNodeAccounts,
		Client:          s.kc.controllers,
		TrustDomain:     cfg.TrustDomain,
		Logger:          cfg.Logger,
		Registerer:      cfg.Registerer,
	})
}

// newJWTKeys sets the JWT-SVID signing keys' store: with a cluster, the
// Secret every replica shares (a token minted by one replica validates
// against any replica's bundle); without, the state directory, so a
// restart keeps the tokens already issued valid; with Bundle (embedding,
// tests), memory.
func (s *Server) newJWTKeys() error {
	cfg := s.cfg
	if s.kc != nil {
		store, err := jwtsecret.New(jwtsecret.Config{
			Client: s.kc.controllers, Namespace: cfg.Kube.Namespace, Candidate: election.Candidate{Identity: cfg.Kube.PodName},
			Lifetime: cfg.JWT.KeyLifetime, TTL: cfg.JWT.SVIDTTL,
			Clock: cfg.Clock, Logger: cfg.Logger, Registerer: cfg.Registerer,
		})
		s.jwtKube, s.jwtKeys = store, store
		return err
	}
	dir := ""
	if cfg.Bundle == nil {
		dir = cfg.StateDir
		if err := os.MkdirAll(dir, 0o700); err != nil { // e.g. a read-only root with --ca-dir
			s.log.Warn("the JWT signing keys stay in memory: a restart will start with new ones", logs.KeyStateDir, dir, logs.KeyError, err)
			dir = ""
		}
	}
	local, err := jwtkeys.NewLocal(jwtkeys.LocalConfig{
		Dir: dir, Lifetime: cfg.JWT.KeyLifetime, TTL: cfg.JWT.SVIDTTL, Clock: cfg.Clock, Logger: cfg.Logger,
	})
	s.jwtKeys = local
	return err
}

// closeKey closes the module key, if any.
func (s *Server) closeKey() {
	if s.key != nil {
		if err := s.key.Close(); err != nil {
			s.log.Warn("closing the CA key's module", logs.KeyError, err)
		}
	}
	s.closeUpstreamKeys()
}

// build creates the authority, the authenticators and the gRPC server on
// the CA material b.
func (s *Server) build(b *keystore.Bundle) error {
	cfg := s.cfg
	authority, err := ca.New(ca.Config{
		TrustDomain:   cfg.TrustDomain,
		Bundle:        b,
		DefaultTTL:    cfg.Issuance.DefaultTTL,
		MaxTTL:        cfg.Issuance.MaxTTL,
		CapTTLToToken: cfg.Issuance.CapTTLToToken,
		Clock:         cfg.Clock,
		Logger:        cfg.Logger,
		Registerer:    cfg.Registerer,
	})
	if err != nil {
		return err
	}
	auths, jwt, err := s.authenticators(authority)
	if err != nil {
		return err
	}
	// JWT-SVIDs: a signing key of their own, never the CA key (see
	// ca/jwtissuer).
	jwtIssuer, err := jwtissuer.New(jwtissuer.Config{
		TrustDomain: cfg.TrustDomain,
		TTL:         cfg.JWT.SVIDTTL,
		Keys:        s.jwtKeys,
		Clock:       cfg.Clock,
		Logger:      cfg.Logger,
		Registerer:  cfg.Registerer,
	})
	if err != nil {
		return err
	}
	scfg := certservice.Config{
		Authority:     authority,
		Authenticator: authn.NewChain(append(auths, cfg.Authn.Extra...)...),
		Listen:        cfg.Listen,
		ServingDNS:    cfg.Serving.DNSNames,
		ServingTTL:    cfg.Serving.CertTTL,
		RateLimit:     cfg.Limits.Rate,
		RateBurst:     cfg.Limits.Burst,
		// Connection limits: hole 10 of the security review (SECURITY.md).
		MaxConnections:      cfg.Limits.MaxConnections,
		MaxConnectionsPerIP: cfg.Limits.MaxConnectionsPerIP,
		FirstRequestTimeout: cfg.Limits.FirstRequestTimeout,
		JWT:                 jwtIssuer,
		Federation:          s.fed.bundles(),
		Clock:               cfg.Clock,
		Logger:              cfg.Logger,
		Registerer:          cfg.Registerer,
	}
	if s.node != nil && s.router != nil { // node authorization by the caller's cluster
		scfg.NodeAuthorizer = s.router
	}
	grpcSrv, err := certservice.New(scfg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.authority, s.grpc, s.jwt = authority, grpcSrv, jwt
	s.fed.setIssuer(jwtIssuer)
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
	if s.kc != nil { // the cluster's own bound tokens, verified here first
		v, err := s.boundTokenVerifier()
		if err != nil {
			return nil, nil, err
		}
		s.mu.Lock()
		s.bound = v
		s.mu.Unlock()
		out = prepend(v, cfg.Clusters.ID, out)
	}
	if s.router != nil { // TokenReview, by the cluster the request names
		out = append(out, s.router)
	} else { // no other cluster: a token for one is refused, as the router would
		out = append(out, cluster.LocalOnly(cfg.Clusters.ID))
	}
	if cfg.Authn.JWKSFile != "" || cfg.Authn.JWTIssuer != "" {
		j, err := authn.NewJWT(authn.JWTConfig{
			Issuer:    cfg.Authn.JWTIssuer,
			Audiences: cfg.Authn.TokenAudiences,
			JWKSFile:  cfg.Authn.JWKSFile,
			// MaxTokenLifetime: hole 12 of the security review.
			MaxTokenLifetime: cfg.Authn.MaxTokenLifetime,
			Clock:            cfg.Clock,
			Logger:           cfg.Logger,
			Registerer:       cfg.Registerer,
		})
		if err != nil {
			return nil, nil, err
		}
		out, jwt = append(out, j), j
	}
	cc, err := authn.NewClientCert(authn.ClientCertConfig{
		TrustDomain:        authority.TrustDomain(),
		TrustDomainAliases: cfg.Authn.TrustDomainAliases,
		Roots:              func() []*x509.Certificate { return authority.Bundle().Roots },
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
	if s.kc == nil && cfg.Authn.JWKSFile == "" && cfg.Authn.JWTIssuer == "" && len(cfg.Authn.Extra) == 0 {
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

// Rotation returns the CA's rotation; nil while Run waits for the
// Kubernetes CA Secret.
func (s *Server) Rotation() *rotation.Manager {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rotation
}

func (s *Server) grpcServer() *certservice.Server {
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
	if err := s.fed.listen(); err != nil {
		return err
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
	return s.monitor.Addr() // nil when disabled
}

// Ready is the CA's readiness (/readyz): nil once it serves, and, in a
// cluster, once the Kubernetes controller is ready and the CA can
// authenticate the cluster's callers (authReady).
func (s *Server) Ready() error {
	if err := s.authReady(); err != nil {
		return err
	}
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
	defer s.closeKey()
	applyGC(s.cfg.Runtime.GCPercent, s.cfg.Runtime.MemoryLimit)
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
	if s.apiserver != nil {
		g.Go(func() error { return s.apiserver.Run(ctx) })
	}
	if s.kube != nil {
		g.Go(func() error { return s.kube.run(ctx) })
	}
	if s.node != nil {
		g.Go(func() error { return s.node.Run(ctx) })
	}
	if s.router != nil {
		g.Go(func() error { return s.router.Run(ctx) })
	}
	if s.secrets != nil {
		g.Go(func() error { return s.secrets.Run(ctx) })
	}
	if s.caDir != nil {
		g.Go(func() error { return s.caDir.Run(ctx) })
	}
	if s.upstream != nil && s.upKube == nil { // with upKube, only the leader renews
		g.Go(func() error { return s.runUpstream(ctx) })
	}
	if s.upKube != nil {
		g.Go(func() error { return s.upKube.run(ctx) })
	}
	if s.admin != nil {
		g.Go(func() error { return s.admin.Run(ctx) })
	}
	if s.jwtKube != nil {
		g.Go(func() error { return s.jwtKube.Run(ctx) })
	}
	for _, run := range s.fed.runs() {
		g.Go(func() error { return run(ctx) })
	}
	if s.podCert != nil {
		g.Go(func() error { return s.podCert.Run(ctx) })
	}
	if s.kube != nil && s.cfg.KubeCASecret {
		var b *keystore.Bundle
		var err error
		if s.upKube != nil {
			b, err = s.upKube.wait(ctx)
		} else {
			b, err = s.kube.waitForBundle(ctx, s.log, s.cfg.Kube.Namespace)
		}
		if err == nil {
			err = s.build(b)
		}
		var r *rotation.Manager
		if err == nil {
			r, err = s.newRotation(ctx, b, nil)
		}
		if err != nil {
			return fail(err)
		}
		s.mu.Lock()
		s.rotation = r
		s.mu.Unlock()
		s.kube.attach(r)
		if s.upKube != nil {
			s.upKube.attach(r)
		}
		g.Go(func() error { return s.kube.followRotation(ctx, r) })
	}
	if r := s.Rotation(); r != nil {
		g.Go(func() error { return r.Run(ctx) })
	}
	grpcSrv := s.grpcServer()
	if err := grpcSrv.Listen(); err != nil {
		return fail(err)
	}
	g.Go(func() error { return grpcSrv.Run(ctx) })
	s.mu.Lock()
	jwt, bound := s.jwt, s.bound
	s.mu.Unlock()
	if jwt != nil {
		g.Go(func() error { return jwt.Run(ctx) })
	}
	if bound != nil {
		g.Go(func() error { return bound.Run(ctx) })
	}
	attrs := []any{"grpc", grpcSrv.Addr().String(), "trust_domain", s.cfg.TrustDomain.Name()}
	if s.monitor != nil {
		attrs = append(attrs, "monitoring", s.monitor.Addr().String())
	}
	s.log.Info("meshid CA serving", attrs...)
	return g.Wait()
}
