package spiffefed

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/connlimit"
	"github.com/meshid/meshid/internal/logs"
)

// Defaults and limits of an Endpoint (SECURITY.md's limits table).
const (
	// DefaultRefreshHint is the spiffe_refresh_hint served. The spec asks
	// for new keys 3 to 5 hints before they are used; a CA rotation
	// prepares the new roots for 10 minutes (ca/rotation), five hints.
	DefaultRefreshHint = 2 * time.Minute
	// EndpointPath is the one path served.
	EndpointPath = "/"
	// DefaultEndpointMaxConnections and DefaultEndpointMaxConnectionsPerIP
	// cap the open connections.
	DefaultEndpointMaxConnections      = 1024
	DefaultEndpointMaxConnectionsPerIP = 16
	// DefaultEndpointRate and DefaultEndpointBurst limit the requests per
	// client IP (token bucket): a peer refreshes once per hint.
	DefaultEndpointRate  = 5.0
	DefaultEndpointBurst = 10
	// endpointMaxHeader bounds a request's header; endpointReadTimeout,
	// endpointWriteTimeout and endpointIdle bound a connection's time.
	endpointMaxHeader    = 8 << 10
	endpointReadTimeout  = 10 * time.Second
	endpointWriteTimeout = 10 * time.Second
	endpointIdle         = 60 * time.Second
	// maxLimiters bounds the per-IP buckets kept; beyond it the full ones
	// are forgotten.
	maxLimiters = 10000
)

// EndpointIDPath is the path of the https_spiffe endpoint's SPIFFE ID in
// the CA's trust domain: spiffe://<td>/meshid/bundle-endpoint.
const EndpointIDPath = "/meshid/bundle-endpoint"

// EndpointID returns the SPIFFE ID the https_spiffe endpoint of td presents.
func EndpointID(td spiffeid.TrustDomain) spiffeid.ID {
	id, _ := spiffeid.FromPath(td, EndpointIDPath)
	return id
}

// EndpointConfig configures an Endpoint. The zero value of a field takes
// its default unless its comment says otherwise.
type EndpointConfig struct {
	// Listen is the TCP address. Required.
	Listen      string
	Profile     Profile // DefaultProfile when empty
	TrustDomain spiffeid.TrustDomain
	// Source gives the keys to publish. Required.
	Source      Source
	RefreshHint time.Duration
	// Authority issues the https_spiffe serving X509-SVID (EndpointID of
	// TrustDomain); a nil result means the CA is not ready yet.
	Authority func() *ca.Authority
	// CertFile and KeyFile are the https_web serving certificate (PEM),
	// read again when they change.
	CertFile, KeyFile string
	// Connection and request limits (per client IP for the Per ones).
	MaxConnections      int
	MaxConnectionsPerIP int
	RatePerIP           float64
	BurstPerIP          int

	Clock      clock.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Endpoint is the bundle endpoint server.
type Endpoint struct {
	cfg     EndpointConfig
	pub     *publisher
	getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	metrics *endpointMetrics
	srv     *http.Server

	mu       sync.Mutex
	ln       net.Listener
	limiters map[string]*rate.Limiter
}

// NewEndpoint validates cfg and builds the endpoint; Listen or Run binds.
func NewEndpoint(cfg EndpointConfig) (*Endpoint, error) {
	var err error
	if cfg.Profile, err = ParseProfile(string(cfg.Profile)); err != nil {
		return nil, err
	}
	cfg.RefreshHint = cmp.Or(cfg.RefreshHint, DefaultRefreshHint)
	cfg.MaxConnections = cmp.Or(cfg.MaxConnections, DefaultEndpointMaxConnections)
	cfg.MaxConnectionsPerIP = cmp.Or(cfg.MaxConnectionsPerIP, DefaultEndpointMaxConnectionsPerIP)
	cfg.RatePerIP = cmp.Or(cfg.RatePerIP, DefaultEndpointRate)
	cfg.BurstPerIP = cmp.Or(cfg.BurstPerIP, DefaultEndpointBurst)
	cfg.Clock = clock.OrReal(cfg.Clock)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	switch {
	case cfg.Listen == "" || cfg.Source == nil || cfg.TrustDomain.IsZero():
		return nil, errors.New("spiffefed: the bundle endpoint needs an address, a trust domain and a source")
	case cfg.RefreshHint < time.Second || cfg.MaxConnections < 0 || cfg.MaxConnectionsPerIP < 0 || cfg.RatePerIP < 0 || cfg.BurstPerIP < 0:
		return nil, errors.New("spiffefed: the bundle endpoint's refresh hint is under 1s or a limit is negative")
	}
	e := &Endpoint{cfg: cfg, limiters: map[string]*rate.Limiter{}}
	e.pub = &publisher{td: cfg.TrustDomain, hint: cfg.RefreshHint, src: cfg.Source, clock: cfg.Clock}
	switch cfg.Profile {
	case ProfileSPIFFE:
		if cfg.Authority == nil || cfg.CertFile != "" || cfg.KeyFile != "" {
			return nil, errors.New("spiffefed: an https_spiffe bundle endpoint presents an SVID of the CA, not certificate files")
		}
		e.getCert = (&svidCert{authority: cfg.Authority, id: EndpointID(cfg.TrustDomain), clock: cfg.Clock}).get
	case ProfileWeb:
		if cfg.CertFile == "" || cfg.KeyFile == "" {
			return nil, errors.New("spiffefed: an https_web bundle endpoint needs --bundle-endpoint-cert and --bundle-endpoint-key")
		}
		fc := &fileCert{certFile: cfg.CertFile, keyFile: cfg.KeyFile, clock: cfg.Clock, log: cfg.Logger}
		if err := fc.load(); err != nil {
			return nil, err
		}
		fc.checked = cfg.Clock.Now()
		e.getCert = fc.get
	}
	if e.metrics, err = newEndpointMetrics(cfg.Registerer, e.pub.sequence); err != nil {
		return nil, err
	}
	h, err := federation.NewHandler(cfg.TrustDomain, e.pub)
	if err != nil {
		return nil, err
	}
	e.srv = &http.Server{
		Handler:           e.guard(h),
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: e.getCert},
		ReadHeaderTimeout: endpointReadTimeout,
		ReadTimeout:       endpointReadTimeout,
		WriteTimeout:      endpointWriteTimeout,
		IdleTimeout:       endpointIdle,
		MaxHeaderBytes:    endpointMaxHeader,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	return e, nil
}

// guard applies the path, method and rate limits before h, and counts
// every answer by status code.
func (e *Endpoint) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code := http.StatusOK
		defer func() { e.metrics.requests.WithLabelValues(strconv.Itoa(code)).Inc() }()
		switch {
		case r.URL.Path != EndpointPath:
			code = http.StatusNotFound
		case r.Method != http.MethodGet:
			code = http.StatusMethodNotAllowed
			w.Header().Set("Allow", http.MethodGet)
		case !e.allow(hostOf(r.RemoteAddr)):
			code = http.StatusTooManyRequests
		}
		if code != http.StatusOK {
			http.Error(w, http.StatusText(code), code)
			return
		}
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(rec, r)
		code = rec.code
		if code != http.StatusOK {
			e.cfg.Logger.Warn("bundle endpoint cannot serve the bundle", logs.KeyCode, code)
		}
	})
}

