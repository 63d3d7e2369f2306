package rootpublisher

import (
	"bytes"
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/certs"
	"github.com/meshid/meshid/internal/clock"
	"github.com/meshid/meshid/internal/logs"
	"github.com/meshid/meshid/internal/metric"
)

// Defaults, Istio's names.
const (
	DefaultConfigMapName = "istio-ca-root-cert"
	DefaultKey           = "root-cert.pem"
	ManagedByLabel       = "app.kubernetes.io/managed-by"
	ManagedByValue       = "meshid"

	// DefaultNamespaceSelector selects every namespace but Kubernetes' own,
	// where no mesh workload runs (istiod's discovery selectors leave them
	// out the same way). The API server labels every namespace with
	// kubernetes.io/metadata.name = its name.
	DefaultNamespaceSelector = corev1.LabelMetadataName + " notin (kube-system,kube-public,kube-node-lease)"

	DefaultFailureGrace = 30 * time.Second
	DefaultLogInterval  = time.Minute
)

// ErrNotPublished is wrapped by Ready while some namespace lacks the roots.
var ErrNotPublished = errors.New("rootpublisher: root ConfigMap not published")

// Config configures a Publisher.
type Config struct {
	Client        kubeclient.Interface // required
	ConfigMapName string               // "" = DefaultConfigMapName
	Key           string               // data key; "" = DefaultKey
	// Workers is the number of reconcile goroutines; 0 = 2.
	Workers int
	// Namespaces selects the namespaces to publish to, by label (a
	// namespace's own name is its kubernetes.io/metadata.name label); nil
	// = DefaultNamespaceSelector, labels.Everything() = all. A namespace
	// that leaves the selection keeps its ConfigMap (nothing is deleted).
	Namespaces labels.Selector
	// FailureGrace is how long a namespace may keep failing (conflicts of
	// a stale cache and other retried errors) before Ready reports it;
	// 0 = DefaultFailureGrace.
	FailureGrace time.Duration
	// LogInterval is the least time between two failure logs for one
	// namespace; failures in between are counted in the next line.
	// 0 = DefaultLogInterval.
	LogInterval time.Duration

	Clock      clock.Clock           // nil = real time
	Logger     *slog.Logger          // nil discards logs
	Registerer prometheus.Registerer // nil = no metrics
}

// Publisher keeps the root ConfigMap in every namespace. Create it with New,
// set the roots with SetRoots (any time), and call Run while leading.
type Publisher struct {
	cfg     Config
	clock   clock.Clock
	log     *slog.Logger
	writes  *prometheus.CounterVec
	errs    prometheus.Counter
	failing prometheus.Gauge

	mu       sync.Mutex
	rootPEM  []byte
	run      *run                // the active Run, or nil
	failures map[string]*failure // namespaces whose last reconcile failed
}

// failure is a namespace's run of failed reconciles.
type failure struct {
	since      time.Time // first failure of the run
	lastLog    time.Time
	suppressed int // failures not logged since lastLog
	err        error
}

// run is the state of one Run: its informers and queue.
type run struct {
	queue      workqueue.TypedRateLimitingInterface[string]
	namespaces corelisters.NamespaceLister
	configMaps corelisters.ConfigMapLister
}

// New validates cfg and returns a Publisher. It starts nothing.
func New(cfg Config) (*Publisher, error) {
	if cfg.Client == nil {
		return nil, errors.New("rootpublisher: Client is required")
	}
	cfg.ConfigMapName = cmp.Or(cfg.ConfigMapName, DefaultConfigMapName)
	cfg.Key = cmp.Or(cfg.Key, DefaultKey)
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.Namespaces == nil {
		sel, err := labels.Parse(DefaultNamespaceSelector)
		if err != nil {
			return nil, fmt.Errorf("rootpublisher: %w", err)
		}
		cfg.Namespaces = sel
	}
	if cfg.FailureGrace <= 0 {
		cfg.FailureGrace = DefaultFailureGrace
	}
	if cfg.LogInterval <= 0 {
		cfg.LogInterval = DefaultLogInterval
	}
	log := logs.OrDiscard(cfg.Logger)
	p := &Publisher{
		cfg:      cfg,
		clock:    clock.OrReal(cfg.Clock),
		failures: map[string]*failure{},
		log:      log.With(logs.KeyComponent, "rootpublisher", logs.KeyConfigmap, cfg.ConfigMapName),
		writes: metric.CounterVec("meshid_ca_root_configmap_writes_total",
			"Writes of the root ConfigMap, by operation (create or update).",
			"op", "create", "update"), // exported as 0 before the first write
		errs: metric.Counter("meshid_ca_root_configmap_errors_total",
			"Failed reconciles of the root ConfigMap (each is retried with backoff)."),
		failing: metric.Gauge("meshid_ca_root_configmap_failing_namespaces",
			"Namespaces whose last reconcile of the root ConfigMap failed (0 on a replica that is not publishing)."),
	}
	if err := metric.Register(cfg.Registerer, p.writes, p.errs, p.failing); err != nil {
		return nil, fmt.Errorf("rootpublisher: register metrics: %w", err)
	}
	return p, nil
}

