package election

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
)

// Defaults, the values Kubernetes' own controllers use.
const (
	DefaultLeaseName     = "meshid-ca"
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// retryMargin is how much longer than RetryPeriod RenewDeadline must be, so
// that a holder gets at least one retry after a failed renewal before it
// steps down (the margin client-go's election requires too, so
// configurations valid there stay valid here).
const retryMargin = 1.2

// Config configures an Elector.
type Config struct {
	Client    kubeclient.Interface // required
	Namespace string               // the CA's namespace, where the Lease lives; required
	Candidate

	// Lead runs while this replica holds the Lease. Its context is cancelled
	// when leadership is lost or Run's context ends; Lead must return soon
	// after. Required.
	Lead func(ctx context.Context)

	Clock      clock.Clock           // nil = the wall clock
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil = no metrics
	// LeaderMetric names the gauge that is 1 while this replica leads:
	// each Lease its own, so that two electors share a registry. Default
	// DefaultLeaderMetric (the CA's Lease).
	LeaderMetric string
}

// DefaultLeaderMetric is the leader gauge of the CA's own Lease.
const DefaultLeaderMetric = "meshid_ca_leader"

// Candidate is a replica's part in an election: which Lease, who it is,
// and the election's timing. The components that elect (ca/kube's
// Controller, ca/kube/jwtsecret's Store) embed it in their Config and hand
// it on as it is.
type Candidate struct {
	LeaseName string // "" = DefaultLeaseName
	Identity  string // this replica's identity, e.g. the pod name; required

	// LeaseDuration is how long the others wait, from when they last saw
	// the Lease change, before they take it over. It is written to the Lease
	// in whole seconds. 0 = DefaultLeaseDuration.
	LeaseDuration time.Duration
	// RenewDeadline is how long the holder keeps leading without a
	// successful renewal; below LeaseDuration. 0 = DefaultRenewDeadline.
	RenewDeadline time.Duration
	// RetryPeriod is the time between two attempts to take or renew the
	// Lease. 0 = DefaultRetryPeriod.
	RetryPeriod time.Duration
}

// Elector campaigns for the Lease and runs Config.Lead while leading.
type Elector struct {
	cfg    Config
	clock  clock.Clock
	leases kubeclient.LeaseInterface
	log    *slog.Logger
	leader prometheus.Gauge

	mu      sync.Mutex
	seen    observation // the Lease as last read or written
	leading bool
}

// New validates cfg and returns an Elector. It starts nothing.
func New(cfg Config) (*Elector, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("election: Client is required")
	case cfg.Namespace == "":
		return nil, errors.New("election: Namespace is required")
	case cfg.Identity == "":
		return nil, errors.New("election: Identity is required")
	case cfg.Lead == nil:
		return nil, errors.New("election: Lead is required")
	}
	cfg.LeaseName = cmp.Or(cfg.LeaseName, DefaultLeaseName)
	cfg.LeaseDuration = cmp.Or(cfg.LeaseDuration, DefaultLeaseDuration)
	cfg.RenewDeadline = cmp.Or(cfg.RenewDeadline, DefaultRenewDeadline)
	cfg.RetryPeriod = cmp.Or(cfg.RetryPeriod, DefaultRetryPeriod)
	switch {
	case cfg.RetryPeriod < 0 || cfg.RenewDeadline < 0 || cfg.LeaseDuration < 0:
		return nil, fmt.Errorf("election: negative duration (lease %s, renew deadline %s, retry period %s)", cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod)
	case cfg.LeaseDuration < time.Second:
		return nil, fmt.Errorf("election: lease duration %s is under the Lease's 1s resolution", cfg.LeaseDuration)
	case cfg.RenewDeadline >= cfg.LeaseDuration:
		return nil, fmt.Errorf("election: renew deadline %s must be shorter than the lease duration %s", cfg.RenewDeadline, cfg.LeaseDuration)
	case float64(cfg.RenewDeadline) <= retryMargin*float64(cfg.RetryPeriod):
		return nil, fmt.Errorf("election: renew deadline %s leaves no room to retry every %s", cfg.RenewDeadline, cfg.RetryPeriod)
	}
	log := logs.OrDiscard(cfg.Logger)
	e := &Elector{
		cfg:    cfg,
		clock:  clock.OrReal(cfg.Clock),
		leases: cfg.Client.CoordinationV1().Leases(cfg.Namespace),
		log:    log.With(logs.KeyComponent, "election", logs.KeyLease, cfg.Namespace+"/"+cfg.LeaseName, logs.KeyIdentity, cfg.Identity),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: cmp.Or(cfg.LeaderMetric, DefaultLeaderMetric),
			Help: "1 while this CA replica holds the Lease " + cfg.LeaseName + ", else 0.",
		}),
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(e.leader); err != nil {
			return nil, fmt.Errorf("election: register metrics: %w", err)
		}
	}
	return e, nil
}

