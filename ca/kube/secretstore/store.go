package secretstore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/metric"
)

// Names and type of the Secrets, following Istio (istio-ca-secret, cacerts).
const (
	DefaultSecretName        = "meshid-ca"
	DefaultPluggedSecretName = "cacerts"
	// SecretType is the type of the self-signed root Secret, the type of
	// Istio's istio-ca-secret.
	SecretType corev1.SecretType = "istio.io/ca-root"
)

// ErrNotLoaded is returned by Ready until a bundle has been loaded.
var ErrNotLoaded = errors.New("secretstore: no CA bundle loaded yet")

// Config configures a Store.
type Config struct {
	Client    kubeclient.Interface // required
	Namespace string               // the CA's namespace; required

	SecretName        string // self-signed root Secret; "" = DefaultSecretName
	PluggedSecretName string // operator-provided CA Secret; "" = DefaultPluggedSecretName

	// The self-signed root that Bootstrap creates.
	TrustDomain string        // required
	KeyType     certs.KeyType // "" = the keystore default
	RootTTL     time.Duration // 0 = the keystore default

	// RetryInterval is the wait between failed Bootstrap attempts;
	// 0 = 5s.
	RetryInterval time.Duration

	Clock      clock.Clock           // nil = real time
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil = no metrics
}

// Store loads and watches the CA Secrets. Create it with New.
type Store struct {
	cfg   Config
	clock clock.Clock
	log   *slog.Logger

	loads    *prometheus.CounterVec
	creates  prometheus.Counter
	current  atomic.Pointer[current]
	loadedCh chan struct{} // closed when the first bundle is loaded
	missing  chan struct{} // signalled (len 1) when neither Secret exists

	// mu serialises reconcile and Subscribe, so subscribers see every
	// bundle once and in order.
	mu        sync.Mutex
	lastFP    string
	subs      map[int]func(*keystore.Bundle)
	nextSub   int
	synced    bool
	informers []cache.SharedIndexInformer
}

type current struct {
	bundle *keystore.Bundle
	source string
}

// New validates cfg and returns a Store. It starts nothing; call Run.
func New(cfg Config) (*Store, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("secretstore: Client is required")
	case cfg.Namespace == "":
		return nil, errors.New("secretstore: Namespace is required")
	case cfg.TrustDomain == "":
		return nil, errors.New("secretstore: TrustDomain is required")
	}
	cfg.SecretName = cmp.Or(cfg.SecretName, DefaultSecretName)
	cfg.PluggedSecretName = cmp.Or(cfg.PluggedSecretName, DefaultPluggedSecretName)
	if cfg.SecretName == cfg.PluggedSecretName {
		return nil, fmt.Errorf("secretstore: SecretName and PluggedSecretName are both %q", cfg.SecretName)
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = 5 * time.Second
	}
	log := logs.OrDiscard(cfg.Logger)
	s := &Store{
		cfg:      cfg,
		clock:    clock.OrReal(cfg.Clock),
		log:      log.With(logs.KeyComponent, "secretstore", logs.KeyNamespace, cfg.Namespace),
		loadedCh: make(chan struct{}),
		missing:  make(chan struct{}, 1),
		subs:     map[int]func(*keystore.Bundle){},
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_ca_secret_loads_total",
			Help: "CA Secret contents seen, by Secret and result (loaded or invalid).",
		}, []string{"secret", "result"}),
		creates: metric.Counter("meshid_ca_secret_creations_total",
			"Self-signed root Secrets created by this replica."),
	}
	if err := metric.Register(cfg.Registerer, s.loads, s.creates); err != nil {
		return nil, fmt.Errorf("secretstore: register metrics: %w", err)
	}
	return s, nil
}

// Bundle returns the bundle in use, or nil before the first load.
func (s *Store) Bundle() *keystore.Bundle {
	if c := s.current.Load(); c != nil {
		return c.bundle
	}
	return nil
}

// Source returns the name of the Secret the bundle in use came from, or "".
func (s *Store) Source() string {
	if c := s.current.Load(); c != nil {
		return c.source
	}
	return ""
}

// Ready returns nil once a bundle has been loaded, else ErrNotLoaded. It fits
// a /readyz check.
func (s *Store) Ready() error {
	if s.current.Load() == nil {
		return ErrNotLoaded
	}
	return nil
}

