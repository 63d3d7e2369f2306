package secretcache

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/sds/caclient"
)

// Signer sends a CSR to a CA. caclient.Client implements it. It returns the
// leaf followed by the intermediates, and the root bundle, verified with
// caclient.Verify against the CSR's key and SPIFFE ID (a refused answer
// wraps caclient.ErrInvalidResponse). Errors should carry a gRPC status, or
// have a FailureCode() string method for local failures; the Manager logs
// and counts failures by caclient.FailureCode. Sign must return within a
// bounded time; caclient applies its Timeout.
type Signer interface {
	Sign(ctx context.Context, csr *x509.CertificateRequest, ttl time.Duration) (chain, roots []*x509.Certificate, err error)
}

// Defaults.
const (
	DefaultTTL         = 24 * time.Hour
	DefaultGraceRatio  = 0.5
	DefaultJitter      = 0.01
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = time.Minute
)

// Config configures a Manager.
type Config struct {
	// Signer obtains certificates from the CA. Required.
	Signer Signer
	// ID is the workload identity requested in every CSR. Required.
	ID spiffeid.ID
	// KeyType is the workload key algorithm; empty means ec-p256.
	KeyType certs.KeyType
	// TTL is the requested certificate lifetime; 0 means 24h.
	TTL time.Duration
	// GraceRatio is the fraction of the lifetime after which the
	// certificate is renewed; 0 means 0.5. Must be in (0,1].
	GraceRatio float64
	// Jitter is the ± fraction of the lifetime by which renewal moves at
	// random; 0 means 0.01, a negative value disables jitter.
	Jitter float64
	// BackoffBase and BackoffMax bound the retry delay after a CA
	// failure: BackoffBase doubles per consecutive failure up to
	// BackoffMax, each delay shortened by up to 20% at random.
	// 0 means 1s and 1m.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// FileSecretDirs are the only directories whose files file-cert: and
	// file-root: resources may read (symbolic links may not leave them).
	// nil means DefaultFileSecretDirs; an empty, non-nil slice refuses
	// every file resource (meshid dev).
	FileSecretDirs []string
	// MaxFileSecretSize bounds each file a file resource reads; 0 means
	// DefaultMaxFileSecretSize (1 MiB).
	MaxFileSecretSize int64
	// JWTSigner, when set, obtains JWT-SVIDs and the JWT bundle (see
	// jwt.go); caclient.Client implements it. Nil: the JWT methods return
	// ErrJWTUnavailable.
	JWTSigner JWTSigner
	// MaxJWTSVIDs bounds the JWT-SVIDs cached (least recently used out);
	// 0 means DefaultMaxJWTSVIDs.
	MaxJWTSVIDs int
	// MaxJWTFlights bounds the JWT-SVID requests in progress at once (one
	// per audience set, however many callers wait for it); a new audience
	// set beyond it is refused with ErrTooManyJWTRequests. 0 means
	// DefaultMaxJWTFlights.
	MaxJWTFlights int
	// JWTBundleRefresh is how often Run fetches the JWT bundle again once
	// it is in use; 0 means DefaultJWTBundleRefresh.
	JWTBundleRefresh time.Duration
	// RootFile, when set, is re-read every RootRefresh (0 takes
	// DefaultRootRefresh) and its roots join those of the CA's answers in
	// ROOTCA: during a CA rotation the new root arrives from either. It
	// must hold only the mesh's roots: ROOTCA trusts them for workloads.
	RootFile    string
	RootRefresh time.Duration
	// MaxRoots bounds the roots RootFile may hold (a file of more is
	// refused, like a system CA bundle; the previous roots stay); 0 means
	// rootfile.DefaultMaxRoots.
	MaxRoots int
	// Federation, when set, gives the federated trust domains' bundles
	// (caclient.Client implements it), polled every FederationRefresh (0
	// takes DefaultFederationRefresh) into ROOTCA_FEDERATED.
	Federation        FederationSource
	FederationRefresh time.Duration
	// OnRoots, when set, is called with every new ROOTCA bundle (the agent
	// makes its CA client trust it, so that the CA's serving certificate
	// may move to a new root).
	OnRoots func([]*x509.Certificate)

	Clock      clock.Clock
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil registers no metrics
}

