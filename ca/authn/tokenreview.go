package authn

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/identity"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/metric"
)

// Defaults of TokenReviewConfig.
const (
	DefaultTokenAudience    = "istio-ca"
	DefaultCacheSize        = 10000
	DefaultCacheTTL         = time.Minute
	DefaultNegativeCacheTTL = 5 * time.Second
	DefaultReviewTimeout    = 10 * time.Second
)

// Kubernetes names used in a TokenReview answer.
const (
	serviceAccountsGroup = "system:serviceaccounts"
	extraPodName         = "authentication.kubernetes.io/pod-name"
	extraPodUID          = "authentication.kubernetes.io/pod-uid"
	extraNodeName        = "authentication.kubernetes.io/node-name"
)

// TokenReviewConfig configures NewTokenReview.
type TokenReviewConfig struct {
	// Client talks to the Kubernetes API server. Required. The API
	// server's 429s (client-go retries them) are counted and named in a
	// failed review's message when its transport reports them: the Auth
	// client of ca/kubeclient, or a rest.Config wrapped with its
	// CountThrottled.
	Client kubeclient.Interface
	// Audiences are sent as spec.audiences; the review must return at
	// least one of them. Default ["istio-ca"].
	Audiences []string
	// CacheSize bounds the number of cached reviews. Default 10000.
	CacheSize int
	// CacheTTL is the longest a successful review is reused (it is also
	// never reused past the token's exp). Default 1m.
	CacheTTL time.Duration
	// NegativeCacheTTL is how long a rejection is reused. Default 5s;
	// negative means rejections are not cached.
	NegativeCacheTTL time.Duration
	// Timeout bounds one call to the API server. Default 10s.
	Timeout time.Duration
	// Issuers are the token issuers (iss) the API server is the authority
	// for. Its answer on their tokens is final in a chain (NewChain): a
	// token it rejects, or cannot review (Unavailable), is not given to
	// the offline JWT check. A token of another issuer is left to the
	// next authenticator without calling the API server. Default (empty):
	// the API server owns every token.
	Issuers    []string
	Clock      clock.Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// TokenReview authenticates Kubernetes service-account tokens by asking the
// API server (TokenReview API). Results are cached by the SHA-256 of the
// token, so the token itself is never kept in memory longer than a call.
type TokenReview struct {
	client      kubeclient.Interface
	audiences   []string
	issuers     []string // empty: every token
	ttl, negTTL time.Duration
	timeout     time.Duration
	clock       clock.Clock
	log         *slog.Logger
	cache       *tokenCache // SHA-256 of the token -> reviewResult
	flight      singleflight.Group

	requests  *prometheus.CounterVec
	cacheHits prometheus.Counter
	latency   prometheus.Histogram
	throttled prometheus.Counter // 429 answers, retried attempts included
}

type reviewResult struct {
	caller *Caller // nil when rejected
	err    error
}

// NewTokenReview validates cfg and returns a TokenReview authenticator.
func NewTokenReview(cfg TokenReviewConfig) (*TokenReview, error) {
	if cfg.Client == nil {
		return nil, errors.New("authn: TokenReviewConfig.Client is required")
	}
	if len(cfg.Audiences) == 0 {
		cfg.Audiences = []string{DefaultTokenAudience}
	}
	if slices.Contains(cfg.Audiences, "") {
		return nil, errors.New("authn: empty token audience")
	}
	if slices.Contains(cfg.Issuers, "") {
		return nil, errors.New("authn: empty TokenReview issuer")
	}
	if cfg.CacheSize < 0 {
		return nil, fmt.Errorf("authn: negative TokenReview cache size %d", cfg.CacheSize)
	}
	cfg.CacheSize = cmp.Or(cfg.CacheSize, DefaultCacheSize)
	// A negative TTL or timeout means the default too.
	cfg.CacheTTL = cmp.Or(max(cfg.CacheTTL, 0), DefaultCacheTTL)
	cfg.NegativeCacheTTL = cmp.Or(cfg.NegativeCacheTTL, DefaultNegativeCacheTTL)
	cfg.Timeout = cmp.Or(max(cfg.Timeout, 0), DefaultReviewTimeout)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	clk := clock.OrReal(cfg.Clock)
	t := &TokenReview{
		client:    cfg.Client,
		audiences: slices.Clone(cfg.Audiences),
		issuers:   slices.Clone(cfg.Issuers),
		ttl:       cfg.CacheTTL,
		negTTL:    cfg.NegativeCacheTTL,
		timeout:   cfg.Timeout,
		clock:     clk,
		log:       cfg.Logger,
		cache:     newTokenCache(cfg.CacheSize, clk),
		requests: metric.CounterVec("meshid_ca_tokenreview_requests_total",
			"TokenReview calls to the Kubernetes API server, by result (authenticated, rejected, error).",
			"result", "authenticated", "rejected", "error"),
		cacheHits: metric.Counter("meshid_ca_tokenreview_cache_hits_total",
			"Token authentications answered from the TokenReview cache."),
		latency: metric.Histogram("meshid_ca_tokenreview_duration_seconds",
			"Latency of TokenReview calls to the Kubernetes API server.",
			prometheus.ExponentialBuckets(0.001, 2, 14)),
		throttled: metric.Counter("meshid_ca_tokenreview_throttled_total",
			"HTTP 429 answers of the Kubernetes API server (its flow control rejecting the call) to TokenReview calls, every attempt counted, those client-go retried included."),
	}
	if err := metric.Register(cfg.Registerer, t.requests, t.cacheHits, t.latency, t.throttled); err != nil {
		return nil, fmt.Errorf("authn: register TokenReview metrics: %w", err)
	}
	return t, nil
}

// Authenticate reviews creds.Token. It returns ErrNoCredentials when there
// is no token or its issuer is not one of Issuers, Unauthenticated when the
// API server rejects it or it does not name a service account, and
// Unavailable when the API server cannot answer. Both errors are final for
// the token (FinalForToken).
func (t *TokenReview) Authenticate(ctx context.Context, creds Credentials) (*Caller, error) {
	if creds.Token == "" {
		return nil, ErrNoCredentials
	}
	if err := CheckTokenSize(creds.Token, MaxTokenSize); err != nil {
		return nil, err
	}
	if !t.owns(creds.Token) {
		return nil, ErrNoCredentials
	}
	c, err := t.authenticate(ctx, creds)
	return c, FinalForToken(err)
}

// owns reports whether the API server is the authority for token. The iss
// claim is read without checking the signature: it only chooses who
// judges the token, and a forged iss leaves it to the offline check of
// that issuer's keys.
func (t *TokenReview) owns(token string) bool {
	if len(t.issuers) == 0 {
		return true
	}
	iss, ok := unverifiedIssuer(token)
	return ok && slices.Contains(t.issuers, iss)
}

func (t *TokenReview) authenticate(ctx context.Context, creds Credentials) (*Caller, error) {
	key := tokenKey(creds.Token)
	if v, ok := t.cache.get(key); ok {
		t.cacheHits.Inc()
		return v.(reviewResult).result()
	}
	// Concurrent requests with the same token (a restarting pod's many
	// containers, a retry storm) share one API call.
	token := creds.Token
	ch := t.flight.DoChan(string(key[:]), func() (any, error) {
		if v, ok := t.cache.get(key); ok {
			t.cacheHits.Inc()
			return v, nil
		}
		r, err := t.review(ctx, token)
		if err != nil {
			return nil, err
		}
		t.store(key, r)
		return r, nil
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Val.(reviewResult).result()
	case <-ctx.Done():
		return nil, ca.Wrap(ca.KindUnavailable, ctx.Err(), "tokenreview: the request ended before the token was reviewed")
	}
}

func (r reviewResult) result() (*Caller, error) {
	if r.err != nil {
		return nil, r.err
	}
	c := *r.caller // callers may not share one mutable value
	return &c, nil
}

// store caches r: a success until the earlier of the token's exp and the
// cache TTL; a rejection for the negative TTL.
func (t *TokenReview) store(key [32]byte, r reviewResult) {
	if r.err != nil {
		if t.negTTL > 0 {
			t.cache.add(key, r, t.negTTL)
		}
		return
	}
	ttl := t.ttl
	if !r.caller.Expiry.IsZero() {
		ttl = min(ttl, r.caller.Expiry.Sub(t.clock.Now()))
	}
	if ttl > 0 {
		t.cache.add(key, r, ttl)
	}
}

// review calls the API server. A non-nil error means it could not decide
// (Unavailable); a rejection is returned inside the result.
func (t *TokenReview) review(ctx context.Context, token string) (reviewResult, error) {
	// The review is shared by every concurrent request with this token
	// (singleflight), so the first caller going away must not fail it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.timeout)
	defer cancel()
	// The API server's flow control answers 429 to what it cannot queue,
	// and client-go retries that silently: the client's transport
	// (ca/kubeclient) reports each one here, so that the metric and a
	// failed review's message tell throttling from a slow API server.
	var throttled atomic.Int32
	ctx = kubeclient.OnThrottled(ctx, func() {
		throttled.Add(1)
		t.throttled.Inc()
	})
	start := t.clock.Now()
	resp, err := t.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: t.audiences},
	}, metav1.CreateOptions{})
	t.latency.Observe(t.clock.Now().Sub(start).Seconds())
	if err != nil {
		// Whatever went wrong (unreachable, 5xx, timeout, or the CA not
		// being allowed to create TokenReviews), the caller's token was
		// not judged: never answer Unauthenticated for it, and do not
		// cache. The error text of client-go does not contain the token.
		t.requests.WithLabelValues("error").Inc()
		n := throttled.Load()
		if n == 0 {
			t.log.Warn("TokenReview call failed", logs.KeyError, err)
			return reviewResult{}, ca.Wrap(ca.KindUnavailable, err, "tokenreview: the Kubernetes API server could not review the token")
		}
		// Still Unavailable: a 429 says nothing about the token.
		msg := t.throttledMessage(n, ctx.Err() != nil, err)
		t.log.Warn("TokenReview call failed: the Kubernetes API server throttled it", logs.KeyHTTP429, n, logs.KeyReason, msg, logs.KeyError, err)
		return reviewResult{}, ca.Wrap(ca.KindUnavailable, err, msg)
	}
	caller, rejectErr := t.check(&resp.Status)
	if rejectErr != nil {
		t.requests.WithLabelValues("rejected").Inc()
		t.log.Debug("TokenReview rejected a token", logs.KeyReason, rejectErr, logs.KeyStatusError, resp.Status.Error)
		return reviewResult{err: rejectErr}, nil
	}
	t.requests.WithLabelValues("authenticated").Inc()
	if exp, ok := unverifiedExpiry(token); ok {
		// The API server verified the signature, so exp is trustworthy
		// here; we still only use it to bound the cache and to report
		// Caller.Expiry.
		caller.Expiry = exp
	}
	return reviewResult{caller: caller}, nil
}

