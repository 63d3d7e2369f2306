package boundtoken

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/metric"
)

// Mode chooses who verifies the cluster's bound tokens.
type Mode string

// The modes of Config.Mode (flag --token-verification).
const (
	// ModeTokenReview sends every token to the API server; no Verifier is
	// built.
	ModeTokenReview Mode = "tokenreview"
	// ModeLocal verifies the cluster's tokens here; until discovery works
	// and the informers have synced, they are answered Unavailable.
	ModeLocal Mode = "local"
	// ModeAuto verifies locally once discovery works and the informers
	// have synced, and leaves every token to TokenReview until then.
	ModeAuto Mode = "auto"
)

// ParseMode parses a --token-verification value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeTokenReview, ModeLocal, ModeAuto:
		return m, nil
	}
	return "", fmt.Errorf("boundtoken: token verification %q: want tokenreview, local or auto", s)
}

// Defaults of Config.
const (
	DefaultMode = ModeAuto
	// DefaultRefreshInterval is how often the issuer and keys are read
	// again; a new signing key is normally found sooner, by the first
	// token that names it.
	DefaultRefreshInterval = 5 * time.Minute
	// DefaultMinRefreshInterval bounds refreshes caused by unknown key
	// ids: a flood of made-up kids costs at most one JWKS read per
	// interval.
	DefaultMinRefreshInterval = 10 * time.Second
	// DefaultLeeway is the clock-skew allowance on exp, nbf and iat, as
	// authn.DefaultJWTLeeway (the API server allows a minute).
	DefaultLeeway = authn.DefaultJWTLeeway
	// DefaultCacheSize bounds the verified signatures remembered.
	DefaultCacheSize = authn.DefaultCacheSize
	// DefaultCacheTTL is the longest a verified signature is remembered;
	// the bound objects are checked on every request regardless.
	DefaultCacheTTL = 10 * time.Minute
	// DefaultDiscoveryTimeout bounds one discovery or JWKS read.
	DefaultDiscoveryTimeout = 10 * time.Second
	// DeletedLeeway is the API server's own allowance for a bound object
	// marked for deletion (jwt.DefaultLeeway in validator.Validate): a
	// token stays valid for a minute after its deletionTimestamp.
	DeletedLeeway = time.Minute
)

// Config configures New.
type Config struct {
	// REST reads /.well-known/openid-configuration and the JWKS from the
	// API server with the CA's credentials (any client's RESTClient: the
	// paths are absolute). Required.
	REST rest.Interface
	// Metadata lists and watches service accounts, pods and (with
	// WatchSecrets) secrets, metadata only. Required.
	Metadata metadata.Interface
	// Mode is ModeLocal or ModeAuto; default ModeAuto. ModeTokenReview
	// is refused: the caller builds no Verifier then.
	Mode Mode
	// Audiences: a token's aud must contain one. Default ["istio-ca"].
	Audiences []string
	// WatchSecrets also verifies tokens bound to a Secret locally. Off by
	// default: list/watch on secrets, even metadata only, is the RBAC
	// right to read every Secret of the cluster, which a CA should not
	// hold for a token kind workloads do not use; such tokens go to
	// TokenReview.
	WatchSecrets bool
	// RefreshInterval, MinRefreshInterval: see the defaults.
	RefreshInterval    time.Duration
	MinRefreshInterval time.Duration
	// Leeway is the clock-skew allowance on exp, nbf and iat.
	Leeway time.Duration
	// CacheSize bounds the verified signatures remembered (negative: no
	// cache); CacheTTL is the longest one is remembered.
	CacheSize int
	CacheTTL  time.Duration
	// DiscoveryTimeout bounds one read of the discovery document or JWKS.
	DiscoveryTimeout time.Duration
	Clock            clock.Clock
	Logger           *slog.Logger
	Registerer       prometheus.Registerer
}

