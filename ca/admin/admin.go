package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"golang.org/x/net/netutil"

	"github.com/meshid/meshid/ca/rotation"
	"github.com/meshid/meshid/ca/spiffefed"
	"github.com/meshid/meshid/ca/upstream"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/unixsock"
)

// Limits of the admin API (SECURITY.md, "Admin socket").
const (
	// DefaultMaxConnections bounds the connections open at once.
	DefaultMaxConnections = 8
	// maxHeaderBytes bounds a request's header; maxBody its body (the API
	// takes none).
	maxHeaderBytes = 8 << 10
	maxBody        = 1 << 10
	// SocketMode is the socket's mode: its owner only.
	SocketMode os.FileMode = 0o600
)

// Config configures a Server.
type Config struct {
	// Socket is the Unix socket path. Required.
	Socket string
	// Rotation returns the CA's rotation; nil while the CA has none yet
	// (waiting for its Kubernetes Secret): the API answers 503 then.
	Rotation func() *rotation.Manager
	// Federation, when set, returns the federated trust domains' state,
	// added to /v1/status.
	Federation func() []spiffefed.PeerStatus
	// Upstream, when set, returns the upstream CA's renewal state (false
	// without one), added to /v1/status.
	Upstream func() (upstream.Status, bool)
	// MaxConnections bounds the connections open at once; 0 takes
	// DefaultMaxConnections.
	MaxConnections int
	Logger         *slog.Logger // nil discards logs
}

// Server serves the admin API.
type Server struct {
	cfg  Config
	log  *slog.Logger
	http *http.Server
}

// New validates cfg and applies its defaults. It does not listen.
func New(cfg Config) (*Server, error) {
	if cfg.Socket == "" {
		return nil, errors.New("admin: Socket is required")
	}
	if cfg.Rotation == nil {
		return nil, errors.New("admin: Rotation is required")
	}
	if cfg.MaxConnections < 0 {
		return nil, errors.New("admin: negative MaxConnections")
	}
	cfg.MaxConnections = cmp.Or(cfg.MaxConnections, DefaultMaxConnections)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	s := &Server{cfg: cfg, log: cfg.Logger.With(logs.KeyComponent, "admin", logs.KeySocket, cfg.Socket)}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/status", s.handle(http.MethodGet, func(r *rotation.Manager) (any, error) {
		st := StatusOf(r.Status())
		if cfg.Federation != nil {
			st.Federation = cfg.Federation()
		}
		if cfg.Upstream != nil {
			if u, ok := cfg.Upstream(); ok {
				st.Upstream = &u
			}
		}
		return st, nil
	}))
	mux.HandleFunc("/v1/activate", s.handle(http.MethodPost, func(r *rotation.Manager) (any, error) { return s.act("activate", r.Activate, r) }))
	mux.HandleFunc("/v1/rotate-root", s.handle(http.MethodPost, func(r *rotation.Manager) (any, error) { return s.act("rotate-root", r.RotateRoot, r) }))
	s.http = &http.Server{
		Handler:           mux,
		MaxHeaderBytes:    maxHeaderBytes,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
	}
	return s, nil
}

// act runs an operator step and answers with the status that follows.
func (s *Server) act(name string, step func() error, r *rotation.Manager) (any, error) {
	err := step()
	s.log.Info("admin request", logs.KeyStep, name, logs.KeyError, errString(err))
	if err != nil {
		return nil, err
	}
	return StatusOf(r.Status()), nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// handle checks the method and body, then answers fn's result as JSON.
func (s *Server) handle(method string, fn func(*rotation.Manager) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		if req.Method != method {
			w.Header().Set("Allow", method)
			writeJSON(w, http.StatusMethodNotAllowed, errorBody{fmt.Sprintf("%s only", method)})
			return
		}
		n, err := io.Copy(io.Discard, http.MaxBytesReader(w, req.Body, maxBody))
		if err != nil || n > 0 {
			writeJSON(w, http.StatusRequestEntityTooLarge, errorBody{"the admin API takes no request body"})
			return
		}
		r := s.cfg.Rotation()
		if r == nil {
			writeJSON(w, http.StatusServiceUnavailable, errorBody{"the CA is not ready (waiting for its Secret)"})
			return
		}
		out, err := fn(r)
		switch {
		case errors.Is(err, rotation.ErrNothingPrepared), errors.Is(err, rotation.ErrAlreadyPrepared), errors.Is(err, rotation.ErrPlugged):
			writeJSON(w, http.StatusConflict, errorBody{err.Error()})
		case err != nil:
			writeJSON(w, http.StatusInternalServerError, errorBody{err.Error()})
		default:
			writeJSON(w, http.StatusOK, out)
		}
	}
}

type errorBody struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// Run listens on the socket (mode 0600) and serves until ctx ends; it
// removes the socket when it returns.
func (s *Server) Run(ctx context.Context) error {
	ln, fi, err := unixsock.Listen(s.cfg.Socket, SocketMode)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	defer func() {
		// Remove only our own socket, as the SDS server does.
		if cur, err := os.Lstat(s.cfg.Socket); err == nil && os.SameFile(cur, fi) {
			os.Remove(s.cfg.Socket)
		}
	}()
	s.log.Info("admin API serving")
	errc := make(chan error, 1)
	go func() { errc <- s.http.Serve(netutil.LimitListener(ln, s.cfg.MaxConnections)) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.http.Shutdown(sctx)
		<-errc
		return nil
	case err := <-errc:
		return fmt.Errorf("admin: %w", err)
	}
}
