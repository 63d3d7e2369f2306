package rotation

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// Defaults of a Config.
const (
	// DefaultPropagation is how long a prepared CA waits before it signs:
	// twice the agents' root refresh interval (the agent re-reads its
	// --ca-root every 5 minutes, sds/secretcache.DefaultRootRefresh), so
	// that every agent has pushed the new root as ROOTCA before the first
	// leaf chains to it. A mounted istio-ca-root-cert ConfigMap adds the
	// kubelet's sync delay (about a minute), which the factor 2 covers.
	DefaultPropagation = 10 * time.Minute
	// DefaultRetireAfter keeps the old roots trusted for the longest leaf
	// the old CA can have signed (ca.DefaultMaxTTL) plus ca.DefaultClockSkew.
	DefaultRetireAfter = ca.DefaultMaxTTL + ca.DefaultClockSkew
	// DefaultRootRotationThreshold prepares a new self-signed root when less
	// than a year of the current one (10 years, keystore.DefaultRootTTL) is
	// left.
	DefaultRootRotationThreshold = 365 * 24 * time.Hour
	// retryDelay spaces the retries of a step that failed (a prepared CA
	// that expired before it could be activated, a root that could not be
	// made).
	retryDelay = time.Minute
)

// ErrNothingPrepared is returned by Activate when no CA is prepared.
var ErrNothingPrepared = errors.New("rotation: no CA is prepared; nothing to activate")

// ErrAlreadyPrepared is returned by RotateRoot while a CA is prepared.
var ErrAlreadyPrepared = errors.New("rotation: a new CA is already prepared; activate it first")

// ErrPlugged is returned by RotateRoot when the CA is plugged in (no
// Config.NewRoot): replace its files instead.
var ErrPlugged = errors.New("rotation: the CA is plugged in (--ca-dir or a Secret); rotate it by replacing its files")

// Target receives every bundle the rotation decides on: *ca.Authority.
type Target interface {
	SetBundle(*keystore.Bundle) error
}

// Config configures a Manager.
type Config struct {
	// Current is the CA in use when the Manager starts (already in
	// Target). Required.
	Current *keystore.Bundle
	// Target receives the bundle to sign with: the signing CA, with the
	// union of the trusted roots. Required.
	Target Target
	// Check validates an offered CA before it is accepted (ca.Authority's
	// Check: validity, and a probe leaf signed with its key). nil checks
	// keystore.Bundle.Validate at the clock's time.
	Check func(*keystore.Bundle) error
	// Propagation is the time between prepared and active; 0 takes
	// DefaultPropagation.
	Propagation time.Duration
	// RetireAfter is the time between active and retired: the longest
	// leaf TTL the CA issues plus clock skew. 0 takes DefaultRetireAfter.
	RetireAfter time.Duration
	// NewRoot makes a new self-signed CA, for RotateRoot and for the
	// automatic rotation of a root nearing its expiry. nil means the CA is
	// plugged in and only new files rotate it.
	NewRoot func() (*keystore.Bundle, error)
	// RootRotationThreshold, with NewRoot, prepares a new root when less
	// than this is left of the signing root. 0 takes
	// DefaultRootRotationThreshold; negative turns it off.
	RootRotationThreshold time.Duration
	// Retiring are roots trusted at start besides Current's (the union a
	// self-signed state directory kept in root-cert.pem): they retire
	// RetireAfter after the start unless Restore knows an earlier time.
	Retiring []*x509.Certificate
	// Store keeps the rotation's state (a Record) after every step, for
	// Restore after a restart and, in Kubernetes, for Follow on the other
	// replicas. nil keeps nothing.
	Store Store

	Clock      clock.Clock           // nil is the real clock
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil registers no metrics
}

