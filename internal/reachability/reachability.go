package reachability

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// Defaults of Config.
const (
	DefaultInterval = 5 * time.Second
	DefaultTimeout  = 5 * time.Second
	DefaultGrace    = 30 * time.Second
)

// Config configures New.
type Config struct {
	// Name names the dependency in errors and logs ("the Kubernetes API
	// server"). Required.
	Name string
	// Probe asks the dependency once: nil when it answered. Required. It
	// gets a context that ends after Timeout.
	Probe func(ctx context.Context) error
	// Interval is the time between the end of a probe and the next.
	// Default DefaultInterval.
	Interval time.Duration
	// Timeout bounds one probe. Default DefaultTimeout.
	Timeout time.Duration
	// Grace is how long the dependency may go without answering before
	// Ready reports it. Default DefaultGrace.
	Grace  time.Duration
	Clock  clock.Clock  // nil is the real clock
	Logger *slog.Logger // nil discards logs
}

// Tracker probes a dependency and remembers when it last answered.
type Tracker struct {
	cfg   Config
	clock clock.Clock
	log   *slog.Logger

	mu       sync.Mutex
	lastOK   time.Time // zero until the first answer
	lastErr  error     // of the latest probe; nil when it answered
	probed   bool      // a probe has completed
	reported bool      // the outage is logged (once per outage)
}

// New validates cfg and applies its defaults. It probes nothing: Run does.
func New(cfg Config) (*Tracker, error) {
	if cfg.Name == "" || cfg.Probe == nil {
		return nil, errors.New("reachability: Config.Name and Config.Probe are required")
	}
	if cfg.Interval < 0 || cfg.Timeout < 0 || cfg.Grace < 0 {
		return nil, errors.New("reachability: negative interval, timeout or grace")
	}
	cfg.Interval = cmp.Or(cfg.Interval, DefaultInterval)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.Grace = cmp.Or(cfg.Grace, DefaultGrace)
	return &Tracker{cfg: cfg, clock: clock.OrReal(cfg.Clock), log: logs.OrDiscard(cfg.Logger)}, nil
}

// Grace is the configured grace (defaults applied).
func (t *Tracker) Grace() time.Duration { return t.cfg.Grace }

// Run probes at once, then every Interval, until ctx ends.
func (t *Tracker) Run(ctx context.Context) error {
	for {
		t.probe(ctx)
		timer := t.clock.NewTimer(t.cfg.Interval)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C():
		}
	}
}

// probe runs one probe and records its result.
func (t *Tracker) probe(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	err := t.cfg.Probe(pctx)
	cancel()
	if ctx.Err() != nil {
		return // stopping: a cancelled probe says nothing about the dependency
	}
	t.Observe(err)
}

// Observe records an answer (err nil) or a failure to get one, as a probe
// does; callers that talk to the dependency anyway may feed it their
// results.
func (t *Tracker) Observe(err error) {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.probed = true
	t.lastErr = err
	if err == nil {
		if t.reported {
			t.log.Info(t.cfg.Name+" answers again", logs.KeyUnreachableFor, now.Sub(t.lastOK).Round(time.Millisecond).String())
		}
		t.lastOK, t.reported = now, false
		return
	}
	if !t.reported && t.unavailableLocked(now) {
		t.reported = true
		t.log.Warn(t.cfg.Name+" does not answer: not ready", logs.KeyGrace, t.cfg.Grace.String(), logs.KeyError, err)
	}
}

// Reachable reports whether the latest probe got an answer.
func (t *Tracker) Reachable() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.probed && t.lastErr == nil
}

// Ready returns nil while the dependency answers, or has answered within
// the last Grace; otherwise why not: no answer yet since the start, or
// none for Grace (with the latest error).
func (t *Tracker) Ready() error {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case !t.probed:
		return fmt.Errorf("waiting for the first answer of %s", t.cfg.Name)
	case t.lastOK.IsZero():
		return fmt.Errorf("%s has not answered since the start: %w", t.cfg.Name, t.lastErr)
	case t.unavailableLocked(now):
		return fmt.Errorf("%s has not answered for %s (grace %s): %w",
			t.cfg.Name, now.Sub(t.lastOK).Round(time.Second), t.cfg.Grace, t.lastErr)
	}
	return nil
}

// unavailableLocked: the latest probe failed and the last answer is Grace
// old or older (or there was none).
func (t *Tracker) unavailableLocked(now time.Time) bool {
	return t.lastErr != nil && (t.lastOK.IsZero() || now.Sub(t.lastOK) >= t.cfg.Grace)
}