// Manager is the SecretManager. Its methods are safe for concurrent use.
type Manager struct {
	signer      Signer
	id          spiffeid.ID
	keyType     certs.KeyType
	ttl         time.Duration
	grace       float64
	jitter      float64
	backoffBase time.Duration
	backoffMax  time.Duration
	fileDirs    []string // absolute and clean
	maxFileSize int64
	clock       clock.Clock
	log         *slog.Logger
	metrics     *metrics
	jwt         *jwtCache // nil without a JWTSigner
	fed         federated // ROOTCA_FEDERATED (federated.go)

	cert  atomic.Pointer[Secret] // current default, possibly expired
	roots atomic.Pointer[Secret] // current ROOTCA

	mu       sync.Mutex
	inflight *flight                            // the CSR in progress, if any
	renewAt  time.Time                          // when the current default should be renewed
	failures int                                // consecutive CA failures
	retryAt  time.Time                          // non-zero while backing off
	lastErr  error                              // the last CA failure, while backing off
	files    map[fileKey]*fileEntry             // watched file secrets
	byDir    map[string]map[*fileEntry]struct{} // the entries whose files are in a directory
	watcher  *fsnotify.Watcher                  // set while Run runs
	watched  map[string]bool                    // directories added to watcher
	running  bool

	kick      chan struct{} // wakes the scheduler after a state change
	wantFiles chan struct{} // a directory to watch appeared: Run starts the file watcher

	rootFile    string
	rootRefresh time.Duration
	maxRoots    int // of rootFile; 0: rootfile.DefaultMaxRoots
	onRoots     func([]*x509.Certificate)
	answerRoots []*x509.Certificate // roots of the last CA answer (under mu)
	fileRoots   []*x509.Certificate // roots of rootFile (under mu)

	topicsMu sync.RWMutex // write-locked only to add or drop a topic (watch.go)
	topics   map[string]*topic
}

// flight is one CSR round trip shared by every caller that needs it.
type flight struct {
	done   chan struct{}
	secret *Secret
	err    error
}

// New validates cfg and returns a Manager. It starts nothing; call Run.
func New(cfg Config) (*Manager, error) {
	if cfg.Signer == nil {
		return nil, errors.New("secretcache: Config.Signer is required")
	}
	if cfg.ID.IsZero() {
		return nil, errors.New("secretcache: Config.ID is required")
	}
	kt := cfg.KeyType
	kt = cmp.Or(kt, certs.ECP256)
	switch kt {
	case certs.ECP256, certs.ECP384, certs.RSA2048, certs.RSA3072, certs.RSA4096:
	default:
		return nil, fmt.Errorf("secretcache: unsupported workload key type %q (want ec-p256, ec-p384, rsa-2048 or rsa-3072)", kt)
	}
	if cfg.TTL < 0 {
		return nil, errors.New("secretcache: Config.TTL must not be negative")
	}
	if cfg.GraceRatio < 0 || cfg.GraceRatio > 1 {
		return nil, fmt.Errorf("secretcache: Config.GraceRatio %v outside (0,1]", cfg.GraceRatio)
	}
	if cfg.Jitter >= 0.5 {
		return nil, fmt.Errorf("secretcache: Config.Jitter %v too large", cfg.Jitter)
	}
	if cfg.BackoffBase < 0 || cfg.BackoffMax < 0 {
		return nil, errors.New("secretcache: backoff durations must not be negative")
	}
	if cfg.MaxJWTSVIDs < 0 || cfg.MaxJWTFlights < 0 || cfg.JWTBundleRefresh < 0 {
		return nil, errors.New("secretcache: Config.MaxJWTSVIDs, MaxJWTFlights and JWTBundleRefresh must not be negative")
	}
	if cfg.MaxFileSecretSize < 0 || cfg.RootRefresh < 0 || cfg.MaxRoots < 0 {
		return nil, errors.New("secretcache: Config.MaxFileSecretSize, RootRefresh and MaxRoots must not be negative")
	}
	dirs, err := fileDirs(cfg.FileSecretDirs)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		signer:      cfg.Signer,
		id:          cfg.ID,
		keyType:     kt,
		ttl:         orDefault(cfg.TTL, DefaultTTL),
		grace:       cfg.GraceRatio,
		jitter:      cfg.Jitter,
		backoffBase: orDefault(cfg.BackoffBase, DefaultBackoffBase),
		backoffMax:  orDefault(cfg.BackoffMax, DefaultBackoffMax),
		fileDirs:    dirs,
		maxFileSize: cfg.MaxFileSecretSize,
		clock:       clock.OrReal(cfg.Clock),
		log:         cfg.Logger,
		files:       map[fileKey]*fileEntry{},
		byDir:       map[string]map[*fileEntry]struct{}{},
		watched:     map[string]bool{},
		kick:        make(chan struct{}, 1),
		wantFiles:   make(chan struct{}, 1),
		topics:      map[string]*topic{},
		rootFile:    cfg.RootFile,
		rootRefresh: orDefault(cfg.RootRefresh, DefaultRootRefresh),
		maxRoots:    cfg.MaxRoots,
		onRoots:     cfg.OnRoots,
	}
	m.maxFileSize = cmp.Or(m.maxFileSize, DefaultMaxFileSecretSize)
	m.grace = cmp.Or(m.grace, DefaultGraceRatio)
	switch {
	case m.jitter == 0:
		m.jitter = DefaultJitter
	case m.jitter < 0:
		m.jitter = 0
	}
	if m.backoffMax < m.backoffBase {
		m.backoffMax = m.backoffBase
	}
	m.log = logs.OrDiscard(m.log).With("component", "secretcache")
	if cfg.JWTSigner != nil {
		m.jwt = newJWTCache(cfg.JWTSigner, cfg.ID, cmp.Or(cfg.MaxJWTSVIDs, DefaultMaxJWTSVIDs),
			cmp.Or(cfg.MaxJWTFlights, DefaultMaxJWTFlights), cmp.Or(cfg.JWTBundleRefresh, DefaultJWTBundleRefresh), m.clock, m.log)
	}
	if err := m.fed.init(cfg); err != nil {
		return nil, err
	}
	met, err := newMetrics(cfg.Registerer, m)
	if err != nil {
		return nil, err
	}
	m.metrics = met
	if m.jwt != nil {
		m.jwt.refused = met.jwtRefused
	}
	return m, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// ID returns the workload identity.