// Manager is the CA rotation state machine. Its methods are safe for
// concurrent use; Run drives the timed steps.
type Manager struct {
	cfg   Config
	log   *slog.Logger
	clock clock.Clock
	wake  chan struct{}

	mu    sync.Mutex
	st    state
	stuck string    // why the last offer or step failed; "" when not stuck
	retry time.Time // when a failed timed step is tried again
	steps map[string]int
	// dirty is set when st changed since the Store last saved it, and
	// saveRetry is when a failed save is tried again.
	dirty     bool
	saveRetry time.Time
	// shared is the last record Follow accepted: the leader's clock,
	// which a CA prepared later on this replica adopts.
	shared     *record
	sharedData []byte // shared as received, to skip a replay
	// started is set once the Target holds the start's roots (startLocked).
	started bool
	// changed is closed, and replaced, at every change of the Status.
	changed chan struct{}
}

// Store keeps the encoded Record of a Manager. Save is called from Run,
// never under the Manager's lock, with the newest state; an error is
// logged and the save retried.
type Store interface {
	Save(ctx context.Context, data []byte) error
}

// New validates cfg and applies its defaults. It starts nothing and does
// not touch Target.
func New(cfg Config) (*Manager, error) {
	if cfg.Current == nil || cfg.Current.Cert == nil {
		return nil, errors.New("rotation: Config.Current is required")
	}
	if cfg.Target == nil {
		return nil, errors.New("rotation: Config.Target is required")
	}
	if cfg.Propagation < 0 || cfg.RetireAfter < 0 {
		return nil, errors.New("rotation: negative propagation or retirement delay")
	}
	if cfg.Propagation == 0 {
		cfg.Propagation = DefaultPropagation
	}
	if cfg.RetireAfter == 0 {
		cfg.RetireAfter = DefaultRetireAfter
	}
	if cfg.RootRotationThreshold == 0 {
		cfg.RootRotationThreshold = DefaultRootRotationThreshold
	}
	cfg.Clock = clock.OrReal(cfg.Clock)
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	if cfg.Check == nil {
		cfg.Check = func(b *keystore.Bundle) error { return b.Validate(cfg.Clock.Now()) }
	}
	r := &Manager{
		cfg:     cfg,
		log:     cfg.Logger.With(logs.KeyComponent, "ca-rotation"),
		clock:   cfg.Clock,
		wake:    make(chan struct{}, 1),
		st:      state{current: cfg.Current, since: cfg.Clock.Now()},
		steps:   map[string]int{},
		dirty:   cfg.Store != nil,
		changed: make(chan struct{}),
	}
	for _, c := range cfg.Retiring {
		if !containsCert(r.st.current.Roots, c) && !r.st.isRetiring(c) {
			r.st.retiring = append(r.st.retiring, retiring{cert: c, at: r.st.since.Add(cfg.RetireAfter)})
		}
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(&collector{r: r}); err != nil {
			return nil, fmt.Errorf("rotation: metrics: %w", err)
		}
	}
	return r, nil
}

// Bundle returns the newest CA the Manager accepted: the prepared one, or
// the one signing. A keystore.DirWatcher compares it with the directory to
// see whether anything changed.
func (r *Manager) Bundle() *keystore.Bundle {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.st.next != nil {
		return r.st.next
	}
	return r.st.current
}

