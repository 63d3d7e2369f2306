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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshid/meshid/ca/kube/election/internal/leaderelection"
	"github.com/meshid/meshid/ca/kubeclient"
)

// Defaults, the values client-go's examples and the core controllers use.
const (
	DefaultLeaseName     = "meshid-ca"
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// Config configures an Elector.
type Config struct {
	Client    kubeclient.Interface // required
	Namespace string               // the CA's namespace, where the Lease lives; required
	LeaseName string               // "" = DefaultLeaseName
	Identity  string               // this replica's identity, e.g. the pod name; required

	LeaseDuration time.Duration // 0 = DefaultLeaseDuration
	RenewDeadline time.Duration // 0 = DefaultRenewDeadline
	RetryPeriod   time.Duration // 0 = DefaultRetryPeriod

	// Lead runs while this replica holds the Lease. Its context is cancelled
	// when leadership is lost or Run's context ends; Lead must return soon
	// after. Required.
	Lead func(ctx context.Context)

	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil = no metrics
}

// Elector campaigns for the Lease and runs Config.Lead while leading.
type Elector struct {
	cfg    Config
	log    *slog.Logger
	leader prometheus.Gauge

	mu      sync.Mutex
	current *leaderelection.LeaderElector
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
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Elector{cfg: cfg, log: log.With("component", "election", "lease", cfg.Namespace+"/"+cfg.LeaseName, "identity", cfg.Identity)}
	// Build one elector now so that bad durations fail here, not in Run.
	if _, err := e.newLeaderElector(&campaign{done: make(chan struct{})}); err != nil {
		return nil, err
	}
	e.leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "meshid_ca_leader",
		Help: "1 while this CA replica holds the leader Lease, else 0.",
	})
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
	le := e.current
	e.mu.Unlock()
	if le == nil {
		return ""
	}
	return le.GetLeader()
}

// Run campaigns until ctx ends. Each time it wins the Lease it runs
// Config.Lead, and it waits for Lead to return before campaigning again, so
// two Lead calls of one Elector never overlap. It returns nil when ctx ends.
func (e *Elector) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		c := &campaign{done: make(chan struct{})}
		le, err := e.newLeaderElector(c)
		if err != nil {
			return err
		}
		e.mu.Lock()
		e.current = le
		e.mu.Unlock()
		e.log.Info("campaigning for leadership")
		le.Run(ctx)
		// le.Run returns once leadership is lost (or never won because ctx
		// ended). client-go runs the leading callback in its own goroutine:
		// wait for it to finish, or stop it from starting Lead at all.
		if c.end() {
			<-c.done
		}
		e.setLeading(false)
	}
	return nil
}

// campaign is one le.Run: it makes sure Lead does not start after le.Run
// returned, and that Run waits for a started Lead.
type campaign struct {
	mu      sync.Mutex
	ended   bool
	started bool
	done    chan struct{}
}

// start reports whether Lead may run; false once the campaign ended.
func (c *campaign) start() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return false
	}
	c.started = true
	return true
}

// end marks the campaign over and reports whether Lead was started.
func (c *campaign) end() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended = true
	return c.started
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

func (e *Elector) newLeaderElector(c *campaign) (*leaderelection.LeaderElector, error) {
	lock := &leaderelection.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.cfg.Namespace, Name: e.cfg.LeaseName},
		Client:     e.cfg.Client.CoordinationV1(),
		LockConfig: leaderelection.ResourceLockConfig{Identity: e.cfg.Identity},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            e.cfg.LeaseName,
		LeaseDuration:   e.cfg.LeaseDuration,
		RenewDeadline:   e.cfg.RenewDeadline,
		RetryPeriod:     e.cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				if !c.start() {
					return
				}
				defer close(c.done)
				e.setLeading(true)
				e.log.Info("started leading")
				e.cfg.Lead(ctx)
				e.setLeading(false)
				e.log.Info("stopped leading")
			},
			// Required by client-go; Lead's return is what matters here.
			OnStoppedLeading: func() {},
			OnNewLeader: func(id string) {
				if id != e.cfg.Identity {
					e.log.Info("observed leader", "leader", id)
				}
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("election: %w", err)
	}
	return le, nil
}
