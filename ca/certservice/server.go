package certservice

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/federationapi"
	"github.com/meshid/meshid/internal/jwtapi"
	"github.com/meshid/meshid/internal/logs"
)

// Limits and defaults of the gRPC endpoint.
const (
	// MaxRecvMsgSize bounds a request: a CSR is at most 64 KiB of PEM
	// (ca.MaxCSRSize), plus metadata.
	MaxRecvMsgSize = 256 << 10
	// FlowControlWindow is the HTTP/2 flow-control window of every stream
	// and connection: what a client may send before the CA reads it.
	FlowControlWindow = 64 << 10
	// MaxConcurrentStreams bounds the requests in flight on one connection.
	MaxConcurrentStreams = 256
	// DefaultMaxHeaderListSize bounds the headers of a request (HTTP/2
	// SETTINGS_MAX_HEADER_LIST_SIZE), and is also the largest value
	// allowed: 64 KiB, four times the largest token. gRPC's default of
	// 16 MiB let 16 clients with 8 MB authorization headers drive the CA
	// from 123 MB to 802 MB of memory before authentication.
	DefaultMaxHeaderListSize = 64 << 10
	// DefaultMaxConnections bounds the connections open at once (an idle,
	// handshaken connection holds about 50 KB): 8192.
	DefaultMaxConnections = 8192
	// DefaultMaxConnectionsPerIP bounds the connections open at once from
	// one peer IP address, so that one peer cannot take every slot: 512,
	// above the pods of one node (a node SNATs its pods' traffic to a
	// CA outside the cluster).
	DefaultMaxConnectionsPerIP = 512
	// DefaultFirstRequestTimeout is how long a new connection may take to
	// complete its TLS handshake and make a call that authenticates before
	// it is closed (calls without credentials do not count: issue 28).
	DefaultFirstRequestTimeout = 10 * time.Second
	// DefaultServingTTL is the lifetime of the serving certificate; it is
	// reissued at half of it.
	DefaultServingTTL = 24 * time.Hour
	// DefaultShutdownGrace is how long Run lets requests in flight finish
	// after its context ends.
	DefaultShutdownGrace = 5 * time.Second
	// DefaultStreamWorkers is the number of long-lived goroutines that
	// serve requests (grpc.NumStreamWorkers): 256, the requests one
	// connection may have in flight (MaxConcurrentStreams). A worker keeps
	// the stack a request grew (in the ECDSA verify's bigmod and gRPC's
	// receive path a fresh goroutine's stack is copied to a larger one
	// several times); a request that finds every worker busy gets a new
	// goroutine, as without workers, and pays the growth. The count
	// follows the CA's concurrency, not its CPUs: with 64 requests in
	// flight on 2 CPUs, 8 workers (the former 4 x GOMAXPROCS) left 56 of
	// them to fresh goroutines, and stack growth was 4-5.5% of the CA's
	// CPU; 1.3% with 256. Memory: a grown worker holds about 11 KiB of
	// stack (256 workers: 0.9 MiB of stacks idle, 3.6 MiB right after 256
	// requests at once; the garbage collector halves an idle worker's
	// stack each cycle, back to 1.8 MiB after two), so at most about
	// 4 MiB.
	DefaultStreamWorkers = MaxConcurrentStreams
	// MaxStreamWorkers bounds Config.StreamWorkers (about 64 MiB of grown
	// stacks).
	MaxStreamWorkers     = 4096
	limiterPruneInterval = time.Minute
)

// Config configures a Server.
type Config struct {
	Authority     *ca.Authority       // required
	Authenticator authn.Authenticator // required; usually an authn.NewChain
	// Listen is the TCP address, such as "127.0.0.1:15012". Required.
	Listen string
	// ServingDNS are DNS SANs added to the serving certificate; localhost,
	// istiod.istio-system.svc, 127.0.0.1 and ::1 are always included.
	ServingDNS []string
	// ServingTTL is the serving certificate's lifetime. Default 24h.
	ServingTTL time.Duration
	// RateLimit is the sustained requests per second allowed per caller
	// identity; 0 is unlimited. Over it, requests get ResourceExhausted.
	RateLimit float64
	// RateBurst is the per-caller burst. Default: RateLimit rounded up,
	// at least 1.
	RateBurst int
	// MaxHeaderListSize bounds a request's headers, in bytes. Default and
	// maximum 64 KiB.
	MaxHeaderListSize uint32
	// NodeAuthorizer allows node agents (Istio's ztunnel) to impersonate
	// the workloads on their node (ImpersonatedIdentity metadata; usually
	// a *nodeauth.Authorizer). Nil: node mode is off and every
	// impersonation is refused with PermissionDenied.
	NodeAuthorizer NodeAuthorizer
	// MaxTokenSize is the largest bearer token authenticated, in bytes;
	// a larger one is Unauthenticated before it is hashed or reviewed.
	// Default authn.MaxTokenSize (16 KiB), which is also the maximum.
	MaxTokenSize int
	// MaxConnections bounds the connections open at once; a connection
	// over it is closed at once. Default 8192.
	MaxConnections int
	// MaxConnectionsPerIP bounds the connections open at once from one
	// peer IP address. Default 512.
	MaxConnectionsPerIP int
	// FirstRequestTimeout closes a connection on which no call has
	// authenticated this long after it was accepted (TLS handshake
	// included), as soon as no call runs on it. Default 10s.
	FirstRequestTimeout time.Duration
	// StreamWorkers is the number of goroutines kept to serve requests,
	// each keeping the stack it grew (see DefaultStreamWorkers). Default
	// 256; at most MaxStreamWorkers.
	StreamWorkers int
	// Federation, when set, holds the federated trust domains' bundles
	// that meshid.v1.FederationService hands to the agents (and whose JWT
	// keys FetchJWTBundles adds; see federation.go). Nil: none.
	Federation FederatedBundles
	// JWT, when set, serves meshid.v1.JWTSVIDService (JWT-SVIDs for the
	// proven caller, and their JWKS; see jwt.go). Nil: not served.
	JWT        JWTIssuer
	Clock      clock.Clock
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil registers no metrics
}

