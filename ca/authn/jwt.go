package authn

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/metric"
)

// Defaults of JWTConfig.
const (
	// DefaultJWTLeeway is the clock-skew allowance on exp, nbf and iat. It
	// is half of go-jose's default minute: projected tokens live for hours
	// and are refreshed long before expiry, so a tight leeway costs
	// nothing and shortens the life of a stolen, expired token.
	DefaultJWTLeeway = 30 * time.Second
	// DefaultMaxTokenLifetime is the longest a token may live past its
	// iat (past now when it has no iat): 48h, as Kubernetes bounds the
	// tokens it issues (--service-account-max-token-expiration). A token
	// valid until the year 9999 is refused.
	DefaultMaxTokenLifetime   = 48 * time.Hour
	DefaultJWKSRefresh        = 5 * time.Minute
	DefaultJWKSMinRefresh     = 10 * time.Second
	defaultJWKSRequestTimeout = 10 * time.Second
)

// JWTConfig configures NewJWT. Exactly one key source is used: JWKS, else
// JWKSFile, else JWKSURL, else OIDC discovery at Issuer.
type JWTConfig struct {
	// Issuer is the required iss claim, e.g. "https://kubernetes.default.svc".
	// It may be empty only with a pinned key source (JWKS, JWKSFile or
	// JWKSURL): the key then proves who minted the token, and any iss is
	// accepted.
	Issuer string
	// Audiences: the token's aud must contain at least one. Default
	// ["istio-ca"].
	Audiences []string
	// JWKS is a fixed key set (dev mode, tests).
	JWKS *jose.JSONWebKeySet
	// JWKSFile is re-read every RefreshInterval by Run.
	JWKSFile string
	// JWKSURL is fetched by Run; when it and the fields above are empty,
	// it is discovered from <Issuer>/.well-known/openid-configuration.
	JWKSURL string
	// HTTPClient fetches discovery documents and key sets. Default: a
	// client with a 10s timeout.
	HTTPClient *http.Client
	// RefreshInterval is how often Run reloads the keys. Default 5m.
	RefreshInterval time.Duration
	// MinRefreshInterval throttles reloads triggered by tokens signed with
	// an unknown key id. Default 10s.
	MinRefreshInterval time.Duration
	// Leeway is the clock-skew allowance for exp/nbf/iat. Default 30s.
	Leeway time.Duration
	// MaxTokenLifetime is the longest accepted exp past the token's iat
	// (past now without iat). Default 48h; negative accepts any exp.
	MaxTokenLifetime time.Duration
	// CacheSize bounds the number of verified tokens remembered, so that
	// the signature of a token seen again is not checked again. Default
	// 10000; negative disables the cache.
	CacheSize int
	// CacheTTL is the longest a verified token is remembered (never past
	// its exp, and never across a change of the key set). Default 1m, as
	// for TokenReview.
	CacheTTL   time.Duration
	Clock      clock.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// JWT authenticates Kubernetes service-account JWTs offline, by checking
// their signature against a JSON Web Key Set.
type JWT struct {
	issuer      string
	audiences   jwt.Audience
	leeway      time.Duration
	maxLife     time.Duration // < 0: unlimited
	file, url   string
	discover    bool
	hc          *http.Client
	interval    time.Duration
	minInterval time.Duration
	clock       clock.Clock
	log         *slog.Logger

	keys        atomic.Pointer[jose.JSONWebKeySet] // public keys only; nil until loaded
	lastRefresh atomic.Int64                       // unix nanos of the last reload attempt
	kick        chan struct{}

	cache    *tokenCache // SHA-256 of the token -> *verifiedToken; nil when disabled
	cacheTTL time.Duration

	refreshes *prometheus.CounterVec
	cacheHits prometheus.Counter
}

// verifiedToken is a token whose signature and claims were checked with
// the key set keys. It is reused only while keys is still the key set in
// use, so a reload that drops a key also drops the tokens it verified.
type verifiedToken struct {
	keys   *jose.JSONWebKeySet
	caller Caller
}

// NewJWT validates cfg and returns a JWT authenticator. A JWKS or JWKS
// file is loaded here; keys from a URL are loaded by Run, and until then
// tokens are answered with Unavailable.
func NewJWT(cfg JWTConfig) (*JWT, error) {
	if cfg.Issuer == "" && cfg.JWKS == nil && cfg.JWKSFile == "" && cfg.JWKSURL == "" {
		return nil, errors.New("authn: JWTConfig needs an Issuer (for OIDC discovery) or a JWKS, JWKS file or JWKS URL")
	}
	if len(cfg.Audiences) == 0 {
		cfg.Audiences = []string{DefaultTokenAudience}
	}
	if slices.Contains(cfg.Audiences, "") {
		return nil, errors.New("authn: empty token audience")
	}
	if cfg.Leeway < 0 {
		return nil, errors.New("authn: negative JWT leeway")
	}
	cfg.Leeway = cmp.Or(cfg.Leeway, DefaultJWTLeeway)
	cfg.MaxTokenLifetime = cmp.Or(cfg.MaxTokenLifetime, DefaultMaxTokenLifetime)
	// A negative interval or TTL means the default too.
	cfg.RefreshInterval = cmp.Or(max(cfg.RefreshInterval, 0), DefaultJWKSRefresh)
	cfg.MinRefreshInterval = cmp.Or(max(cfg.MinRefreshInterval, 0), DefaultJWKSMinRefresh)
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: defaultJWKSRequestTimeout}
	}
	cfg.CacheSize = cmp.Or(cfg.CacheSize, DefaultCacheSize)
	cfg.CacheTTL = cmp.Or(max(cfg.CacheTTL, 0), DefaultCacheTTL)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	j := &JWT{
		issuer:      cfg.Issuer,
		audiences:   slices.Clone(cfg.Audiences),
		leeway:      cfg.Leeway,
		maxLife:     cfg.MaxTokenLifetime,
		hc:          cfg.HTTPClient,
		interval:    cfg.RefreshInterval,
		minInterval: cfg.MinRefreshInterval,
		clock:       clock.OrReal(cfg.Clock),
		log:         cfg.Logger,
		kick:        make(chan struct{}, 1),
		cacheTTL:    cfg.CacheTTL,
		refreshes: metric.CounterVec("meshid_ca_jwks_refreshes_total",
			"Reloads of the JWT authenticator's key set, by result (ok, error).", "result"),
		cacheHits: metric.Counter("meshid_ca_jwt_cache_hits_total",
			"JWT authentications answered from the cache of verified tokens."),
	}
	if cfg.CacheSize > 0 {
		j.cache = newTokenCache(cfg.CacheSize, j.clock)
	}
	switch {
	case cfg.JWKS != nil:
		set, err := publicSigningKeys(cfg.JWKS)
		if err != nil {
			return nil, err
		}
		j.keys.Store(set)
	case cfg.JWKSFile != "":
		set, err := readJWKSFile(cfg.JWKSFile)
		if err != nil {
			return nil, err
		}
		j.file = cfg.JWKSFile
		j.keys.Store(set)
	case cfg.JWKSURL != "":
		if _, err := url.Parse(cfg.JWKSURL); err != nil {
			return nil, fmt.Errorf("authn: JWKS URL: %w", err)
		}
		j.url = cfg.JWKSURL
	default:
		u, err := url.Parse(cfg.Issuer)
		if err != nil || u.Scheme != "https" && u.Scheme != "http" || u.Host == "" {
			return nil, fmt.Errorf("authn: issuer %q is not an http(s) URL, so its keys cannot be discovered; give a JWKS file", cfg.Issuer)
		}
		j.discover = true
	}
	if err := metric.Register(cfg.Registerer, j.refreshes, j.cacheHits); err != nil {
		return nil, fmt.Errorf("authn: register JWT metrics: %w", err)
	}
	return j, nil
}