// WaitForBundle blocks until a bundle has been loaded or ctx ends.
func (s *Store) WaitForBundle(ctx context.Context) (*keystore.Bundle, error) {
	select {
	case <-s.loadedCh:
		return s.Bundle(), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("secretstore: waiting for the CA bundle: %w", ctx.Err())
	}
}

// Subscribe calls fn with the current bundle, if any, and then with every
// new bundle, in order, until cancel is called. fn runs on the Store's
// goroutine: it must be quick and must not call Subscribe.
func (s *Store) Subscribe(fn func(*keystore.Bundle)) (cancel func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.nextSub
	s.nextSub++
	s.subs[id] = fn
	if b := s.Bundle(); b != nil {
		fn(b)
	}
	return func() {
		s.mu.Lock()
		delete(s.subs, id)
		s.mu.Unlock()
	}
}

// Run watches both Secrets until ctx ends. Only one Run per Store.
func (s *Store) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.informers != nil {
		s.mu.Unlock()
		return errors.New("secretstore: Run called twice")
	}
	for _, name := range []string{s.cfg.PluggedSecretName, s.cfg.SecretName} {
		s.informers = append(s.informers, s.newInformer(name))
	}
	informers := s.informers
	s.mu.Unlock()

	for _, inf := range informers {
		go inf.RunWithContext(ctx)
	}
	synced := make([]cache.InformerSynced, len(informers))
	for i, inf := range informers {
		synced[i] = inf.HasSynced
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx ended
	}
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
	s.reconcile()
	<-ctx.Done()
	return nil
}

// newInformer watches the one Secret name in the namespace.
func (s *Store) newInformer(name string) cache.SharedIndexInformer {
	inf := kubeclient.NamedSecretInformer(s.cfg.Client, s.cfg.Namespace, name)
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.reconcile() },
		UpdateFunc: func(any, any) { s.reconcile() },
		DeleteFunc: func(any) { s.reconcile() },
	})
	return inf
}

// secret returns the named Secret from informer i's cache, or nil.
func (s *Store) secret(i int, name string) *corev1.Secret {
	obj, ok, err := s.informers[i].GetStore().GetByKey(s.cfg.Namespace + "/" + name)
	if err != nil || !ok {
		return nil
	}
	sec, _ := obj.(*corev1.Secret)
	return sec
}

// reconcile loads the preferred Secret if its content changed.
func (s *Store) reconcile() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.synced {
		return // wait until both caches are complete, so cacerts wins from the start
	}
	sec := s.secret(0, s.cfg.PluggedSecretName)
	if sec == nil {
		sec = s.secret(1, s.cfg.SecretName)
	}
	if sec == nil {
		if s.lastFP != "" || s.current.Load() == nil {
			s.log.Warn("no CA Secret exists; waiting for the leader to create one",
				logs.KeySecret, s.cfg.SecretName, logs.KeyPluggedSecret, s.cfg.PluggedSecretName)
		}
		s.lastFP = ""
		select {
		case s.missing <- struct{}{}:
		default:
		}
		return
	}
	fp := fingerprint(sec)
	if fp == s.lastFP {
		return // a resync, or content already loaded or rejected
	}
	s.lastFP = fp
	log := s.log.With(logs.KeySecret, sec.Name, logs.KeyResourceVersion, sec.ResourceVersion)
	b, err := keystore.LoadFiles(sec.Data, s.clock.Now())
	if err != nil {
		s.loads.WithLabelValues(sec.Name, "invalid").Inc()
		log.Error("ignoring invalid CA Secret; keeping the last good bundle", logs.KeyError, err,
			logs.KeyInUse, s.Source())
		return
	}
	s.loads.WithLabelValues(sec.Name, "loaded").Inc()
	prev := s.current.Swap(&current{bundle: b, source: sec.Name})
	if prev == nil {
		close(s.loadedCh)
	}
	log.Info("loaded CA bundle", logs.KeyCASubject, b.Cert.Subject.String(),
		logs.KeyCANotAfter, b.Cert.NotAfter, logs.KeyRoots, len(b.Roots))
	ids := make([]int, 0, len(s.subs))
	for id := range s.subs {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		s.subs[id](b)
	}
}

// fingerprint identifies a Secret's name and data.
func fingerprint(sec *corev1.Secret) string {
	keys := make([]string, 0, len(sec.Data))
	for k := range sec.Data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00", sec.Name)
	for _, k := range keys {
		fmt.Fprintf(h, "%s\x00%d\x00", k, len(sec.Data[k]))
		h.Write(sec.Data[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}