func (m *Manager) ID() spiffeid.ID { return m.id }

// Secret returns the named secret: from memory when cached and unexpired,
// otherwise it is produced (one CSR however many callers wait). It returns
// an error wrapping ErrUnknownResource for a name it cannot serve, and one
// wrapping ErrNotReady when the secret cannot be produced now; a Watch on the
// name then reports it once it exists. An expired certificate is never
// returned.
func (m *Manager) Secret(ctx context.Context, name string) (*Secret, error) {
	pn, err := parseName(name)
	if err != nil {
		return nil, err
	}
	switch pn.kind {
	case kindDefault:
		if s := m.cert.Load(); s != nil && m.clock.Now().Before(s.NotAfter) {
			return s, nil
		}
		return m.obtain(ctx, false)
	case kindRoot:
		if r := m.roots.Load(); r != nil {
			return r, nil
		}
		if _, err := m.obtain(ctx, false); err != nil {
			return nil, err
		}
		if r := m.roots.Load(); r != nil {
			return r, nil
		}
		return nil, fmt.Errorf("%w: %s", ErrNotReady, name)
	case kindFederatedRoot:
		return m.federatedSecret(ctx)
	default:
		return m.fileSecret(name, pn)
	}
}

// Current returns the workload certificate and roots held now (either may
// be nil, and cert may have expired), without contacting the CA: for
// read-only views such as the agent's /debug/secrets. Callers must not
// modify them.
func (m *Manager) Current() (cert, roots *Secret) {
	return m.cert.Load(), m.roots.Load()
}

// LastError is the CA's last failure while the Manager backs off from it,
// nil otherwise.
func (m *Manager) LastError() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastErr
}