// SetRoots sets the root bundle to publish. When it differs from the
// current one, a running Publisher reconciles every namespace.
func (p *Publisher) SetRoots(roots []*x509.Certificate) {
	pem := certs.EncodeCertificates(roots...)
	p.mu.Lock()
	defer p.mu.Unlock()
	if bytes.Equal(pem, p.rootPEM) {
		return
	}
	p.rootPEM = pem
	p.log.Info("root bundle changed", logs.KeyRoots, len(roots))
	if p.run != nil {
		p.enqueueAllLocked(p.run)
	}
}

func (p *Publisher) desired() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rootPEM
}

func (p *Publisher) enqueueAllLocked(r *run) {
	nss, err := r.namespaces.List(labels.Everything())
	if err != nil {
		p.log.Error("list namespaces from cache", logs.KeyError, err)
		return
	}
	for _, ns := range nss {
		if p.selected(ns) {
			r.queue.Add(ns.Name)
		}
	}
}

// selected reports whether the namespace is one to publish to. The name
// label is set by the API server; it is filled in here for objects that
// lack it (fake clients, very old servers) so that a selector on names
// works the same everywhere.
func (p *Publisher) selected(ns *corev1.Namespace) bool {
	set := labels.Set(ns.Labels)
	if _, ok := set[corev1.LabelMetadataName]; !ok {
		set = labels.Merge(set, labels.Set{corev1.LabelMetadataName: ns.Name})
	}
	return p.cfg.Namespaces.Matches(set)
}

// Ready returns an error wrapping ErrNotPublished while some namespace has
// failed to reconcile for at least Config.FailureGrace (RBAC revoked, an
// admission webhook refusing the ConfigMap, ...), nil otherwise, and nil
// on a replica that is not running the Publisher.
func (p *Publisher) Ready() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	var late []string
	for ns, f := range p.failures {
		if now.Sub(f.since) >= p.cfg.FailureGrace {
			late = append(late, ns)
		}
	}
	if len(late) == 0 {
		return nil
	}
	sort.Strings(late)
	f := p.failures[late[0]]
	return fmt.Errorf("%w in %d namespace(s) for %s or more (%s: %v)",
		ErrNotPublished, len(late), p.cfg.FailureGrace, strings.Join(late[:min(len(late), 5)], ", "), f.err)
}

// failed records a failed reconcile of ns and logs it, at most once per
// LogInterval per namespace.
func (p *Publisher) failed(ns string, err error, attempts int) {
	now := p.clock.Now()
	p.mu.Lock()
	f, ok := p.failures[ns]
	if !ok {
		f = &failure{since: now}
		p.failures[ns] = f
		p.failing.Set(float64(len(p.failures)))
	}
	f.err = err
	logIt := !ok || now.Sub(f.lastLog) >= p.cfg.LogInterval
	suppressed := f.suppressed
	if logIt {
		f.lastLog, f.suppressed = now, 0
	} else {
		f.suppressed++
	}
	failingFor := now.Sub(f.since)
	p.mu.Unlock()
	p.errs.Inc()
	if logIt {
		p.log.Warn("reconcile root ConfigMap; retrying", logs.KeyNamespace, ns, logs.KeyError, err,
			logs.KeyAttempts, attempts, logs.KeyFailingFor, failingFor, logs.KeyUnloggedFailures, suppressed)
	}
}

// recovered forgets ns's failures (reconciled, gone, or deselected).
func (p *Publisher) recovered(ns string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.failures[ns]; ok {
		delete(p.failures, ns)
		p.failing.Set(float64(len(p.failures)))
		p.log.Info("root ConfigMap reconciled after failures", logs.KeyNamespace, ns, logs.KeyFailedFor, p.clock.Now().Sub(f.since))
	}
}

