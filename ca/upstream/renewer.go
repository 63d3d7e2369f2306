package upstream

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// Defaults of a RenewerConfig.
const (
	// DefaultLifetime is the intermediate lifetime meshid asks for (the
	// upstream may give another: cfssl's profile expiry decides).
	DefaultLifetime = 7 * 24 * time.Hour
	// DefaultRenewAt renews at half the intermediate's life.
	DefaultRenewAt = 0.5
	// DefaultMintTimeout bounds one mint.
	DefaultMintTimeout = 30 * time.Second
	// DefaultRetryMin and DefaultRetryMax bound the backoff between failed
	// mints (doubled at each failure, with ±20% jitter).
	DefaultRetryMin = 5 * time.Second
	DefaultRetryMax = 5 * time.Minute
	// DefaultRootCheck is how often an upstream that is a RootSource is
	// asked for its roots between mints.
	DefaultRootCheck = 10 * time.Minute
)

// Target takes each new CA: *rotation.Manager, never the authority.
type Target interface {
	SetBundle(*keystore.Bundle) error
}

// RenewerConfig configures a Renewer.
type RenewerConfig struct {
	// Upstream mints. Required.
	Upstream Authority
	// Name says which upstream in logs (the URL, no secret).
	Name string
	// TrustDomain is the intermediate's SPIFFE ID (spiffe://TD). Required.
	TrustDomain spiffeid.TrustDomain
	// KeyType of each new intermediate key; "" is certs.ECP256.
	KeyType certs.KeyType
	// Keys makes each new intermediate key; nil is SoftwareKeys.
	Keys KeySource
	// Lifetime asked for; 0 is DefaultLifetime.
	Lifetime time.Duration
	// RenewAt is the fraction of the intermediate's life at which it is
	// renewed, in (0,1); 0 is DefaultRenewAt.
	RenewAt float64
	// MintTimeout bounds one mint, and one read of the upstream's roots;
	// 0 is DefaultMintTimeout.
	MintTimeout time.Duration
	// RootCheck is how often the upstream's roots are read between mints
	// when the upstream is a RootSource; a change mints at once. 0 is
	// DefaultRootCheck.
	RootCheck time.Duration
	// Save keeps an accepted CA (the state directory) so that a restart
	// does not mint again; nil keeps nothing. An error is logged.
	Save func(*keystore.Bundle) error

	Clock      clock.Clock           // nil is the real clock
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil registers no metrics
}

// Renewer keeps the CA's intermediate minted by the upstream.
type Renewer struct {
	cfg RenewerConfig
	log *slog.Logger

	mu          sync.Mutex
	current     *keystore.Bundle // the newest intermediate accepted
	since       time.Time        // when current was accepted; zero if unknown
	target      Target
	failures    int
	lastFailure time.Time
	lastError   string
	retryAt     time.Time // the next attempt while failing
	mints       *prometheus.CounterVec

	wake       chan struct{}          // a root change: renew now
	minting    bool                   // renew is under way: a root check waits for its answer
	fetched    string                 // certsKey of the roots the upstream last reported; "" before
	mintedFor  string                 // fetched when a mint answered with other roots: not asked again
	rootChecks *prometheus.CounterVec // by result
}

// NewRenewer validates cfg and applies its defaults.
func NewRenewer(cfg RenewerConfig) (*Renewer, error) {
	if cfg.Upstream == nil {
		return nil, errors.New("upstream: RenewerConfig.Upstream is required")
	}
	if cfg.TrustDomain.IsZero() {
		return nil, errors.New("upstream: RenewerConfig.TrustDomain is required")
	}
	if cfg.Lifetime < 0 || cfg.RenewAt < 0 || cfg.RenewAt >= 1 || cfg.MintTimeout < 0 || cfg.RootCheck < 0 {
		return nil, fmt.Errorf("upstream: lifetime %v must not be negative and the renewal point %v must be within (0,1)", cfg.Lifetime, cfg.RenewAt)
	}
	if cfg.Lifetime == 0 {
		cfg.Lifetime = DefaultLifetime
	}
	if cfg.RenewAt == 0 {
		cfg.RenewAt = DefaultRenewAt
	}
	if cfg.MintTimeout == 0 {
		cfg.MintTimeout = DefaultMintTimeout
	}
	if cfg.RootCheck == 0 {
		cfg.RootCheck = DefaultRootCheck
	}
	if cfg.KeyType == "" {
		cfg.KeyType = certs.ECP256
	}
	if cfg.Keys == nil {
		cfg.Keys = SoftwareKeys{}
	}
	cfg.Clock = clock.OrReal(cfg.Clock)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	r := &Renewer{
		cfg: cfg,
		log: cfg.Logger.With(logs.KeyComponent, "ca-upstream", logs.KeyUpstream, cfg.Name),
		mints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_ca_upstream_mints_total",
			Help: "Intermediates asked of the upstream CA, by result (ok, failed, refused).",
		}, []string{"result"}),
		wake: make(chan struct{}, 1),
		rootChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_ca_upstream_root_checks_total",
			Help: "Reads of the upstream CA's roots between mints, by result (unchanged, changed: a mint follows at once, failed).",
		}, []string{"result"}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.mints, r.rootChecks, r.gauges()} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("upstream: metrics: %w", err)
			}
		}
	}
	return r, nil
}

