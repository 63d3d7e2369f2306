package unixsock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/connlimit"
	"github.com/meshid/meshid/internal/logs"
)

// Serving is what a Server serves on its socket; *grpc.Server implements
// it.
type Serving interface {
	Serve(net.Listener) error
	// Stop closes every connection and returns once the handlers have
	// returned (grpc.WaitForHandlers).
	Stop()
}

// ServerConfig configures a Server. Its owner (sds, sds/workloadendpoint)
// validates and defaults the values first.
type ServerConfig struct {
	Name  string // error prefix: "sds", "workloadapi"
	Label string // log prefix: "SDS", "Workload API"
	Path  string
	Mode  os.FileMode
	Serve Serving
	// MaxConnections caps the connections open at once; one more is
	// closed as soon as accepted (internal/connlimit), so that clients
	// fail fast instead of queueing unanswered. Required (positive).
	MaxConnections int
	// Refused, when set, is called with ReasonConnections for each
	// connection closed by the cap (a metric). It must not block. The
	// refusals are also logged, at most once a minute with their count.
	Refused func(reason string)
	// ShutdownTimeout bounds how long Run waits for Serve.Stop after its
	// context ends; after it Run returns an error and leaves the handlers
	// behind.
	ShutdownTimeout time.Duration
	Clock           clock.Clock
	Logger          *slog.Logger // nil discards logs
}

// Server serves a gRPC server on one of the agent's sockets: Listen creates
// the socket, Run serves until its context ends, stops the gRPC server
// within the shutdown timeout and removes the socket (only if still ours).
// The servers on the sockets (sds, sds/workloadendpoint) embed it, so that its
// methods are theirs.
type Server struct {
	cfg   ServerConfig
	log   *slog.Logger
	clock clock.Clock

	warnMu       sync.Mutex
	lastWarn     time.Time // of the last refused-connection warning
	refusedSince int       // refused connections since lastWarn

	mu    sync.Mutex
	ln    net.Listener
	sock  os.FileInfo
	ran   bool
	ready chan struct{}
}

// CheckPath returns an error when path cannot be a Unix socket's address.
func CheckPath(path string) error {
	if len(path) > MaxPath {
		return fmt.Errorf("socket path %q is longer than %d bytes", path, MaxPath)
	}
	return nil
}

// NewServer returns a Server; it creates nothing yet.
func NewServer(cfg ServerConfig) *Server {
	log := logs.OrDiscard(cfg.Logger)
	return &Server{cfg: cfg, log: log, clock: clock.OrReal(cfg.Clock), ready: make(chan struct{})}
}

// Listen creates the socket (see the package Listen). Run calls it when
// needed; calling it first lets the caller know the socket accepts
// connections before Run. It fails when another agent serves on the socket.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return nil
	}
	ln, fi, err := Listen(s.cfg.Path, s.cfg.Mode)
	if err != nil {
		return fmt.Errorf("%s: %w", s.cfg.Name, err)
	}
	s.ln, s.sock = connlimit.New(ln, connlimit.Config{Max: s.cfg.MaxConnections, Refused: s.refuseConn}), fi
	close(s.ready)
	s.log.Info(s.cfg.Label+" socket listening", logs.KeyPath, s.cfg.Path, logs.KeyMode, fmt.Sprintf("%#o", s.cfg.Mode))
	return nil
}

// Ready is closed once the socket listens.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// SocketPath returns the socket's path.
func (s *Server) SocketPath() string { return s.cfg.Path }

// Run serves until ctx is done, then closes every connection and removes
// the socket. It returns nil after ctx ends.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.ran {
		s.mu.Unlock()
		return errors.New(s.cfg.Name + ": Run called twice")
	}
	s.ran = true
	ln, sock := s.ln, s.sock
	s.mu.Unlock()

	served := make(chan error, 1)
	go func() { served <- s.cfg.Serve.Serve(ln) }()
	var err error
	serveEnded := false
	select {
	case err = <-served: // Serve failed by itself
		serveEnded = true
	case <-ctx.Done():
	}
	// Streams are endless, so a graceful stop would wait forever; clients
	// reconnect to the next agent. Stop closes every connection and waits
	// for the handlers, which a client cannot hold up: a blocked send fails
	// with its transport and a handler waiting for a secret waits with the
	// stream's context. The bound covers the rest.
	if !clock.Within(s.clock, s.cfg.ShutdownTimeout, s.cfg.Serve.Stop) {
		Remove(s.cfg.Path, sock)
		s.log.Error(s.cfg.Label+" server did not stop in time; leaving its handlers behind", logs.KeyTimeout, s.cfg.ShutdownTimeout)
		return fmt.Errorf("%s: shutdown took longer than %s", s.cfg.Name, s.cfg.ShutdownTimeout)
	}
	if !serveEnded {
		<-served // returns once Stop is done
	}
	Remove(s.cfg.Path, sock)
	if ctx.Err() != nil {
		s.log.Info(s.cfg.Label + " server stopped")
		return nil
	}
	return fmt.Errorf("%s: serve: %w", s.cfg.Name, err)
}

// refuseConn reports a connection refused by the cap and warns at most once
// a minute (with the count since the last warning), so that a client
// hammering the socket cannot flood the log.
func (s *Server) refuseConn(string) {
	if s.cfg.Refused != nil {
		s.cfg.Refused(ReasonConnections)
	}
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
	s.log.Warn(s.cfg.Label+" connections refused: too many open", logs.KeyMaxConnections, s.cfg.MaxConnections, logs.KeyRefused, n)
}