// throttledMessage is the caller's message for a review that failed after
// n 429 answers: it ran out of time (expired), client-go stopped retrying
// (its retries are bounded), or the API server failed otherwise after.
func (t *TokenReview) throttledMessage(n int32, expired bool, err error) string {
	times := "once"
	if n > 1 {
		times = fmt.Sprintf("%d times", n)
	}
	head := "tokenreview: the Kubernetes API server throttled the review (HTTP 429, " + times + ")"
	switch {
	case expired:
		return head + " and it did not finish within " + t.timeout.String()
	case apierrors.IsTooManyRequests(err):
		return head + " until client-go stopped retrying"
	default:
		return head + ", then could not review the token"
	}
}

// check turns a TokenReview status into a Caller or a rejection.
func (t *TokenReview) check(st *authenticationv1.TokenReviewStatus) (*Caller, error) {
	if !st.Authenticated {
		return nil, ca.Errorf(ca.KindUnauthenticated, "tokenreview: the Kubernetes API server did not authenticate the token")
	}
	sa, ok := identity.FromUsername(st.User.Username)
	if !ok {
		return nil, ca.Errorf(ca.KindUnauthenticated, "tokenreview: the token does not belong to a service account")
	}
	if !slices.Contains(st.User.Groups, serviceAccountsGroup) {
		return nil, ca.Errorf(ca.KindUnauthenticated, "tokenreview: the token's user is not in group %s", serviceAccountsGroup)
	}
	if !slices.ContainsFunc(st.Audiences, func(a string) bool { return slices.Contains(t.audiences, a) }) {
		return nil, ca.Errorf(ca.KindUnauthenticated, "tokenreview: the token is not valid for audience %v", t.audiences)
	}
	c := &Caller{Namespace: sa.Namespace, ServiceAccount: sa.Name, Method: MethodTokenReview}
	if v := st.User.Extra[extraPodName]; len(v) == 1 {
		c.PodName = v[0]
	}
	if v := st.User.Extra[extraPodUID]; len(v) == 1 {
		c.PodUID = v[0]
	}
	if v := st.User.Extra[extraNodeName]; len(v) == 1 {
		c.NodeName = v[0]
	}
	return c, nil
}