// allow takes a token from ip's bucket.
func (e *Endpoint) allow(ip string) bool {
	now := e.cfg.Clock.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	lim := e.limiters[ip]
	if lim == nil {
		if len(e.limiters) >= maxLimiters {
			for k, l := range e.limiters {
				if l.TokensAt(now) >= float64(e.cfg.BurstPerIP) {
					delete(e.limiters, k)
				}
			}
		}
		lim = rate.NewLimiter(rate.Limit(e.cfg.RatePerIP), e.cfg.BurstPerIP)
		e.limiters[ip] = lim
	}
	return lim.AllowN(now, 1)
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

// hostOf is the IP of a request's RemoteAddr ("ip:port").
func hostOf(remote string) string {
	if h, _, err := net.SplitHostPort(remote); err == nil {
		return h
	}
	return remote
}

// Listen binds the address, so that Addr is known before Run.
func (e *Endpoint) Listen() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", e.cfg.Listen)
	if err != nil {
		return fmt.Errorf("spiffefed: bundle endpoint: %w", err)
	}
	e.ln = connlimit.New(ln, connlimit.Config{
		Max: e.cfg.MaxConnections, PerIP: e.cfg.MaxConnectionsPerIP,
		Refused: func(reason string) { e.metrics.refusedConns.WithLabelValues(reason).Inc() },
	})
	return nil
}

// Addr is the bound address, nil before Listen.
func (e *Endpoint) Addr() net.Addr {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ln == nil {
		return nil
	}
	return e.ln.Addr()
}

// Run serves until ctx ends.
func (e *Endpoint) Run(ctx context.Context) error {
	if err := e.Listen(); err != nil {
		return err
	}
	e.cfg.Logger.Info("bundle endpoint serving", logs.KeyAddress, e.Addr().String(), logs.KeyProfile, string(e.cfg.Profile),
		logs.KeyTrustDomain, e.cfg.TrustDomain.Name(), logs.KeyRefreshHint, e.cfg.RefreshHint)
	done := make(chan error, 1)
	go func() { done <- e.srv.ServeTLS(e.ln, "", "") }()
	select {
	case err := <-done:
		return fmt.Errorf("spiffefed: bundle endpoint: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = e.srv.Shutdown(sctx)
	<-done
	return nil
}