// IsLeader reports whether this replica currently runs the leader tasks.
func (e *Elector) IsLeader() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leading
}

// Leader returns the identity of the last observed Lease holder, or "".
func (e *Elector) Leader() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seen.holder
}

// Run campaigns until ctx ends. Each time it wins the Lease it runs
// Config.Lead, and it waits for Lead to return before campaigning again, so
// two Lead calls of one Elector never overlap. When ctx ends it releases
// the Lease if it holds it. It returns nil when ctx ends.
func (e *Elector) Run(ctx context.Context) error {
	e.log.Info("campaigning for leadership")
	for {
		at, ok := e.acquire(ctx)
		if !ok {
			break
		}
		e.lead(ctx, at)
		if ctx.Err() == nil {
			e.log.Info("campaigning for leadership again")
		}
	}
	e.release()
	return nil
}

// acquire tries to take the Lease every RetryPeriod until it does (true,
// and when the winning attempt started) or ctx ends (false).
func (e *Elector) acquire(ctx context.Context) (time.Time, bool) {
	for ctx.Err() == nil {
		start := e.clock.Now()
		if e.try(ctx, e.cfg.RetryPeriod) {
			return start, true
		}
		if !e.wait(ctx, e.cfg.RetryPeriod) {
			break
		}
	}
	return time.Time{}, false
}

// lead runs Lead and renews the Lease every RetryPeriod until ctx ends, the
// Lease is seen held by someone else, or RenewDeadline has passed since the
// last successful renewal; then it cancels Lead's context and waits for
// Lead to return. renewed is when the write that won the Lease started:
// the deadline counts from before the write, so it never runs late by the
// time a request took.
func (e *Elector) lead(ctx context.Context, renewed time.Time) {
	leadCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	e.setLeading(true)
	e.log.Info("started leading")
	go func() {
		defer close(done)
		e.cfg.Lead(leadCtx)
	}()
	for {
		deadline := renewed.Add(e.cfg.RenewDeadline)
		if !e.wait(ctx, min(e.cfg.RetryPeriod, deadline.Sub(e.clock.Now()))) {
			break
		}
		start := e.clock.Now()
		if !start.Before(deadline) {
			e.log.Warn("stepping down: the Lease was not renewed within the renew deadline", logs.KeyDeadline, e.cfg.RenewDeadline)
			break
		}
		if e.try(ctx, deadline.Sub(start)) {
			renewed = start
			continue
		}
		if h := e.Leader(); h != e.cfg.Identity {
			e.log.Warn("stepping down: the Lease has another holder", logs.KeyHolder, h)
			break
		}
	}
	cancel()
	<-done
	e.setLeading(false)
	e.log.Info("stopped leading")
}

// wait waits d on the clock; false when ctx ended first.
func (e *Elector) wait(ctx context.Context, d time.Duration) bool {
	t := e.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

func (e *Elector) setLeading(v bool) {
	e.mu.Lock()
	e.leading = v
	e.mu.Unlock()
	if v {
		e.leader.Set(1)
	} else {
		e.leader.Set(0)
	}
}