// Run keeps the ConfigMaps until ctx ends; run it only while leading. A
// Publisher may Run again after a Run returned, but not twice at once.
func (p *Publisher) Run(ctx context.Context) error {
	factory := kubeclient.NewInformerFactory(p.cfg.Client, 0)
	nsInf := factory.Namespaces()
	// ConfigMaps of that one name in all namespaces; a separate factory
	// because the field selector applies to the whole factory.
	cmFactory := kubeclient.NewInformerFactory(p.cfg.Client, 0,
		kubeclient.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.cfg.ConfigMapName).String()
		}))
	cmInf := cmFactory.ConfigMaps()

	r := &run{
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{}),
		namespaces: nsInf.Lister(),
		configMaps: cmInf.Lister(),
	}
	defer r.queue.ShutDown()

	_, err := nsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.enqueueObject(r, obj) },
		UpdateFunc: func(_, obj any) { p.enqueueObject(r, obj) },
	})
	if err != nil {
		return fmt.Errorf("rootpublisher: %w", err)
	}
	_, err = cmInf.Informer().AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: p.isOurs,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { p.enqueueObject(r, obj) },
			UpdateFunc: func(_, obj any) { p.enqueueObject(r, obj) },
			DeleteFunc: func(obj any) { p.enqueueObject(r, obj) },
		},
	})
	if err != nil {
		return fmt.Errorf("rootpublisher: %w", err)
	}

	p.mu.Lock()
	if p.run != nil {
		p.mu.Unlock()
		return errors.New("rootpublisher: Run called twice at once")
	}
	p.run = r
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.run = nil
		// Another replica publishes now: its failures are its own.
		clear(p.failures)
		p.failing.Set(0)
		p.mu.Unlock()
	}()

	factory.Start(ctx.Done())
	cmFactory.Start(ctx.Done())
	defer factory.Shutdown()
	defer cmFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), nsInf.Informer().HasSynced, cmInf.Informer().HasSynced) {
		return nil // ctx ended
	}
	p.log.Info("publishing the root ConfigMap", logs.KeyNamespaces, p.cfg.Namespaces.String())

	var wg sync.WaitGroup
	for range p.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p.processNext(ctx, r) {
			}
		}()
	}
	<-ctx.Done()
	r.queue.ShutDown()
	wg.Wait()
	return nil
}

// isOurs filters ConfigMap events to our name (fake clients and old
// servers may ignore the field selector).
func (p *Publisher) isOurs(obj any) bool {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, err := meta.Accessor(obj)
	return err == nil && m.GetName() == p.cfg.ConfigMapName
}

// enqueueObject queues the namespace an object belongs to (its own name for
// a Namespace).
func (p *Publisher) enqueueObject(r *run, obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	switch o := obj.(type) {
	case *corev1.Namespace:
		r.queue.Add(o.Name)
	case *corev1.ConfigMap:
		r.queue.Add(o.Namespace)
	}
}

func (p *Publisher) processNext(ctx context.Context, r *run) bool {
	ns, shutdown := r.queue.Get()
	if shutdown {
		return false
	}
	defer r.queue.Done(ns)
	if err := p.reconcile(ctx, r, ns); err != nil {
		if ctx.Err() != nil {
			return true
		}
		p.failed(ns, err, r.queue.NumRequeues(ns)+1)
		r.queue.AddRateLimited(ns)
		return true
	}
	r.queue.Forget(ns)
	p.recovered(ns)
	return true
}

// reconcile makes the namespace's ConfigMap carry the current roots.
func (p *Publisher) reconcile(ctx context.Context, r *run, nsName string) error {
	want := p.desired()
	if len(want) == 0 {
		return nil // no roots yet; SetRoots enqueues everything
	}
	ns, err := r.namespaces.Get(nsName)
	if apierrors.IsNotFound(err) {
		return nil // namespace gone
	}
	if err != nil {
		return err
	}
	if ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating {
		return nil // creating objects in a terminating namespace is forbidden
	}
	if !p.selected(ns) {
		return nil // not ours to publish to (any more)
	}
	cms := p.cfg.Client.CoreV1().ConfigMaps(nsName)
	cm, err := r.configMaps.ConfigMaps(nsName).Get(p.cfg.ConfigMapName)
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, p.newConfigMap(nsName, want), metav1.CreateOptions{})
		if err != nil {
			// AlreadyExists means the cache is behind: retry after it caught up.
			return fmt.Errorf("create: %w", err)
		}
		p.writes.WithLabelValues("create").Inc()
		p.log.Info("created root ConfigMap", logs.KeyNamespace, nsName)
		return nil
	}
	if err != nil {
		return err
	}
	if cm.Data[p.cfg.Key] == string(want) && cm.Labels[ManagedByLabel] == ManagedByValue {
		return nil // up to date: do not write
	}
	upd := cm.DeepCopy()
	if upd.Data == nil {
		upd.Data = map[string]string{}
	}
	upd.Data[p.cfg.Key] = string(want)
	if upd.Labels == nil {
		upd.Labels = map[string]string{}
	}
	upd.Labels[ManagedByLabel] = ManagedByValue
	if _, err := cms.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		// A Conflict means the cache is behind: retry after it caught up.
		return fmt.Errorf("update: %w", err)
	}
	p.writes.WithLabelValues("update").Inc()
	p.log.Info("updated root ConfigMap", logs.KeyNamespace, nsName)
	return nil
}

func (p *Publisher) newConfigMap(ns string, pem []byte) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      p.cfg.ConfigMapName,
			Namespace: ns,
			Labels:    map[string]string{ManagedByLabel: ManagedByValue},
		},
		Data: map[string]string{p.cfg.Key: string(pem)},
	}
}
