package sds

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/meshid/meshid/internal/clock"
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
const DefaultSocketMode os.FileMode = 0o600

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

	src     Source
	path    string
	mode    os.FileMode
	log     *slog.Logger
	clock   clock.Clock
	metrics *metrics
	hub     *hub
	grpc    *grpc.Server
	fetches atomic.Uint64 // nonces of FetchSecrets responses

	maxNames        int
	shutdownTimeout time.Duration

	fetchWarnMu sync.Mutex
	fetchWarns  *warnLimiter

	mu    sync.Mutex
	ln    net.Listener
	sock  os.FileInfo
	ran   bool
	ready chan struct{}
}

// New validates cfg and returns a Server. It starts nothing; call Listen
// and Run.
func New(cfg Config) (*Server, error) {
	if cfg.Source == nil {
		return nil, errors.New("sds: Config.Source is required")
	}
	if cfg.SocketPath == "" {
		return nil, errors.New("sds: Config.SocketPath is required")
	}
	if len(cfg.SocketPath) > unixsock.MaxPath {
		return nil, fmt.Errorf("sds: socket path %q is longer than %d bytes", cfg.SocketPath, unixsock.MaxPath)
	}
	mode := cfg.SocketMode
	mode = cmp.Or(mode, DefaultSocketMode)
	if mode&^os.ModePerm != 0 || mode&0o007 != 0 || mode&0o600 != 0o600 {
		return nil, fmt.Errorf("sds: socket mode %#o: want owner read-write and no access for others, such as 0600 or 0660", mode)
	}
	if cfg.MaxResourceNames < 0 || cfg.ShutdownTimeout < 0 {
		return nil, errors.New("sds: Config.MaxResourceNames and ShutdownTimeout must not be negative")
	}
	maxNames := cfg.MaxResourceNames
	maxNames = cmp.Or(maxNames, DefaultMaxResourceNames)
	shutdown := cfg.ShutdownTimeout
	shutdown = cmp.Or(shutdown, DefaultShutdownTimeout)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "sds")
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{
		src:     cfg.Source,
		path:    cfg.SocketPath,
		mode:    mode,
		log:     log,
		clock:   clock.OrReal(cfg.Clock),
		metrics: m,
		hub:     newHub(cfg.Source),
		ready:   make(chan struct{}),

		maxNames:        maxNames,
		shutdownTimeout: shutdown,
		fetchWarns:      newWarnLimiter(),
	}
	s.grpc = grpc.NewServer(
		// Stop waits for the stream handlers, which release their
		// subscriptions, so Run leaves nothing behind.
		grpc.WaitForHandlers(true),
		// Proxies may ping a quiet SDS stream; do not punish them for it.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	secretv3.RegisterSecretDiscoveryServiceServer(s.grpc, s)
	return s, nil
}

// Listen creates the socket (see Config). It is called by Run when needed;
// calling it first lets the caller know the socket accepts connections
// before Run. It fails when another agent serves on the socket.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return nil
	}
	ln, fi, err := unixsock.Listen(s.path, s.mode)
	if err != nil {
		return err
	}
	s.ln, s.sock = ln, fi
	close(s.ready)
	s.log.Info("SDS socket listening", "path", s.path, "mode", fmt.Sprintf("%#o", s.mode))
	return nil
}

// debug reports whether debug logs are wanted, so that hot paths build no
// log arguments for nothing.
func (s *Server) debug() bool { return s.log.Enabled(context.Background(), slog.LevelDebug) }

// Ready is closed once the socket listens.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// SocketPath returns the socket's path.
func (s *Server) SocketPath() string { return s.path }

// Run serves until ctx is done, then closes every stream and removes the
// socket. It returns nil after ctx ends.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.ran {
		s.mu.Unlock()
		return errors.New("sds: Run called twice")
	}
	s.ran = true
	ln, sock := s.ln, s.sock
	s.mu.Unlock()

	served := make(chan error, 1)
	go func() { served <- s.grpc.Serve(ln) }()
	var err error
	serveEnded := false
	select {
	case err = <-served: // Serve failed by itself
		serveEnded = true
	case <-ctx.Done():
	}
	// Streams are endless, so a graceful stop would wait forever; proxies
	// reconnect to the next agent. Stop closes every connection and waits
	// for the handlers (WaitForHandlers), which a client cannot hold up:
	// a blocked send fails with its transport and a handler waiting for a
	// secret waits with the stream's context. The bound covers the rest.
	if !clock.Within(s.clock, s.shutdownTimeout, s.grpc.Stop) {
		unixsock.Remove(s.path, sock)
		s.log.Error("SDS server did not stop in time; leaving its handlers behind", "timeout", s.shutdownTimeout)
		return fmt.Errorf("sds: shutdown took longer than %s", s.shutdownTimeout)
	}
	if !serveEnded {
		<-served // returns once Stop is done
	}
	unixsock.Remove(s.path, sock)
	if ctx.Err() != nil {
		s.log.Info("SDS server stopped")
		return nil
	}
	return fmt.Errorf("sds: serve: %w", err)
}