// Run reloads the key set every RefreshInterval, and sooner when a token
// names an unknown key, until ctx is done. A fixed JWKS needs no Run.
func (j *JWT) Run(ctx context.Context) error {
	if j.file == "" && j.url == "" && !j.discover {
		<-ctx.Done()
		return nil
	}
	for {
		wait := j.interval
		if err := j.Refresh(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			j.log.Warn("cannot load JWT signing keys", logs.KeyIssuer, j.issuer, logs.KeyError, err)
			if j.keys.Load() == nil {
				wait = j.minInterval // nothing to verify with yet: retry soon
			}
		}
		t := j.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		case <-j.kick:
			t.Stop()
		}
	}
}

// Refresh reloads the key set now. On failure the previous keys stay.
func (j *JWT) Refresh(ctx context.Context) error {
	j.lastRefresh.Store(j.clock.Now().UnixNano())
	var (
		set *jose.JSONWebKeySet
		err error
	)
	switch {
	case j.file != "":
		set, err = readJWKSFile(j.file)
	case j.url != "":
		set, err = fetchJWKS(ctx, j.hc, j.url)
	case j.discover:
		var u string
		if u, err = discoverJWKSURL(ctx, j.hc, j.issuer); err == nil {
			set, err = fetchJWKS(ctx, j.hc, u)
		}
	default:
		return nil
	}
	if err != nil {
		j.refreshes.WithLabelValues("error").Inc()
		return err
	}
	j.refreshes.WithLabelValues("ok").Inc()
	j.keys.Store(set)
	return nil
}