// NodeAuthorizer decides whether caller, a node agent, may have a
// certificate for impersonated: nil, or a *ca.Error (PermissionDenied
// naming the condition that failed, Unavailable when it could not decide).
type NodeAuthorizer interface {
	Authorize(ctx context.Context, caller *authn.Caller, impersonated spiffeid.ID) error
}

// Server is the CA's gRPC endpoint.
type Server struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer

	authority *ca.Authority
	authn     authn.Authenticator
	nodeAuth  NodeAuthorizer // nil: impersonation refused
	jwt       JWTIssuer      // nil: no JWT-SVID service
	listen    string
	clock     clock.Clock
	log       *slog.Logger
	serving   *servingCerts
	limiters  *limiters // nil when unlimited
	maxToken  int
	conns     *connLimiter
	metrics   *metrics
	pem       pemCache
	grpcOpts  []grpc.ServerOption
	grpc      *grpc.Server // built by Run

	fed FederatedBundles // nil: no federated trust domain

	mu           sync.Mutex
	ln           net.Listener
	serveStarted atomic.Bool
}

// New validates cfg and builds the server. It neither listens nor issues
// the serving certificate (the first TLS handshake does).
func New(cfg Config) (*Server, error) {
	if cfg.Authority == nil {
		return nil, errors.New("certservice: Config.Authority is required")
	}
	if cfg.Authenticator == nil {
		return nil, errors.New("certservice: Config.Authenticator is required")
	}
	if cfg.Listen == "" {
		return nil, errors.New("certservice: Config.Listen is required")
	}
	if cfg.RateLimit < 0 || math.IsNaN(cfg.RateLimit) || math.IsInf(cfg.RateLimit, 0) {
		return nil, fmt.Errorf("certservice: invalid rate limit %v", cfg.RateLimit)
	}
	if cfg.RateBurst < 0 {
		return nil, fmt.Errorf("certservice: negative rate burst %d", cfg.RateBurst)
	}
	if cfg.ServingTTL < 0 {
		return nil, fmt.Errorf("certservice: negative serving TTL %s", cfg.ServingTTL)
	}
	cfg.ServingTTL = cmp.Or(cfg.ServingTTL, DefaultServingTTL)
	cfg.MaxHeaderListSize = cmp.Or(cfg.MaxHeaderListSize, DefaultMaxHeaderListSize)
	if cfg.MaxHeaderListSize > DefaultMaxHeaderListSize {
		return nil, fmt.Errorf("certservice: header list size %d is over the %d KiB maximum", cfg.MaxHeaderListSize, DefaultMaxHeaderListSize>>10)
	}
	cfg.MaxConnections = cmp.Or(cfg.MaxConnections, DefaultMaxConnections)
	cfg.MaxConnectionsPerIP = cmp.Or(cfg.MaxConnectionsPerIP, DefaultMaxConnectionsPerIP)
	cfg.FirstRequestTimeout = cmp.Or(cfg.FirstRequestTimeout, DefaultFirstRequestTimeout)
	if cfg.MaxConnections < 0 || cfg.MaxConnectionsPerIP < 0 || cfg.FirstRequestTimeout < 0 {
		return nil, errors.New("certservice: connection limits and the first-request timeout must not be negative")
	}
	cfg.MaxTokenSize = cmp.Or(cfg.MaxTokenSize, authn.MaxTokenSize)
	if cfg.MaxTokenSize < 0 || cfg.MaxTokenSize > authn.MaxTokenSize {
		return nil, fmt.Errorf("certservice: token size limit %d is not within 1 to %d bytes", cfg.MaxTokenSize, authn.MaxTokenSize)
	}
	cfg.StreamWorkers = cmp.Or(cfg.StreamWorkers, DefaultStreamWorkers)
	if cfg.StreamWorkers < 0 || cfg.StreamWorkers > MaxStreamWorkers {
		return nil, fmt.Errorf("certservice: stream workers %d is not within 1 to %d", cfg.StreamWorkers, MaxStreamWorkers)
	}
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	clk := clock.OrReal(cfg.Clock)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{
		authority: cfg.Authority,
		authn:     cfg.Authenticator,
		nodeAuth:  cfg.NodeAuthorizer,
		jwt:       cfg.JWT,
		fed:       cfg.Federation,
		listen:    cfg.Listen,
		clock:     clk,
		log:       cfg.Logger,
		serving:   newServingCerts(cfg.Authority, cfg.ServingDNS, cfg.Listen, cfg.ServingTTL, clk),
		maxToken:  cfg.MaxTokenSize,
		metrics:   m,
	}
	s.conns = newConnLimiter(cfg.MaxConnections, cfg.MaxConnectionsPerIP, cfg.FirstRequestTimeout, clk, m.conns)
	if cfg.RateLimit > 0 {
		burst := cfg.RateBurst
		burst = cmp.Or(burst, max(1, int(math.Ceil(cfg.RateLimit))))
		s.limiters = newLimiters(cfg.RateLimit, burst)
	}
	// The gRPC server is built by Run: with NumStreamWorkers, building it
	// starts its workers, which only Stop ends, so a Server that is never
	// run (or fails to start) must not own one.
	s.grpcOpts = []grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(s.serving.tlsConfig())),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.MaxHeaderListSize(cfg.MaxHeaderListSize),
		// The first-request timeout learns of a connection's calls here
		// (unaryInterceptor says why not from a stats handler).
		grpc.ChainUnaryInterceptor(s.conns.unaryInterceptor),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		// Static flow-control windows (gRPC's 64 KiB initial ones): a
		// request is at most MaxRecvMsgSize, so the bandwidth-delay
		// estimator, which PINGs the client while data arrives and can
		// grow a connection's window to 16 MiB, buys the CA nothing and
		// costs it frames per certificate (TestNoFlowControlPings).
		grpc.StaticStreamWindowSize(FlowControlWindow),
		grpc.StaticConnWindowSize(FlowControlWindow),
		// Reuse handler goroutines: a request's crypto grows a fresh
		// goroutine's stack several times; a worker keeps its grown
		// stack (DefaultStreamWorkers says why 256 and what it costs).
		// When every worker is busy, gRPC starts a goroutine as before.
		grpc.NumStreamWorkers(uint32(cfg.StreamWorkers)),
		grpc.ConnectionTimeout(cfg.FirstRequestTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             10 * time.Second,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: 15 * time.Minute,
			Time:              time.Minute,
			Timeout:           20 * time.Second,
		}),
	}
	return s, nil
}

