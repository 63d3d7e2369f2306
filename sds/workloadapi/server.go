package workloadapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/connlimit"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/unixsock"
	"github.com/meshid/meshid/sds/secretcache"
)

// Source provides the secrets served; *secretcache.Manager implements it.
type Source interface {
	// Secret returns the current secret of name, producing it if needed;
	// an error wrapping secretcache.ErrNotReady when it does not exist yet.
	Secret(ctx context.Context, name string) (*secretcache.Secret, error)
	// Watch calls notify, which must not block, each time name's secret
	// changes or first becomes available, until cancel is called.
	Watch(name string, notify func(*secretcache.Secret)) (cancel func())
}

// DefaultSocketMode is the mode of the socket: only the agent's user may
// connect.
const DefaultSocketMode = unixsock.DefaultMode

// Defaults of Config.
const (
	// DefaultMaxStreams caps the streams open at once over the whole
	// socket. An application holds one or two (an X509Source holds one).
	DefaultMaxStreams = 1024
	// DefaultMaxConnections caps the connections open at once.
	DefaultMaxConnections = 256
	// DefaultShutdownTimeout bounds Run's shutdown after its context ends.
	DefaultShutdownTimeout = 5 * time.Second
)

// MaxRequestSize bounds a request message. The X.509 requests are empty;
// the bound only keeps a client from making the server buffer megabytes.
const MaxRequestSize = 64 << 10

// MaxHeaderListSize bounds a request's headers (gRPC's default is 16 MiB):
// a Workload API call needs one short header.
const MaxHeaderListSize = 16 << 10

// Config configures a Server.
type Config struct {
	// Source provides the secrets. Required.
	Source Source
	// SocketPath is the Unix socket to serve on. Required.
	SocketPath string
	// SocketMode is the socket's permission bits; 0 means 0600. 0660 lets
	// the group connect. Bits for others are refused: the socket hands out
	// private keys.
	SocketMode os.FileMode
	// MaxStreams caps the streams (FetchX509SVID, FetchX509Bundles) open
	// at once; one more is refused with ResourceExhausted. 0 means
	// DefaultMaxStreams.
	MaxStreams int
	// MaxConnections caps the connections open at once; one more is
	// closed as soon as accepted. 0 means DefaultMaxConnections.
	MaxConnections int
	// ShutdownTimeout bounds how long Run waits for stream handlers after
	// its context ends. 0 means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration

	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil registers no metrics
	Clock      clock.Clock
}

// Server is the SPIFFE Workload API server.
type Server struct {
	workloadpb.UnimplementedSpiffeWorkloadAPIServer

	// The socket's life: Listen, Ready, SocketPath and Run (unixsock's).
	*unixsock.Server

	src      Source
	maxConns int
	log      *slog.Logger
	clock    clock.Clock
	metrics  *metrics
	grpc     *grpc.Server
	streams  chan struct{} // a token per open stream
	x509     responses

	warnMu       sync.Mutex
	lastWarn     time.Time // of the last refused-connection warning
	refusedSince int       // refused connections since lastWarn
}

// New validates cfg and returns a Server. It starts nothing; call Listen
// and Run.
func New(cfg Config) (*Server, error) {
	if cfg.Source == nil {
		return nil, errors.New("workloadapi: Config.Source is required")
	}
	var err error
	if cfg.SocketMode, err = unixsock.CheckSocket(cfg.SocketPath, cfg.SocketMode); err != nil {
		return nil, fmt.Errorf("workloadapi: %w", err)
	}
	if cfg.MaxStreams < 0 || cfg.MaxConnections < 0 || cfg.ShutdownTimeout < 0 {
		return nil, errors.New("workloadapi: Config.MaxStreams, MaxConnections and ShutdownTimeout must not be negative")
	}
	cfg.MaxStreams = cmp.Or(cfg.MaxStreams, DefaultMaxStreams)
	cfg.MaxConnections = cmp.Or(cfg.MaxConnections, DefaultMaxConnections)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, DefaultShutdownTimeout)
	log := logs.OrDiscard(cfg.Logger)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{
		src:      cfg.Source,
		maxConns: cfg.MaxConnections,
		log:      log.With("component", "workloadapi"),
		clock:    clock.OrReal(cfg.Clock),
		metrics:  m,
		streams:  make(chan struct{}, cfg.MaxStreams),
	}
	s.grpc = grpc.NewServer(
		// Stop waits for the stream handlers, which cancel their watches,
		// so Run leaves nothing behind.
		grpc.WaitForHandlers(true),
		grpc.MaxRecvMsgSize(MaxRequestSize),
		grpc.MaxHeaderListSize(MaxHeaderListSize),
		grpc.UnaryInterceptor(s.unaryGate),
		grpc.StreamInterceptor(s.streamGate),
		// Clients may ping a quiet stream; do not punish them for it.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	workloadpb.RegisterSpiffeWorkloadAPIServer(s.grpc, s)
	s.Server = unixsock.NewServer(unixsock.ServerConfig{
		Name: "workloadapi", Label: "Workload API", Path: cfg.SocketPath, Mode: cfg.SocketMode, Serve: s.grpc,
		// A connection beyond the cap is closed at once (see connlimit),
		// so that clients fail fast instead of queueing unanswered.
		Wrap: func(ln net.Listener) net.Listener {
			return connlimit.New(ln, connlimit.Config{Max: cfg.MaxConnections, Refused: s.refuseConn})
		},
		ShutdownTimeout: cfg.ShutdownTimeout, Clock: s.clock, Logger: s.log,
	})
	return s, nil
}

// refuseConn counts a connection refused by the cap and warns at most once
// a minute (with the count since the last warning), so that a client
// hammering the socket cannot flood the log.
func (s *Server) refuseConn(string) {
	s.metrics.refused.WithLabelValues(reasonConnections).Inc()
	now := s.clock.Now()
	s.warnMu.Lock()
	s.refusedSince++
	if !s.lastWarn.IsZero() && now.Sub(s.lastWarn) < time.Minute {
		s.warnMu.Unlock()
		return
	}
	n := s.refusedSince
	s.refusedSince, s.lastWarn = 0, now
	s.warnMu.Unlock()
	s.log.Warn("Workload API connections refused: too many open", "max_connections", s.maxConns, "refused", n)
}