// minLife is the shortest lifetime an answer may have: the renewal
// period of the lifetime asked for.
func (r *Renewer) minLife() time.Duration {
	return time.Duration(r.cfg.RenewAt * float64(r.cfg.Lifetime))
}

// Mint asks the upstream for a new intermediate with a new key and returns
// it as a CA bundle once Check accepts it. It changes nothing: the key
// made for a mint that fails is destroyed (a module key).
func (r *Renewer) Mint(ctx context.Context) (_ *keystore.Bundle, err error) {
	key, _, err := r.cfg.Keys.NewKey(r.cfg.KeyType)
	if err != nil {
		return nil, fmt.Errorf("upstream: new intermediate key: %w", err)
	}
	defer func() {
		if err != nil {
			r.destroy(key)
		}
	}()
	id := spiffeid.RequireFromPath(r.cfg.TrustDomain, "")
	u, _ := url.Parse(id.String())
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "meshid intermediate CA", Organization: []string{r.cfg.TrustDomain.Name()}},
		URIs:    []*url.URL{u},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("upstream: CSR: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.MintTimeout)
	defer cancel()
	m, err := r.cfg.Upstream.MintX509CA(ctx, csr, r.cfg.Lifetime)
	if err != nil {
		r.mints.WithLabelValues("failed").Inc()
		return nil, err
	}
	err = Check(m, key.Public(), r.cfg.Clock.Now(), r.minLife())
	if err == nil {
		err = CheckNames(m.Chain[0], r.cfg.TrustDomain)
	}
	if err != nil {
		r.mints.WithLabelValues("refused").Inc()
		return nil, err
	}
	r.mints.WithLabelValues("ok").Inc()
	return &keystore.Bundle{Cert: m.Chain[0], Key: key, Intermediates: m.Chain[1:], Roots: m.Roots}, nil
}

// Start sets the CA in use when the CA starts and the Target of the next
// ones; minted is when current was minted (zero when it was loaded).
func (r *Renewer) Start(current *keystore.Bundle, minted time.Time, t Target) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.current, r.since, r.target = current, minted, t
}

// Current is the newest intermediate accepted.
func (r *Renewer) Current() *keystore.Bundle {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.current
}

// RenewAt is when b, accepted at since (zero: unknown), is due for
// renewal: at the RenewAt fraction of its life, counted from the later of
// its NotBefore and since, so that an upstream whose clock lags (or that
// backdates far) cannot make a new intermediate due at once.
func (r *Renewer) RenewAt(b *keystore.Bundle, since time.Time) time.Time {
	from := b.Cert.NotBefore
	if since.After(from) {
		from = since
	}
	return certs.RenewAt(from, b.Cert.NotAfter, r.cfg.RenewAt, 0)
}

// Run renews the intermediate at its renewal point until ctx ends, and at
// once when the upstream (a RootSource) reports roots other than the newest
// intermediate's. A mint that fails or is refused leaves the current
// intermediate signing and is retried with backoff; Start must have been
// called.
func (r *Renewer) Run(ctx context.Context) error {
	if rs, ok := r.cfg.Upstream.(RootSource); ok {
		done := make(chan struct{})
		defer func() { <-done }()
		go func() {
			defer close(done)
			clock.Loop(ctx, r.cfg.Clock, r.cfg.RootCheck, nil, func(ctx context.Context) time.Duration {
				r.checkRoots(ctx, rs)
				return r.cfg.RootCheck
			})
		}()
	}
	clock.Loop(ctx, r.cfg.Clock, r.untilRenewal(), r.wake, r.step)
	return nil
}

