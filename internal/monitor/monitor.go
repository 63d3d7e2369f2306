package monitor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/metric"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config configures a monitoring Server.
type Config struct {
	// Listen is the TCP address, such as "127.0.0.1:15014". Required.
	Listen string
	// Gatherer provides /metrics. Required.
	Gatherer prometheus.Gatherer
	// Ready reports readiness for /readyz: nil is ready, an error is the
	// reason it is not. nil means always ready.
	Ready func() error
	// Handlers are extra endpoints by path, such as "/debug/rotate".
	// Paths under /debug/ act on the process (a forced rotation, profiles)
	// and carry no authentication: New refuses them unless Listen is a
	// loopback address.
	Handlers map[string]http.Handler
	// LocalHandlers are read-only endpoints by path (under /debug/, such as
	// "/debug/secrets") served on any Listen address but answered only to
	// a loopback peer: a process in the same network namespace, which
	// includes `kubectl port-forward` and meshid inspect --pod, never
	// another pod. Others get 403.
	LocalHandlers map[string]http.Handler
	Logger        *slog.Logger // nil discards logs
}

// Loopback reports whether the TCP address addr ("host:port") listens only
// on a loopback interface: localhost or a loopback IP. An empty host (every
// interface) is not.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// LoopbackPeerOnly answers 403 to a request whose peer is not a loopback
// address.
func LoopbackPeerOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			http.Error(w, "served only to a loopback peer (use kubectl port-forward or meshid inspect --pod)", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Server is the monitoring HTTP server.
type Server struct {
	cfg  Config
	log  *slog.Logger
	http *http.Server

	mu sync.Mutex
	ln net.Listener
}

// New validates cfg and builds the server. It does not listen.
func New(cfg Config) (*Server, error) {
	if cfg.Listen == "" {
		return nil, errors.New("monitor: Listen is required")
	}
	if cfg.Gatherer == nil {
		return nil, errors.New("monitor: Gatherer is required")
	}
	if cfg.Ready == nil {
		cfg.Ready = func() error { return nil }
	}
	for path := range cfg.Handlers {
		if strings.HasPrefix(path, "/debug/") && !Loopback(cfg.Listen) {
			return nil, fmt.Errorf("monitor: debug endpoints (%s) are served only on a loopback address, not %q", path, cfg.Listen)
		}
	}
	log := logs.OrDiscard(cfg.Logger)
	mux := http.NewServeMux()
	// Renamed metrics are served under their old names too, for a release.
	mux.Handle("/metrics", promhttp.HandlerFor(metric.WithRenames(cfg.Gatherer), promhttp.HandlerOpts{ErrorLog: nil}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := cfg.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	for path, h := range cfg.Handlers {
		mux.Handle(path, h)
	}
	for path, h := range cfg.LocalHandlers {
		mux.Handle(path, LoopbackPeerOnly(h))
	}
	return &Server{
		cfg: cfg,
		log: log,
		http: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       60 * time.Second,
		},
	}, nil
}

// Listen binds the address, so that Addr is known before Run. Run calls it
// when it has not been called.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		hint := ""
		if errors.Is(err, syscall.EADDRINUSE) {
			// Most often a second agent (or dev) on the default port.
			hint = "; another process has it (a second agent?): give --monitoring-listen a free address (127.0.0.1:0 picks one) or an empty value to turn monitoring off"
		}
		return fmt.Errorf("monitor: --monitoring-listen %s: %w%s", s.cfg.Listen, err, hint)
	}
	s.ln = ln
	return nil
}

// Addr returns the bound address, or nil before Listen or on a nil Server
// (monitoring disabled).
func (s *Server) Addr() net.Addr {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	s.mu.Lock()
	ln := s.ln
	s.mu.Unlock()
	errc := make(chan error, 1)
	go func() { errc <- s.http.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("monitor: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.http.Shutdown(shutdownCtx); err != nil {
		s.log.Warn("monitor: shutdown", logs.KeyError, err)
	}
	<-errc
	return nil
}

// Registry returns a component's metrics registry with its defaults: when
// reg is nil, a new registry serves as both reg and g; when g is nil, reg
// serves as g if it is one. ok is false when no Gatherer results, so
// that /metrics could not be served.
func Registry(reg prometheus.Registerer, g prometheus.Gatherer) (_ prometheus.Registerer, _ prometheus.Gatherer, ok bool) {
	if reg == nil {
		r := prometheus.NewRegistry()
		reg = r
		if g == nil {
			g = r
		}
	}
	if g == nil {
		g, _ = reg.(prometheus.Gatherer)
	}
	return reg, g, g != nil
}