// Ready reports whether an unexpired workload certificate is held, for
// /readyz. It never contacts the CA.
func (m *Manager) Ready() error {
	s := m.cert.Load()
	if s == nil {
		return fmt.Errorf("%w: no workload certificate yet", ErrNotReady)
	}
	if !m.clock.Now().Before(s.NotAfter) {
		return fmt.Errorf("%w: workload certificate expired at %s", ErrNotReady, s.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// Rotate renews the workload certificate now, whatever its age and any
// backoff in progress, and pushes the result to the watchers.
func (m *Manager) Rotate(ctx context.Context) error {
	_, err := m.obtain(ctx, true)
	return err
}

// obtain returns a valid default secret, joining the CSR in flight or
// starting one. Unless force is set, a cached valid certificate is returned
// and a backoff in progress is respected (ErrNotReady without a CSR), with
// force too.
func (m *Manager) obtain(ctx context.Context, force bool) (*Secret, error) {
	m.mu.Lock()
	if !force {
		// Re-check under mu: a flight that just finished installed its
		// result before clearing m.inflight.
		if s := m.cert.Load(); s != nil && m.clock.Now().Before(s.NotAfter) {
			m.mu.Unlock()
			return s, nil
		}
	}
	// A backoff in progress holds for forced rotations too, so that
	// POST /debug/rotate repeated in a loop cannot hammer a failing CA.
	if m.inflight == nil && !m.retryAt.IsZero() && m.clock.Now().Before(m.retryAt) {
		err := m.lastErr
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: CA request failed, retrying later: %w", ErrNotReady, err)
	}
	f := m.inflight
	if f == nil {
		f = &flight{done: make(chan struct{})}
		m.inflight = f
		// The CSR runs detached from this caller's cancellation, so that
		// callers that joined it still get the result.
		go m.fly(context.WithoutCancel(ctx), f)
	}
	m.mu.Unlock()
	select {
	case <-f.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if f.err != nil {
		if force {
			return nil, f.err
		}
		return nil, fmt.Errorf("%w: %w", ErrNotReady, f.err)
	}
	return f.secret, nil
}

// fly performs the CSR of f, installs the result or records the failure,
// and pushes changes to the watchers.
func (m *Manager) fly(ctx context.Context, f *flight) {
	cert, roots, err := m.issue(ctx)
	now := m.clock.Now()

	m.mu.Lock()
	var union []*x509.Certificate
	rootsChanged := false
	if err != nil {
		m.failures++
		delay := backoff(m.failures, m.backoffBase, m.backoffMax, randFloat())
		m.retryAt = now.Add(delay)
		m.lastErr = err
		m.logFailure(err, m.failures, delay)
	} else {
		old := m.cert.Load()
		m.cert.Store(cert)
		m.fed.renewed() // an idle federation poll asks the CA again
		m.answerRoots = roots.Roots
		union, rootsChanged = m.setRootsLocked()
		m.failures, m.retryAt, m.lastErr = 0, time.Time{}, nil
		m.renewAt = certs.RenewAt(cert.Chain[0].NotBefore, cert.NotAfter, m.grace, m.jitter)
		// A certificate backdated far into the past (or a tiny lifetime)
		// could put the renewal time at or before now: never renew in a
		// hot loop, wait at least the base backoff.
		if floor := now.Add(m.backoffBase); m.renewAt.Before(floor) {
			m.renewAt = floor
		}
		m.log.Info("workload certificate issued",
			logs.KeySPIFFEID, m.id.String(), logs.KeySerial, cert.Chain[0].SerialNumber.Text(16),
			logs.KeyNotAfter, cert.NotAfter.UTC(), logs.KeyRenewAt, m.renewAt.UTC(),
			logs.KeyRotation, old != nil, logs.KeyRootsChanged, rootsChanged)
	}
	f.secret, f.err = cert, err
	m.inflight = nil
	m.mu.Unlock()
	// Callers are released only after the metrics and the pushes, so that
	// when Secret or Rotate returns, every watcher has been told.
	defer m.wake()
	defer close(f.done)

	if err != nil {
		m.metrics.caFailure(err)
		return
	}
	m.metrics.rotations.Inc()
	// Roots first: a peer must trust a new root before it sees a
	// certificate issued under it.
	if rootsChanged {
		m.rootsChanged(union)
	}
	m.publish(DefaultName)
}

func (m *Manager) logFailure(err error, attempt int, delay time.Duration) {
	attrs := []any{"error", err, "code", caclient.FailureCode(err), "attempt", attempt, "retry_in", delay}
	if s := m.cert.Load(); s != nil {
		attrs = append(attrs, "cert_expires_in", s.NotAfter.Sub(m.clock.Now()))
	}
	m.log.Warn("CA request failed", attrs...)
}

// wake nudges the scheduler to recompute its next deadline.
func (m *Manager) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}