// checkRoots reads the upstream's roots and wakes Run's renewal when they
// are not the newest intermediate's.
func (r *Renewer) checkRoots(ctx context.Context, rs RootSource) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.MintTimeout)
	defer cancel()
	roots, err := rs.FetchRoots(ctx)
	if err != nil {
		if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			r.rootChecks.WithLabelValues("failed").Inc()
			r.log.Warn("the upstream CA's roots could not be read; the current intermediate keeps signing",
				logs.KeyError, err, logs.KeyRetryIn, r.cfg.RootCheck)
		}
		return
	}
	r.mu.Lock()
	r.fetched = certsKey(roots)
	changed, cur := r.rootsChangedLocked(), r.current
	r.mu.Unlock()
	if !changed {
		r.rootChecks.WithLabelValues("unchanged").Inc()
		return
	}
	r.rootChecks.WithLabelValues("changed").Inc()
	r.log.Info("the upstream CA's roots changed: minting a new intermediate now; the rotation publishes both roots before it signs",
		logs.KeyRoots, len(roots), logs.KeySerial, cur.Cert.SerialNumber.Text(16))
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// rootsChangedLocked reports whether the upstream last reported roots
// other than the newest intermediate's, that no mint has answered with
// other roots again (an upstream whose mints keep returning other roots
// than it reports is not asked again and again: the renewal point
// still comes), while no mint is under way (its answer comes first).
func (r *Renewer) rootsChangedLocked() bool {
	return !r.minting && r.current != nil && r.fetched != "" && r.fetched != certsKey(r.current.Roots) && r.fetched != r.mintedFor
}

// sameCertSet reports whether a and b hold the same certificates, in any
// order.
func sameCertSet(a, b []*x509.Certificate) bool {
	return certsKey(a) == certsKey(b)
}

// certsKey is a key of a set of certificates: their DER, sorted.
func certsKey(cs []*x509.Certificate) string {
	ders := make([]string, 0, len(cs))
	for _, c := range cs {
		ders = append(ders, string(c.Raw))
	}
	slices.Sort(ders)
	ders = slices.Compact(ders)
	return strings.Join(ders, "\x00")
}

func (r *Renewer) untilRenewal() time.Duration {
	r.mu.Lock()
	b, since := r.current, r.since
	r.mu.Unlock()
	return r.RenewAt(b, since).Sub(r.cfg.Clock.Now())
}

// step renews once, when it is due or the upstream's roots changed, and
// returns the time to the next attempt.
func (r *Renewer) step(ctx context.Context) time.Duration {
	now := r.cfg.Clock.Now()
	r.mu.Lock()
	due := !now.Before(r.RenewAt(r.current, r.since)) || (r.failures > 0 && !now.Before(r.retryAt)) || r.rootsChangedLocked()
	r.mu.Unlock()
	if !due {
		return r.untilRenewal() // a root change another mint has already answered
	}
	if err := r.renew(ctx); err != nil {
		if ctx.Err() != nil {
			return time.Hour
		}
		return r.failed(err)
	}
	return r.untilRenewal()
}

func (r *Renewer) renew(ctx context.Context) error {
	r.mu.Lock()
	r.minting = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.minting = false
		r.mu.Unlock()
	}()
	b, err := r.Mint(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	t := r.target
	r.mu.Unlock()
	if err := t.SetBundle(b); err != nil {
		r.destroy(b.Key)
		return fmt.Errorf("upstream: the rotation refused the new intermediate: %w", err)
	}
	if r.cfg.Save != nil {
		if err := r.cfg.Save(b); err != nil {
			r.log.Error("the new intermediate signs but could not be saved: a restart will mint again", logs.KeyError, err)
		}
	}
	now := r.cfg.Clock.Now()
	r.mu.Lock()
	r.current, r.since, r.failures, r.lastError = b, now, 0, ""
	if r.fetched != "" && r.fetched != certsKey(b.Roots) {
		r.mintedFor = r.fetched
	}
	r.mu.Unlock()
	r.log.Info("new intermediate minted by the upstream and offered to the rotation",
		logs.KeySubject, b.Cert.Subject.String(), logs.KeySerial, b.Cert.SerialNumber.Text(16),
		logs.KeyNotAfter, b.Cert.NotAfter, logs.KeyRenewAt, r.RenewAt(b, now))
	return nil
}

// destroy erases key, made for an intermediate that will not sign, from
// its module; a software key needs nothing.
func (r *Renewer) destroy(key crypto.Signer) {
	if d, ok := key.(Destroyer); ok {
		if err := d.Destroy(); err != nil {
			r.log.Error("the key made for a mint that failed could not be destroyed", logs.KeyKey, fmt.Sprint(key), logs.KeyError, err)
		}
	}
}

