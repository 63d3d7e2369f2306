package sds

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/unixsock"
	"github.com/meshid/meshid/sds/secretcache"
)

// Source provides the secrets served; *secretcache.Manager implements it.
type Source interface {
	// Secret returns the current secret of name, producing it if needed.
	// It returns an error wrapping secretcache.ErrUnknownResource for a
	// name it cannot serve, and one wrapping secretcache.ErrNotReady when
	// the secret does not exist yet.
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
	// DefaultMaxResourceNames caps the names of one request and of one
	// stream. An Envoy asks for a handful (default, ROOTCA and a few
	// file-mounted ones).
	DefaultMaxResourceNames = 256
	// DefaultShutdownTimeout bounds Run's shutdown after its context ends.
	DefaultShutdownTimeout = 5 * time.Second
)

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

	fetchWarnMu sync.Mutex
	fetchWarns  *warnLimiter
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
	if cfg.MaxResourceNames < 0 || cfg.ShutdownTimeout < 0 {
		return nil, errors.New("sds: Config.MaxResourceNames and ShutdownTimeout must not be negative")
	}
	maxNames := cfg.MaxResourceNames
	maxNames = cmp.Or(maxNames, DefaultMaxResourceNames)
	shutdown := cfg.ShutdownTimeout
	shutdown = cmp.Or(shutdown, DefaultShutdownTimeout)
	log := logs.OrDiscard(cfg.Logger)
	log = log.With("component", "sds")
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
		fetchWarns: newWarnLimiter(),
	}
	s.grpc = grpc.NewServer(
		// Stop waits for the stream handlers, which release their
		// subscriptions, so Run leaves nothing behind.
		grpc.WaitForHandlers(true),
		// Proxies may ping a quiet SDS stream; do not punish them for it.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	secretv3.RegisterSecretDiscoveryServiceServer(s.grpc, s)
	s.Server = unixsock.NewServer(unixsock.ServerConfig{
		Name: "sds", Label: "SDS", Path: cfg.SocketPath, Mode: mode, Serve: s.grpc,
		ShutdownTimeout: shutdown, Clock: s.clock, Logger: log,
	})
	return s, nil
}

// debug reports whether debug logs are wanted, so that hot paths build no
// log arguments for nothing.
func (s *Server) debug() bool { return s.log.Enabled(context.Background(), slog.LevelDebug) }