// requestRefresh asks Run to reload the keys, at most once per
// MinRefreshInterval, so that a flood of tokens with made-up key ids cannot
// turn into a flood of fetches.
func (j *JWT) requestRefresh() {
	if j.file == "" && j.url == "" && !j.discover {
		return
	}
	if j.clock.Now().UnixNano()-j.lastRefresh.Load() < int64(j.minInterval) {
		return
	}
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

// Authenticate verifies creds.Token. It returns ErrNoCredentials when there
// is no token, and an Unauthenticated error naming what is wrong otherwise.
//
// A token verified before, with the key set still in use, is answered from
// the cache without checking its signature again: on a CA that signs a
// certificate per request, the token's signature check would otherwise cost
// as much as the CSR's. Only successes are cached, keyed by the token's
// SHA-256, until the earlier of the token's exp and CacheTTL.
func (j *JWT) Authenticate(_ context.Context, creds Credentials) (*Caller, error) {
	if creds.Token == "" {
		return nil, ErrNoCredentials
	}
	if err := CheckTokenSize(creds.Token, MaxTokenSize); err != nil {
		return nil, err
	}
	var key [32]byte
	if j.cache != nil {
		key = tokenKey(creds.Token)
		if v, ok := j.cache.get(key); ok {
			if vt := v.(*verifiedToken); vt.keys == j.keys.Load() {
				j.cacheHits.Inc()
				c := vt.caller // callers may not share one mutable value
				return &c, nil
			}
		}
	}
	keys := j.keys.Load()
	caller, err := j.verify(creds.Token, keys)
	if err != nil {
		return nil, err
	}
	if j.cache != nil {
		if ttl := min(j.cacheTTL, caller.Expiry.Sub(j.clock.Now())); ttl > 0 {
			j.cache.add(key, &verifiedToken{keys: keys, caller: *caller}, ttl)
		}
	}
	return caller, nil
}

// verify checks token's signature against keys and its claims.
func (j *JWT) verify(token string, keys *jose.JSONWebKeySet) (*Caller, error) {
	tok, err := jwt.ParseSigned(token, identity.SignatureAlgorithms)
	if err != nil || len(tok.Headers) != 1 {
		return nil, ca.Errorf(ca.KindUnauthenticated, "jwt: the token is not a JWT signed with a supported algorithm")
	}
	if keys == nil {
		return nil, ca.Errorf(ca.KindUnavailable, "jwt: the issuer's signing keys are not loaded yet")
	}
	hdr := tok.Headers[0]
	var (
		std       jwt.Claims
		kc        identity.Claims
		known     bool
		signature bool
	)
	for i := range keys.Keys {
		k := &keys.Keys[i]
		if hdr.KeyID != "" && k.KeyID != hdr.KeyID || k.Algorithm != "" && k.Algorithm != hdr.Algorithm {
			continue
		}
		known = true
		// Claims without a destination checks the signature only; the
		// claims are decoded below, so that a payload that does not decode
		// (an exp of 2^62) is reported as such, not as a bad signature.
		if tok.Claims(k.Key) == nil {
			signature = true
			break
		}
	}
	if !known {
		// Only a token from our issuer may trigger a reload.
		var c jwt.Claims
		if tok.UnsafeClaimsWithoutVerification(&c) == nil && (j.issuer == "" || c.Issuer == j.issuer) {
			j.requestRefresh()
		}
		return nil, ca.Errorf(ca.KindUnauthenticated, "jwt: the token is signed by an unknown key")
	}
	if !signature {
		return nil, ca.Errorf(ca.KindUnauthenticated, "jwt: bad token signature")
	}
	// The signature verified: the payload is the issuer's.
	if err := tok.UnsafeClaimsWithoutVerification(&std, &kc); err != nil {
		return nil, decodeError(tok, err)
	}
	now := j.clock.Now()
	if err := std.ValidateWithLeeway(jwt.Expected{Issuer: j.issuer, AnyAudience: j.audiences, Time: now}, j.leeway); err != nil {
		return nil, claimError(err, j.audiences)
	}
	if std.Expiry == nil {
		return nil, ca.Errorf(ca.KindUnauthenticated, "jwt: the token has no expiry (exp)")
	}
	if j.maxLife >= 0 {
		from := now
		if std.IssuedAt != nil {
			from = std.IssuedAt.Time()
		}
		if life := std.Expiry.Time().Sub(from); life > j.maxLife+j.leeway {
			return nil, ca.Errorf(ca.KindUnauthenticated, "jwt: the token's expiry (exp) is %s past its issue time, more than the %s allowed", life.Round(time.Second), j.maxLife)
		}
	}
	caller, ok := callerFromClaims(&kc)
	if !ok {
		return nil, ca.Errorf(ca.KindUnauthenticated, "jwt: the token lacks the kubernetes.io namespace and service account claims")
	}
	if std.Subject != "" && std.Subject != caller.Account().Username() {
		return nil, ca.Errorf(ca.KindUnauthenticated, "jwt: the token's subject does not match its kubernetes.io claims")
	}
	caller.Method = MethodJWT
	caller.Expiry = std.Expiry.Time()
	return &caller, nil
}

// decodeError names the claim of a signed token that does not decode,
// such as an exp beyond 2^62 seconds, which go-jose refuses.
func decodeError(tok *jwt.JSONWebToken, err error) error {
	if errors.Is(err, jwt.ErrUnmarshalNumericDate) {
		var dates struct {
			Exp json.RawMessage `json:"exp"`
			Nbf json.RawMessage `json:"nbf"`
			Iat json.RawMessage `json:"iat"`
		}
		if tok.UnsafeClaimsWithoutVerification(&dates) == nil {
			for _, d := range []struct {
				raw  json.RawMessage
				name string
			}{{dates.Exp, "invalid expiry (exp)"}, {dates.Nbf, "invalid not-before time (nbf)"}, {dates.Iat, "invalid issue time (iat)"}} {
				var n jwt.NumericDate
				if d.raw != nil && n.UnmarshalJSON(d.raw) != nil {
					return ca.Wrap(ca.KindUnauthenticated, err, "jwt: the token has an "+d.name)
				}
			}
		}
	}
	return ca.Wrap(ca.KindUnauthenticated, err, "jwt: the token's claims are malformed")
}

// claimError turns a go-jose validation error into a safe message.
func claimError(err error, audiences jwt.Audience) error {
	msg := "jwt: invalid token claims"
	switch {
	case errors.Is(err, jwt.ErrExpired):
		msg = "jwt: the token has expired"
	case errors.Is(err, jwt.ErrNotValidYet):
		msg = "jwt: the token is not valid yet (nbf)"
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		msg = "jwt: the token is issued in the future (iat)"
	case errors.Is(err, jwt.ErrInvalidIssuer):
		msg = "jwt: the token's issuer is not trusted"
	case errors.Is(err, jwt.ErrInvalidAudience):
		msg = fmt.Sprintf("jwt: the token is not valid for audience %v", []string(audiences))
	}
	return ca.Wrap(ca.KindUnauthenticated, err, msg)
}