// Verifier is an authn.Authenticator for the cluster's bound tokens.
type Verifier struct {
	cfg     Config
	clock   clock.Clock
	log     *slog.Logger
	objects *objects
	cache   *cache.LRUExpireCache // SHA-256 of the token -> *verified; nil when disabled

	keys        atomic.Pointer[keySet] // nil until the first discovery
	lastRefresh atomic.Int64           // unix nanos of the last refresh attempt
	refreshMu   sync.Mutex             // serializes rate-limit checks of refresh-on-miss
	flight      singleflight.Group
	goJOSEOnly  bool        // tests: parse every token with go-jose (no parseCompact)
	active      atomic.Bool // local verification in force (last reported)
	activeMu    sync.Mutex

	results   *prometheus.CounterVec
	refreshes *prometheus.CounterVec
	mode      *prometheus.GaugeVec
}

// keySet is what discovery found: the issuer and its public keys.
type keySet struct {
	issuer string
	keys   *jose.JSONWebKeySet
	raw    []byte // the JWKS as read, to tell a changed set from the same
}

// Results of Authenticate, the values of meshid_ca_bound_token_results_total.
const (
	resultAccepted        = "accepted"
	resultRejected        = "rejected"
	resultUnavailable     = "unavailable"
	fallbackInactive      = "fallback_inactive"
	fallbackIssuer        = "fallback_issuer"
	fallbackUnbound       = "fallback_unbound"
	fallbackKey           = "fallback_unknown_key"
	fallbackObject        = "fallback_object"
	fallbackSecretBinding = "fallback_secret"
)

// New validates cfg, applies its defaults and returns a Verifier. It makes
// no request; Run discovers the keys and starts the informers.
func New(cfg Config) (*Verifier, error) {
	if cfg.REST == nil || cfg.Metadata == nil {
		return nil, errors.New("boundtoken: Config.REST and Config.Metadata are required")
	}
	if cfg.Mode == "" {
		cfg.Mode = DefaultMode
	}
	if cfg.Mode != ModeLocal && cfg.Mode != ModeAuto {
		return nil, fmt.Errorf("boundtoken: mode %q: a Verifier runs in mode local or auto", cfg.Mode)
	}
	if len(cfg.Audiences) == 0 {
		cfg.Audiences = []string{authn.DefaultTokenAudience}
	}
	if slices.Contains(cfg.Audiences, "") {
		return nil, errors.New("boundtoken: empty token audience")
	}
	if cfg.RefreshInterval < 0 || cfg.MinRefreshInterval < 0 || cfg.Leeway < 0 || cfg.CacheTTL < 0 || cfg.DiscoveryTimeout < 0 {
		return nil, errors.New("boundtoken: negative interval, leeway or timeout")
	}
	cfg.Audiences = slices.Clone(cfg.Audiences)
	cfg.RefreshInterval = cmp.Or(cfg.RefreshInterval, DefaultRefreshInterval)
	cfg.MinRefreshInterval = cmp.Or(cfg.MinRefreshInterval, DefaultMinRefreshInterval)
	cfg.Leeway = cmp.Or(cfg.Leeway, DefaultLeeway)
	cfg.CacheTTL = cmp.Or(cfg.CacheTTL, DefaultCacheTTL)
	cfg.DiscoveryTimeout = cmp.Or(cfg.DiscoveryTimeout, DefaultDiscoveryTimeout)
	cfg.CacheSize = cmp.Or(cfg.CacheSize, DefaultCacheSize)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	cfg.Clock = clock.OrReal(cfg.Clock)
	v := &Verifier{
		cfg:     cfg,
		clock:   cfg.Clock,
		log:     cfg.Logger,
		objects: newObjects(cfg.Metadata, cfg.WatchSecrets),
		results: metric.CounterVec("meshid_ca_bound_token_results_total",
			"Tokens seen by the local bound-token verifier, by result: accepted, rejected, unavailable, or left to TokenReview (fallback_*: the reason).",
			"result", resultAccepted, resultRejected, resultUnavailable, fallbackInactive, fallbackIssuer,
			fallbackUnbound, fallbackKey, fallbackObject, fallbackSecretBinding),
		refreshes: metric.CounterVec("meshid_ca_bound_token_key_refreshes_total",
			"Reads of the cluster's issuer discovery document and JWKS, by result (ok, error).", "result", "ok", "error"),
		mode: modeGauge(),
	}
	if cfg.CacheSize > 0 {
		v.cache = cache.NewLRUExpireCacheWithClock(cfg.CacheSize, cfg.Clock)
	}
	if err := metric.Register(cfg.Registerer, append(v.objects.collectors(), v.results, v.refreshes, v.mode)...); err != nil {
		return nil, fmt.Errorf("boundtoken: register metrics: %w", err)
	}
	return v, nil
}