// SetBundle offers a new CA (the contents of a changed --ca-dir, a new
// Secret, a new self-signed root). A CA whose roots are all trusted already
// signs at once; any other is prepared and signs after Propagation. A CA
// that does not pass Check is refused: the returned error says why, the
// CA in use keeps signing, and the rotation is stuck until a valid CA is
// offered.
func (r *Manager) SetBundle(b *keystore.Bundle) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b == nil || b.Cert == nil {
		return r.refuseLocked(errors.New("rotation: no CA certificate"))
	}
	if err := r.cfg.Check(b); err != nil {
		return r.refuseLocked(err)
	}
	now := r.clock.Now()
	s := r.st
	switch {
	case sameBundle(b, s.current) || sameBundle(b, s.next):
		if r.stuck != "" {
			r.stuck = ""
			r.changedLocked()
		}
		return nil
	case subset(b.Roots, s.settled()):
		// Every root of the new CA is trusted already (an intermediate
		// rotated under the same root): nothing to propagate.
		if err := r.commitLocked(s.switchTo(b, now, r.cfg.RetireAfter), "switched"); err != nil {
			return r.refuseLocked(err)
		}
		r.log.Info("new CA signs at once: its roots are already trusted",
			logs.KeySubject, b.Cert.Subject.String(), logs.KeyNotAfter, b.Cert.NotAfter)
	default:
		ns := s.clone()
		ns.next, ns.preparedAt, ns.activateAt, ns.since = b, now, now.Add(r.cfg.Propagation), now
		ns, _ = r.adoptLocked(ns, now) // the leader's clock, if it prepared b first
		if ns.next == nil {
			// The leader signs with b already: this replica follows at once.
			if err := r.followActivationLocked(ns); err != nil {
				return r.refuseLocked(err)
			}
			break
		}
		if err := r.commitLocked(ns, "prepared"); err != nil {
			return r.refuseLocked(err)
		}
		r.log.Info("new CA prepared: its roots are in the trust bundle; the current CA still signs",
			logs.KeySubject, b.Cert.Subject.String(), logs.KeyActivateAt, ns.activateAt)
	}
	r.stuck = ""
	return nil
}

// Refuse records that a new CA was offered but could not even be loaded
// (a keystore.DirWatcher calls it with the error naming the file): the
// rotation is stuck until a valid CA arrives.
func (r *Manager) Refuse(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.refuseLocked(err)
}

func (r *Manager) refuseLocked(err error) error {
	r.stuck = err.Error()
	r.steps["refused"]++
	r.changedLocked()
	r.log.Error("new CA refused; the current CA keeps signing", logs.KeyError, err)
	return err
}

// Activate makes the prepared CA sign now, before Propagation has passed
// (`meshid certs activate`). Leaves it signs are trusted only by the
// consumers that already hold its roots.
func (r *Manager) Activate() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.st.next == nil {
		return ErrNothingPrepared
	}
	return r.activateLocked(r.clock.Now())
}

func (r *Manager) activateLocked(now time.Time) error {
	next := r.st.next
	if err := r.commitLocked(r.st.switchTo(next, now, r.cfg.RetireAfter), "activated"); err != nil {
		r.stuck = fmt.Sprintf("activating %q: %v", next.Cert.Subject.String(), err)
		r.retry = now.Add(retryDelay)
		r.changedLocked()
		r.log.Error("prepared CA could not be activated; the current CA keeps signing", logs.KeyError, err)
		return err
	}
	r.stuck = ""
	r.log.Info("new CA active: it signs; the old roots stay trusted until retired",
		logs.KeySubject, next.Cert.Subject.String(), logs.KeyRetireAt, now.Add(r.cfg.RetireAfter))
	return nil
}

// RotateRoot makes a new self-signed root and prepares it (`meshid certs
// rotate-root`). It fails with ErrPlugged for a plugged-in CA and with
// ErrAlreadyPrepared while a CA is prepared.
func (r *Manager) RotateRoot() error {
	if r.cfg.NewRoot == nil {
		return ErrPlugged
	}
	r.mu.Lock()
	prepared := r.st.next != nil
	r.mu.Unlock()
	if prepared {
		return ErrAlreadyPrepared
	}
	b, err := r.cfg.NewRoot()
	if err != nil {
		r.Refuse(fmt.Errorf("rotation: new root: %w", err))
		return err
	}
	r.mu.Lock()
	r.steps["root_created"]++
	r.mu.Unlock()
	return r.SetBundle(b)
}

// commitLocked hands ns's bundle to the Target and, when it is accepted,
// makes ns the state.
func (r *Manager) commitLocked(ns state, step string) error {
	if err := r.cfg.Target.SetBundle(ns.bundle()); err != nil {
		return err
	}
	r.started = true
	r.st = ns
	r.steps[step]++
	r.dirty = r.cfg.Store != nil
	r.changedLocked()
	return nil
}

