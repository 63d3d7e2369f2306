package jwtsecret

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/meshid/meshid/ca/jwtkeys"
	"github.com/meshid/meshid/ca/kube/election"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/metric"
)

// Names, type and defaults.
const (
	DefaultSecretName = "meshid-jwt-keys"
	DefaultLeaseName  = "meshid-jwt-keys"
	// DataKey holds the encoded Set in the Secret.
	DataKey = "jwt-keys.json"
	// SecretType marks the Secret as this package's.
	SecretType corev1.SecretType = "meshid.io/jwt-signing-keys"
	// DefaultRetryInterval is the leader's wait after a failed write.
	DefaultRetryInterval = 5 * time.Second
	// DefaultResync is the longest the leader waits between two looks at
	// the Secret, whatever the schedule says.
	DefaultResync = 5 * time.Minute
)

// ErrNotLoaded is returned by Keys and Ready until a Set has been loaded.
var ErrNotLoaded = errors.New("jwtsecret: no JWT signing keys loaded from the Secret yet")

// Config configures a Store.
type Config struct {
	Client    kubeclient.Interface // the controllers' client; required
	Namespace string               // the CA's namespace; required
	// Candidate is this Store's Lease (LeaseName "" = DefaultLeaseName),
	// this replica (Identity, the pod name; required) and the election's
	// timing (0 = the election package's defaults).
	election.Candidate

	SecretName string // "" = DefaultSecretName

	// Lifetime of each key; 0 means jwtkeys.DefaultLifetime.
	Lifetime time.Duration
	// TTL of the tokens: how long a retired key stays published. Required.
	TTL time.Duration

	RetryInterval time.Duration // 0 = DefaultRetryInterval
	Resync        time.Duration // 0 = DefaultResync

	Clock      clock.Clock           // nil = real time
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil = no metrics
}

// Store loads the shared Set and, on the leader, writes it. Create it with
// New, then Run it.
type Store struct {
	cfg     Config
	clock   clock.Clock
	log     *slog.Logger
	elector *election.Elector
	loads   *prometheus.CounterVec
	writes  prometheus.Counter

	current  atomic.Pointer[jwtkeys.Set]
	loadedCh chan struct{} // closed at the first load
	poke     chan struct{} // (len 1) the Secret changed: the leader looks again

	mu       sync.Mutex
	lastData string // the Secret data last parsed, loaded or not
	informer cache.SharedIndexInformer
}

// New validates cfg and returns a Store. It starts nothing.
func New(cfg Config) (*Store, error) {
	// Client, Namespace and the Candidate are checked by election.New
	// below, before anything is registered.
	if cfg.RetryInterval < 0 || cfg.Resync < 0 {
		return nil, errors.New("jwtsecret: intervals must not be negative")
	}
	var err error
	if cfg.Lifetime, err = jwtkeys.CheckLifetime(cfg.Lifetime, cfg.TTL); err != nil {
		return nil, fmt.Errorf("jwtsecret: %w", err)
	}
	cfg.SecretName = cmp.Or(cfg.SecretName, DefaultSecretName)
	cfg.LeaseName = cmp.Or(cfg.LeaseName, DefaultLeaseName)
	cfg.RetryInterval = cmp.Or(cfg.RetryInterval, DefaultRetryInterval)
	cfg.Resync = cmp.Or(cfg.Resync, DefaultResync)
	log := logs.OrDiscard(cfg.Logger)
	s := &Store{
		cfg:      cfg,
		clock:    clock.OrReal(cfg.Clock),
		log:      log.With(logs.KeyComponent, "jwtsecret", logs.KeySecret, cfg.Namespace+"/"+cfg.SecretName),
		loadedCh: make(chan struct{}),
		poke:     make(chan struct{}, 1),
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_ca_jwt_key_secret_loads_total",
			Help: "Versions of the JWT signing key Secret seen, by result (loaded or invalid).",
		}, []string{"result"}),
		writes: metric.Counter("meshid_ca_jwt_key_secret_writes_total",
			"JWT signing key Secrets created or updated by this replica as the leader."),
	}
	// The CA's own Lease (ca/kube) has the default leader gauge; this
	// Lease's is LeaderMetric, so the two share a registry.
	s.elector, err = election.New(election.Config{
		Client:    cfg.Client,
		Namespace: cfg.Namespace,
		Candidate: cfg.Candidate,
		Lead:      s.lead,
		Logger:    log,

		Registerer:   cfg.Registerer,
		LeaderMetric: LeaderMetric,
	})
	if err != nil {
		return nil, fmt.Errorf("jwtsecret: %w", err)
	}
	if err := metric.Register(cfg.Registerer, s.loads, s.writes); err != nil {
		return nil, fmt.Errorf("jwtsecret: register metrics: %w", err)
	}
	return s, nil
}

// LeaderMetric is the gauge that is 1 while this replica holds the JWT
// key Lease (and so writes the key Secret).
const LeaderMetric = "meshid_ca_jwt_key_leader"

// Keys returns the last valid Set loaded from the Secret, or ErrNotLoaded.
// It never rotates: the Issuer picks the key that signs now from the Set.
func (s *Store) Keys() (*jwtkeys.Set, error) {
	if set := s.current.Load(); set != nil {
		return set, nil
	}
	return nil, ErrNotLoaded
}

