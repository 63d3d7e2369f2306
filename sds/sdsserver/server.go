package sdsserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
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
	// DefaultMaxResourceNames caps the names of one request and of one
	// stream. An Envoy asks for a handful (default, ROOTCA and a few
	// file-mounted ones).
	DefaultMaxResourceNames = 256
	// DefaultShutdownTimeout bounds Run's shutdown after its context ends.
	DefaultShutdownTimeout = 5 * time.Second
	// DefaultMaxStreams caps the SDS streams open at once over the whole
	// socket: an Envoy holds a handful; the agent is sized for 10,000
	// (docs/benchmarks.md, target 3: about 14 KiB each), so the cap
	// leaves that a fifth more room and bounds the memory streams hold
	// (issue 28: 20,000 streams on one connection held 396 MB).
	DefaultMaxStreams = 12288
	// DefaultMaxCalls caps the FetchSecrets calls in progress at once.
	DefaultMaxCalls = 256
	// DefaultMaxConnections caps the connections open at once (an Envoy
	// uses one; meshid-bench sds spreads 10,000 streams over 100).
	DefaultMaxConnections = 256
)

// MaxRequestSize bounds a request message: DefaultMaxResourceNames names
// and Envoy's node metadata fit many times over (gRPC's default is 4 MiB).
const MaxRequestSize = 1 << 20

// MaxHeaderListSize bounds a request's headers, as on every agent socket
// (gRPC's default is 16 MiB; issue 28: 40 streams with 15 MiB headers
// drove the agent to 1.98 GB).
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
	// MaxResourceNames caps the resource names of one request (SotW,
	// delta subscribe, FetchSecrets) and those a stream subscribes to at
	// once; a request above it is refused with ResourceExhausted (and ends
	// its stream). 0 means DefaultMaxResourceNames.
	MaxResourceNames int
	// ShutdownTimeout bounds how long Run waits for stream handlers after
	// its context ends; after it Run returns an error and leaves them
	// behind. 0 means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// MaxStreams caps the streams (StreamSecrets, DeltaSecrets) open at
	// once; one more is refused with ResourceExhausted. 0 means
	// DefaultMaxStreams.
	MaxStreams int
	// MaxCalls caps the FetchSecrets calls in progress at once; one more
	// is refused with ResourceExhausted. 0 means DefaultMaxCalls.
	MaxCalls int
	// MaxConnections caps the connections open at once; one more is
	// closed as soon as accepted. 0 means DefaultMaxConnections.
	MaxConnections int

	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil registers no metrics
	Clock      clock.Clock
}

// Server is the SDS server.
type Server struct {
	secretv3.UnimplementedSecretDiscoveryServiceServer

	// The socket's life: Listen, Ready, SocketPath and Run (unixsock's:
	// listen, serve, a bounded Stop, removal; proxies reconnect to the
	// next agent).
	*unixsock.Server

	src     Source
	log     *slog.Logger
	clock   clock.Clock
	metrics *metrics
	hub     *hub
	grpc    *grpc.Server
	fetches atomic.Uint64 // nonces of FetchSecrets responses

	maxNames int

	fetchWarns *logs.Throttle
}

// New validates cfg and returns a Server. It starts nothing; call Listen
// and Run.
func New(cfg Config) (*Server, error) {
	if cfg.Source == nil {
		return nil, errors.New("sds: Config.Source is required")
	}
	mode, err := unixsock.CheckSocket(cfg.SocketPath, cfg.SocketMode)
	if err != nil {
		return nil, fmt.Errorf("sds: %w", err)
	}
	if cfg.MaxResourceNames < 0 || cfg.ShutdownTimeout < 0 || cfg.MaxStreams < 0 || cfg.MaxCalls < 0 || cfg.MaxConnections < 0 {
		return nil, errors.New("sds: Config.MaxResourceNames, ShutdownTimeout, MaxStreams, MaxCalls and MaxConnections must not be negative")
	}
	maxNames := cfg.MaxResourceNames
	maxNames = cmp.Or(maxNames, DefaultMaxResourceNames)
	shutdown := cfg.ShutdownTimeout
	shutdown = cmp.Or(shutdown, DefaultShutdownTimeout)
	log := logs.OrDiscard(cfg.Logger)
	log = log.With(logs.KeyComponent, "sds")
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{
		src:     cfg.Source,
		log:     log,
		clock:   clock.OrReal(cfg.Clock),
		metrics: m,
		hub:     newHub(cfg.Source),

		maxNames:   maxNames,
		fetchWarns: logs.NewThrottle(),
	}
	refused := func(reason string) { m.refused.WithLabelValues(reason).Inc() }
	// The limits of every agent socket (unixsock.NewGRPC): header list
	// size, request size, streams per connection and over the socket,
	// calls, connections. Stop waits for the stream handlers, which
	// release their subscriptions, so Run leaves nothing behind.
	s.grpc = unixsock.NewGRPC(unixsock.GRPCConfig{
		Label: "SDS",
		Limits: unixsock.Limits{
			MaxRequestSize: MaxRequestSize,
			MaxStreams:     cmp.Or(cfg.MaxStreams, DefaultMaxStreams),
			MaxCalls:       cmp.Or(cfg.MaxCalls, DefaultMaxCalls),
		},
		Refused: refused,
	})
	secretv3.RegisterSecretDiscoveryServiceServer(s.grpc, s)
	s.Server = unixsock.NewServer(unixsock.ServerConfig{
		Name: "sds", Label: "SDS", Path: cfg.SocketPath, Mode: mode, Serve: s.grpc,
		MaxConnections:  cmp.Or(cfg.MaxConnections, DefaultMaxConnections),
		Refused:         refused,
		ShutdownTimeout: shutdown, Clock: s.clock, Logger: log,
	})
	return s, nil
}

// debug reports whether debug logs are wanted, so that hot paths build no
// log arguments for nothing.
func (s *Server) debug() bool { return s.log.Enabled(context.Background(), slog.LevelDebug) }