// Changed returns a channel that is closed at the next change of the
// Status (a step, a refusal, a restored or followed state): a caller
// waits on it rather than polling.
func (r *Manager) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// changedLocked wakes Run and every caller waiting on Changed.
func (r *Manager) changedLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run takes the timed steps (activation, retirement, a new root before the
// current one expires) until ctx ends.
func (r *Manager) Run(ctx context.Context) error {
	r.mu.Lock()
	if err := r.startLocked(); err != nil {
		r.log.Error("the roots trusted at start could not be added", logs.KeyError, err)
	}
	r.mu.Unlock()
	for {
		r.tick()
		r.save(ctx)
		at, ok := r.nextWake()
		var fire <-chan time.Time
		var timer clock.Timer
		if ok {
			timer = r.clock.NewTimer(at.Sub(r.clock.Now()))
			fire = timer.C()
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			r.finalSave(ctx)
			return nil
		case <-r.wake:
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// tick takes every step that is due.
func (r *Manager) tick() {
	now := r.clock.Now()
	r.mu.Lock()
	if now.Before(r.retry) {
		r.mu.Unlock()
		return
	}
	if r.st.next != nil && !now.Before(r.st.activateAt) {
		_ = r.activateLocked(now)
	}
	if ns, dropped := r.st.retire(now); len(dropped) > 0 {
		if err := r.commitLocked(ns, "retired"); err != nil {
			r.stuck = fmt.Sprintf("retiring old roots: %v", err)
			r.retry = now.Add(retryDelay)
			r.changedLocked()
			r.log.Error("old roots could not be retired", logs.KeyError, err)
		} else {
			for _, c := range dropped {
				r.log.Info("old root retired: it left the trust bundle", logs.KeySubject, c.Subject.String(), logs.KeySerial, c.SerialNumber.Text(16))
			}
		}
	}
	due := r.rootDueLocked(now)
	r.mu.Unlock()
	if due {
		r.log.Info("the self-signed root nears its expiry: preparing a new one", logs.KeyThreshold, r.cfg.RootRotationThreshold)
		if err := r.RotateRoot(); err != nil {
			r.mu.Lock()
			r.retry = now.Add(retryDelay)
			r.mu.Unlock()
		}
	}
}

// rootDueLocked reports whether a new self-signed root must be prepared.
func (r *Manager) rootDueLocked(now time.Time) bool {
	at, ok := r.rootRotationAtLocked()
	return ok && !now.Before(at)
}

func (r *Manager) rootRotationAtLocked() (time.Time, bool) {
	if r.cfg.NewRoot == nil || r.cfg.RootRotationThreshold < 0 || r.st.next != nil {
		return time.Time{}, false
	}
	return SigningRoot(r.st.current).NotAfter.Add(-r.cfg.RootRotationThreshold), true
}

// nextWake is when Run must next look: the earliest due step, or a retry.
func (r *Manager) nextWake() (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, at, ok := r.nextStepLocked()
	if ok && at.Before(r.retry) {
		at = r.retry
	}
	if r.dirty && (!ok || r.saveRetry.Before(at)) {
		at, ok = r.saveRetry, true
	}
	return at, ok
}

// nextStepLocked names the next timed step and its time.
func (r *Manager) nextStepLocked() (string, time.Time, bool) {
	var (
		name string
		at   time.Time
	)
	consider := func(n string, t time.Time) {
		if name == "" || t.Before(at) {
			name, at = n, t
		}
	}
	if r.st.next != nil {
		consider("activate", r.st.activateAt)
	}
	for _, o := range r.st.retiring {
		consider("retire", o.until())
	}
	if t, ok := r.rootRotationAtLocked(); ok {
		consider("rotate-root", t)
	}
	return name, at, name != ""
}

// SigningRoot is the root that b's signing certificate chains to (the
// first that verifies its chain's top), or its first root.
func SigningRoot(b *keystore.Bundle) *x509.Certificate {
	top := b.Cert
	if n := len(b.Intermediates); n > 0 {
		top = b.Intermediates[n-1]
	}
	for _, root := range b.Roots {
		if root.Equal(top) || top.CheckSignatureFrom(root) == nil {
			return root
		}
	}
	return b.Roots[0]
}