// failed records a failed renewal and returns the backoff before the next.
func (r *Renewer) failed(err error) time.Duration {
	now := r.cfg.Clock.Now()
	r.mu.Lock()
	n, cur := r.failures+1, r.current
	d := DefaultRetryMin << min(n-1, 16)
	d = min(d, DefaultRetryMax)
	d = time.Duration(float64(d) * (0.8 + 0.4*mrand.Float64()))
	r.failures, r.lastFailure, r.lastError, r.retryAt = n, now, err.Error(), now.Add(d)
	r.mu.Unlock()
	r.log.Error("the upstream CA did not renew the intermediate; the current one keeps signing",
		logs.KeyError, err, logs.KeyAttempt, n, logs.KeyRetryIn, d.Round(time.Second),
		logs.KeyCANotAfter, cur.Cert.NotAfter, logs.KeyRemaining, cur.Cert.NotAfter.Sub(r.cfg.Clock.Now()).Round(time.Second))
	return d
}

// Status is where the renewal stands, for `meshid certs status`.
type Status struct {
	// Upstream is the upstream's URL (it holds no secret).
	Upstream string `json:"upstream"`
	// Subject, Serial and NotAfter name the newest intermediate accepted.
	Subject  string    `json:"subject"`
	Serial   string    `json:"serial"`
	NotAfter time.Time `json:"not_after"`
	// RenewAt is when it is due for renewal.
	RenewAt time.Time `json:"renew_at"`
	// RetryAt is the next attempt while mints fail (after a backoff of at
	// most DefaultRetryMax); zero otherwise.
	RetryAt time.Time `json:"retry_at,omitzero"`
	// Failures counts the failed or refused mints since the last one
	// accepted; LastError is the last one's error (the upstream's answer)
	// while Failures > 0, at LastFailure.
	Failures    int       `json:"failures"`
	LastFailure time.Time `json:"last_failure,omitzero"`
	LastError   string    `json:"last_error,omitempty"`
}

// Status returns where the renewal stands; ok is false before Start.
func (r *Renewer) Status() (Status, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.current
	if b == nil {
		return Status{}, false
	}
	st := Status{
		Upstream: r.cfg.Name, Subject: b.Cert.Subject.String(), Serial: b.Cert.SerialNumber.Text(16),
		NotAfter: b.Cert.NotAfter.UTC(), RenewAt: r.RenewAt(b, r.since).UTC(),
		Failures: r.failures, LastFailure: r.lastFailure, LastError: r.lastError,
	}
	if r.failures > 0 {
		st.RetryAt = r.retryAt.UTC()
	}
	return st, true
}

// gauges exports the intermediate's remaining life and the last failure.
func (r *Renewer) gauges() prometheus.Collector {
	return &gaugeSet{r: r}
}

type gaugeSet struct{ r *Renewer }

var (
	remainingDesc = prometheus.NewDesc("meshid_ca_upstream_intermediate_remaining_seconds",
		"Seconds left of the intermediate the upstream CA minted last.", nil, nil)
	lifetimeDesc = prometheus.NewDesc("meshid_ca_upstream_intermediate_lifetime_seconds",
		"The whole validity of the intermediate the upstream CA minted last (NotAfter - NotBefore): remaining / lifetime is the fraction of its life left.", nil, nil)
	failureDesc = prometheus.NewDesc("meshid_ca_upstream_last_mint_failure_timestamp_seconds",
		"When the last mint failed or was refused (0: none since the start).", nil, nil)
	failuresDesc = prometheus.NewDesc("meshid_ca_upstream_consecutive_failures",
		"Failed or refused mints since the last one accepted.", nil, nil)
)

func (g *gaugeSet) Describe(ch chan<- *prometheus.Desc) {
	ch <- remainingDesc
	ch <- lifetimeDesc
	ch <- failureDesc
	ch <- failuresDesc
}

func (g *gaugeSet) Collect(ch chan<- prometheus.Metric) {
	r := g.r
	r.mu.Lock()
	cur, last, n := r.current, r.lastFailure, r.failures
	r.mu.Unlock()
	if cur != nil {
		ch <- prometheus.MustNewConstMetric(remainingDesc, prometheus.GaugeValue, cur.Cert.NotAfter.Sub(r.cfg.Clock.Now()).Seconds())
		ch <- prometheus.MustNewConstMetric(lifetimeDesc, prometheus.GaugeValue, cur.Cert.NotAfter.Sub(cur.Cert.NotBefore).Seconds())
	}
	ts := 0.0
	if !last.IsZero() {
		ts = float64(last.Unix())
	}
	ch <- prometheus.MustNewConstMetric(failureDesc, prometheus.GaugeValue, ts)
	ch <- prometheus.MustNewConstMetric(failuresDesc, prometheus.GaugeValue, float64(n))
}