// Listen binds the address, so that Addr is known before Run. Run calls it
// when it has not been called.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", s.listen)
	if err != nil {
		return fmt.Errorf("certservice: listen %s: %w", s.listen, err)
	}
	s.ln = ln
	return nil
}

// Addr returns the bound address, or nil before Listen.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Ready reports whether the server is serving: nil once Run has bound the
// address and holds a valid serving certificate, else the reason. It suits
// monitor.Config.Ready.
func (s *Server) Ready() error {
	if !s.serving.ready(s.clock.Now()) || !s.serveStarted.Load() {
		return errors.New("certservice: not serving yet")
	}
	return nil
}

// Run serves until ctx ends, then lets requests in flight finish for a
// few seconds. It returns nil after a clean stop.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	s.mu.Lock()
	ln := s.ln
	s.mu.Unlock()
	// Issue the serving certificate now, so a CA that cannot issue one
	// fails at start rather than at the first handshake.
	if _, err := s.serving.get(); err != nil {
		ln.Close()
		return err
	}
	s.grpc = grpc.NewServer(s.grpcOpts...)
	securityv1alpha1.RegisterIstioCertificateServiceServer(s.grpc, s)
	if s.jwt != nil {
		jwtapi.Register(s.grpc, jwtService{s: s, issuer: s.jwt})
	}
	federationapi.Register(s.grpc, federationService{s})
	defer s.grpc.Stop() // ends the stream workers however Run returns
	errc := make(chan error, 1)
	s.serveStarted.Store(true)
	defer s.serveStarted.Store(false)
	go func() { errc <- s.grpc.Serve(s.conns.listener(ln)) }()
	var prune clock.Timer
	var pruneC <-chan time.Time
	if s.limiters != nil {
		prune = s.clock.NewTimer(limiterPruneInterval)
		pruneC = prune.C()
		defer prune.Stop()
	}
	for {
		select {
		case err := <-errc:
			return fmt.Errorf("certservice: %w", err)
		case <-pruneC:
			s.limiters.prune(s.clock.Now())
			prune.Reset(limiterPruneInterval)
		case <-ctx.Done():
			s.stop()
			<-errc
			return nil
		}
	}
}

// stop ends the server gracefully, forcibly after DefaultShutdownGrace.
func (s *Server) stop() {
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	t := s.clock.NewTimer(DefaultShutdownGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C():
		s.grpc.Stop()
		<-done
	}
}