// Ready returns nil once a Set has been loaded, else ErrNotLoaded.
func (s *Store) Ready() error {
	_, err := s.Keys()
	return err
}

// WaitForKeys blocks until a Set has been loaded or ctx ends.
func (s *Store) WaitForKeys(ctx context.Context) error {
	select {
	case <-s.loadedCh:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("jwtsecret: waiting for the JWT signing keys: %w", ctx.Err())
	}
}

// IsLeader reports whether this replica writes the Secret.
func (s *Store) IsLeader() bool { return s.elector.IsLeader() }

// Run watches the Secret and campaigns for the Lease until ctx ends. Only
// one Run per Store.
func (s *Store) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.informer != nil {
		s.mu.Unlock()
		return errors.New("jwtsecret: Run called twice")
	}
	s.informer = kubeclient.NamedSecretInformer(s.cfg.Client, s.cfg.Namespace, s.cfg.SecretName)
	inf := s.informer
	s.mu.Unlock()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.load(o) },
		UpdateFunc: func(_, o any) { s.load(o) },
		DeleteFunc: func(any) { s.log.Warn("the JWT signing key Secret was deleted; keeping the keys in use"); s.wake() },
	})
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil // ctx ended
	}
	return s.elector.Run(ctx)
}

// wake asks the leader to look at the Secret now.
func (s *Store) wake() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// load parses a version of the Secret and uses it if it is valid.
func (s *Store) load(obj any) {
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	data := sec.Data[DataKey]
	s.mu.Lock()
	defer s.mu.Unlock()
	if string(data) == s.lastData {
		return // a resync, or the leader's own write seen again
	}
	s.lastData = string(data)
	log := s.log.With(logs.KeyResourceVersion, sec.ResourceVersion)
	set, err := jwtkeys.Parse(data)
	if err != nil {
		s.loads.WithLabelValues("invalid").Inc()
		log.Error("ignoring an invalid JWT signing key Secret; keeping the keys in use", logs.KeyError, err)
		s.wake() // the leader replaces it
		return
	}
	s.loads.WithLabelValues("loaded").Inc()
	if s.current.Swap(set) == nil {
		close(s.loadedCh)
	}
	log.Info("loaded the JWT signing keys", logs.KeyKeys, len(set.Keys))
	s.wake()
}

// lead keeps the Secret's Set current while this replica holds the Lease.
func (s *Store) lead(ctx context.Context) {
	clock.Loop(ctx, s.clock, 0, s.poke, func(ctx context.Context) time.Duration {
		wait, err := s.reconcile(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return 0 // Loop returns
			}
			s.log.Error("cannot write the JWT signing key Secret; retrying", logs.KeyError, err)
			wait = s.cfg.RetryInterval
		}
		return min(max(wait, time.Second), s.cfg.Resync)
	})
}

// reconcile reads the Secret, writes the rotated Set when it differs (or
// the Secret is missing or invalid) and returns how long to wait until the
// next change is due.
func (s *Store) reconcile(ctx context.Context) (time.Duration, error) {
	secrets := s.cfg.Client.CoreV1().Secrets(s.cfg.Namespace)
	sec, err := secrets.Get(ctx, s.cfg.SecretName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		sec, err = nil, nil
	}
	if err != nil {
		return 0, err
	}
	var cur *jwtkeys.Set
	if sec != nil {
		if cur, err = jwtkeys.Parse(sec.Data[DataKey]); err != nil {
			s.log.Warn("replacing an invalid JWT signing key Secret", logs.KeyError, err)
			cur = nil
		}
	}
	last := cur
	if cur == nil {
		// Missing or invalid: write back the last good keys this replica
		// loaded, so the tokens signed with them keep validating; new keys
		// only when there are none.
		cur = s.current.Load()
	}
	now := s.clock.Now()
	next, changed, err := jwtkeys.Rotate(cur, now, s.cfg.Lifetime, s.cfg.TTL)
	if err != nil {
		return 0, err
	}
	if changed || last == nil {
		if err := s.write(ctx, sec, next); err != nil {
			return 0, err
		}
	}
	return next.NextChange(now, s.cfg.TTL).Sub(now), nil
}

// write creates the Secret (sec nil) or updates sec to hold set. An update
// carries sec's resourceVersion: if anyone wrote since the read, it fails
// with a conflict and the next reconcile starts from their version.
func (s *Store) write(ctx context.Context, sec *corev1.Secret, set *jwtkeys.Set) error {
	b, err := jwtkeys.Encode(set)
	if err != nil {
		return err
	}
	secrets := s.cfg.Client.CoreV1().Secrets(s.cfg.Namespace)
	if sec == nil {
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name: s.cfg.SecretName, Namespace: s.cfg.Namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "meshid"},
			},
			Type: SecretType,
			Data: map[string][]byte{DataKey: b},
		}, metav1.CreateOptions{})
	} else {
		sec = sec.DeepCopy()
		sec.Data = map[string][]byte{DataKey: b}
		_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("jwtsecret: write %s: %w", s.cfg.SecretName, err)
	}
	s.writes.Inc()
	s.log.Info("wrote the JWT signing keys", logs.KeyKeys, len(set.Keys), logs.KeyIdentity, s.cfg.Identity)
	return nil
}
