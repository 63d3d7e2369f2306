package rootpublisher

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/meshid/meshid/certs"
)

// Defaults, Istio's names.
const (
	DefaultConfigMapName = "istio-ca-root-cert"
	DefaultKey           = "root-cert.pem"
	ManagedByLabel       = "app.kubernetes.io/managed-by"
	ManagedByValue       = "meshid"
)

// Config configures a Publisher.
type Config struct {
	Client        kubernetes.Interface // required
	ConfigMapName string               // "" = DefaultConfigMapName
	Key           string               // data key; "" = DefaultKey
	// Workers is the number of reconcile goroutines; 0 = 2.
	Workers int

	Logger     *slog.Logger          // nil = slog.Default()
	Registerer prometheus.Registerer // nil = no metrics
}

// Publisher keeps the root ConfigMap in every namespace. Create it with New,
// set the roots with SetRoots (any time), and call Run while leading.
type Publisher struct {
	cfg    Config
	log    *slog.Logger
	writes *prometheus.CounterVec
	errs   prometheus.Counter

	mu      sync.Mutex
	rootPEM []byte
	run     *run // the active Run, or nil
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
	if cfg.ConfigMapName == "" {
		cfg.ConfigMapName = DefaultConfigMapName
	}
	if cfg.Key == "" {
		cfg.Key = DefaultKey
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	p := &Publisher{
		cfg: cfg,
		log: log.With("component", "rootpublisher", "configmap", cfg.ConfigMapName),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "meshid_ca_root_configmap_writes_total",
			Help: "Writes of the root ConfigMap, by operation (create or update).",
		}, []string{"op"}),
		errs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "meshid_ca_root_configmap_errors_total",
			Help: "Failed reconciles of the root ConfigMap (each is retried with backoff).",
		}),
	}
	if r := cfg.Registerer; r != nil {
		for _, c := range []prometheus.Collector{p.writes, p.errs} {
			if err := r.Register(c); err != nil {
				return nil, fmt.Errorf("rootpublisher: register metrics: %w", err)
			}
		}
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
	p.log.Info("root bundle changed", "roots", len(roots))
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
		p.log.Error("list namespaces from cache", "error", err)
		return
	}
	for _, ns := range nss {
		r.queue.Add(ns.Name)
	}
}

// Run keeps the ConfigMaps until ctx ends; run it only while leading. A
// Publisher may Run again after a Run returned, but not twice at once.
func (p *Publisher) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactory(p.cfg.Client, 0)
	nsInf := factory.Core().V1().Namespaces()
	// ConfigMaps of that one name in all namespaces; a separate factory
	// because the field selector applies to the whole factory.
	cmFactory := informers.NewSharedInformerFactoryWithOptions(p.cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.cfg.ConfigMapName).String()
		}))
	cmInf := cmFactory.Core().V1().ConfigMaps()

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
		p.mu.Unlock()
	}()

	factory.Start(ctx.Done())
	cmFactory.Start(ctx.Done())
	defer factory.Shutdown()
	defer cmFactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), nsInf.Informer().HasSynced, cmInf.Informer().HasSynced) {
		return nil // ctx ended
	}
	p.log.Info("publishing the root ConfigMap to every namespace")

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
		p.errs.Inc()
		p.log.Warn("reconcile root ConfigMap; retrying", "namespace", ns, "error", err,
			"attempts", r.queue.NumRequeues(ns)+1)
		r.queue.AddRateLimited(ns)
		return true
	}
	r.queue.Forget(ns)
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
	cms := p.cfg.Client.CoreV1().ConfigMaps(nsName)
	cm, err := r.configMaps.ConfigMaps(nsName).Get(p.cfg.ConfigMapName)
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, p.newConfigMap(nsName, want), metav1.CreateOptions{})
		if err != nil {
			// AlreadyExists means the cache is behind: retry after it caught up.
			return fmt.Errorf("create: %w", err)
		}
		p.writes.WithLabelValues("create").Inc()
		p.log.Info("created root ConfigMap", "namespace", nsName)
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
	p.log.Info("updated root ConfigMap", "namespace", nsName)
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