// modeGauge is meshid_ca_token_verification_mode, set to tokenreview.
func modeGauge() *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "meshid_ca_token_verification_mode",
		Help: "1 for the way the cluster's bound tokens are verified now: local (this CA) or tokenreview (the API server).",
	}, []string{"mode"})
	g.WithLabelValues("local").Set(0)
	g.WithLabelValues("tokenreview").Set(1)
	return g
}

// ReportTokenReview logs and exports (meshid_ca_token_verification_mode)
// that every token goes to TokenReview, for a CA that builds no Verifier.
func ReportTokenReview(reg prometheus.Registerer, log *slog.Logger) error {
	if err := metric.Register(reg, modeGauge()); err != nil {
		return fmt.Errorf("boundtoken: register metrics: %w", err)
	}
	if log != nil {
		log.Info("token verification: tokenreview (every token is sent to the API server)", logs.KeyConfigured, string(ModeTokenReview))
	}
	return nil
}

// Mode is the configured mode.
func (v *Verifier) Mode() Mode { return v.cfg.Mode }

// Active reports whether tokens are verified locally now: the keys are
// discovered and the informers have synced.
func (v *Verifier) Active() bool { return v.keys.Load() != nil && v.objects.synced() }

// Run starts the informers and keeps the issuer and keys fresh until ctx
// ends. It logs, and exports in meshid_ca_token_verification_mode, which
// way tokens are verified whenever that changes.
func (v *Verifier) Run(ctx context.Context) error {
	v.report("starting")
	go v.objects.run(ctx)
	go func() {
		if v.objects.waitForSync(ctx) {
			v.report("informers synced")
		}
	}()
	for {
		wait := v.cfg.RefreshInterval
		if err := v.Refresh(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			attrs := []any{"error", err}
			if apierrors.IsForbidden(err) {
				attrs = append(attrs, "hint", "bind the ClusterRole system:service-account-issuer-discovery to the CA's service account")
			}
			v.log.Warn("cannot discover the cluster's service-account issuer and keys", attrs...)
			if v.keys.Load() == nil {
				wait = v.cfg.MinRefreshInterval
			}
		}
		v.report("keys refreshed")
		t := v.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// report logs and exports the way tokens are verified when it changed (or
// on start).
func (v *Verifier) report(why string) {
	v.activeMu.Lock()
	defer v.activeMu.Unlock()
	active := v.Active()
	if active == v.active.Load() && why != "starting" {
		return
	}
	v.active.Store(active)
	local, review := 0.0, 1.0
	if active {
		local, review = 1, 0
	}
	v.mode.WithLabelValues("local").Set(local)
	v.mode.WithLabelValues("tokenreview").Set(review)
	attrs := []any{"configured", string(v.cfg.Mode), "why", why,
		"keys_discovered", v.keys.Load() != nil, "informers_synced", v.objects.synced()}
	switch {
	case active:
		v.log.Info("token verification: local (bound tokens of the cluster verified by this CA)", append(attrs, "issuer", v.keys.Load().issuer)...)
	case v.cfg.Mode == ModeAuto:
		v.log.Info("token verification: tokenreview (auto: local verification is not ready)", attrs...)
	default:
		v.log.Warn("token verification: local, not ready: the cluster's tokens are answered Unavailable", attrs...)
	}
}
