package workloadendpoint

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"google.golang.org/grpc"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/unixsock"
	"github.com/meshid/meshid/sds/secretcache"
)

// Source provides the secrets served: secretcache.Source, the one
// interface of the agent's servers, which *secretcache.Manager implements.
type Source = secretcache.Source

// DefaultSocketMode is the mode of the socket: only the agent's user may
// connect.
const DefaultSocketMode = unixsock.DefaultMode

// Defaults of Config.
const (
	// DefaultMaxStreams caps the streams open at once over the whole
	// socket. An application holds one or two (an X509Source holds one).
	DefaultMaxStreams = 1024
	// DefaultMaxCalls caps the unary calls (FetchJWTSVID, ValidateJWTSVID)
	// in progress at once over the whole socket. A JWTSource makes one
	// at a time.
	DefaultMaxCalls = 256
	// DefaultMaxConnections caps the connections open at once.
	DefaultMaxConnections = 256
	// DefaultShutdownTimeout bounds Run's shutdown after its context ends.
	DefaultShutdownTimeout = 5 * time.Second
)

// MaxRequestSize bounds a request message. The X.509 requests are empty;
// the bound only keeps a client from making the server buffer megabytes.
const MaxRequestSize = 64 << 10

// MaxHeaderListSize bounds a request's headers (gRPC's default is 16 MiB):
// a Workload API call needs one short header. It is every agent socket's
// (unixsock.MaxHeaderListSize).
const MaxHeaderListSize = unixsock.MaxHeaderListSize

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
	// MaxStreams caps the streams (FetchX509SVID, FetchX509Bundles,
	// FetchJWTBundles) open at once; one more is refused with
	// ResourceExhausted. 0 means DefaultMaxStreams.
	MaxStreams int
	// MaxCalls caps the unary calls (FetchJWTSVID, ValidateJWTSVID) in
	// progress at once; one more is refused with ResourceExhausted. 0
	// means DefaultMaxCalls.
	MaxCalls int
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

	src     Source
	log     *slog.Logger
	clock   clock.Clock
	metrics *metrics
	grpc    *grpc.Server
	x509    responses
	// jwtWarns throttles the warnings about failed JWT requests: a
	// client asking in a loop while the CA is down cannot flood the log.
	jwtWarns *logs.Throttle
}

// New validates cfg and returns a Server. It starts nothing; call Listen
// and Run.
func New(cfg Config) (*Server, error) {
	if cfg.Source == nil {
		return nil, errors.New("workloadendpoint: Config.Source is required")
	}
	var err error
	if cfg.SocketMode, err = unixsock.CheckSocket(cfg.SocketPath, cfg.SocketMode); err != nil {
		return nil, fmt.Errorf("workloadendpoint: %w", err)
	}
	if cfg.MaxStreams < 0 || cfg.MaxCalls < 0 || cfg.MaxConnections < 0 || cfg.ShutdownTimeout < 0 {
		return nil, errors.New("workloadendpoint: Config.MaxStreams, MaxCalls, MaxConnections and ShutdownTimeout must not be negative")
	}
	cfg.MaxStreams = cmp.Or(cfg.MaxStreams, DefaultMaxStreams)
	cfg.MaxCalls = cmp.Or(cfg.MaxCalls, DefaultMaxCalls)
	cfg.MaxConnections = cmp.Or(cfg.MaxConnections, DefaultMaxConnections)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, DefaultShutdownTimeout)
	log := logs.OrDiscard(cfg.Logger)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{
		src:      cfg.Source,
		log:      log.With(logs.KeyComponent, "workloadapi"),
		clock:    clock.OrReal(cfg.Clock),
		metrics:  m,
		jwtWarns: logs.NewThrottle(),
	}
	// The limits of every agent socket (unixsock.NewGRPC), the security
	// header checked before a call takes a slot.
	s.grpc = unixsock.NewGRPC(unixsock.GRPCConfig{
		Label:  "Workload API",
		Limits: unixsock.Limits{MaxRequestSize: MaxRequestSize, MaxStreams: cfg.MaxStreams, MaxCalls: cfg.MaxCalls},
		Check:  s.checkMetadata,
		Refused: func(reason string) {
			s.metrics.refused.WithLabelValues(reason).Inc()
		},
		StreamOpened: func(delta int) { s.metrics.streams.Add(float64(delta)) },
	})
	workloadpb.RegisterSpiffeWorkloadAPIServer(s.grpc, s)
	s.Server = unixsock.NewServer(unixsock.ServerConfig{
		Name: "workloadapi", Label: "Workload API", Path: cfg.SocketPath, Mode: cfg.SocketMode, Serve: s.grpc,
		MaxConnections: cfg.MaxConnections,
		Refused: func(reason string) {
			s.metrics.refused.WithLabelValues(reason).Inc()
		},
		ShutdownTimeout: cfg.ShutdownTimeout, Clock: s.clock, Logger: s.log,
	})
	return s, nil
}
