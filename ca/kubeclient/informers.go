package kubeclient

import (
	"context"
	"reflect"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// InformerFactory shares one informer per type, as client-go's
// informers.SharedInformerFactory does, for the core/v1 types meshid
// watches. Hand-written because client-go's factory takes a
// kubernetes.Interface (the full scheme); each informer is client-go's
// SharedIndexInformer over this package's typed clients, with client-go's
// listers, built as client-go's generated informers build them.
type InformerFactory struct {
	client    Interface
	resync    time.Duration
	namespace string
	tweak     func(*metav1.ListOptions)
	transform cache.TransformFunc

	mu           sync.Mutex
	informers    map[reflect.Type]cache.SharedIndexInformer
	started      map[reflect.Type]bool
	shuttingDown bool
	wg           sync.WaitGroup
}

// InformerOption configures an InformerFactory.
type InformerOption func(*InformerFactory)

// WithNamespace limits the factory's informers to one namespace.
func WithNamespace(namespace string) InformerOption {
	return func(f *InformerFactory) { f.namespace = namespace }
}

// WithTweakListOptions edits the options of every list and watch (label and
// field selectors).
func WithTweakListOptions(tweak func(*metav1.ListOptions)) InformerOption {
	return func(f *InformerFactory) { f.tweak = tweak }
}

// WithTransform sets the transform every informer applies to an object
// before storing it.
func WithTransform(t cache.TransformFunc) InformerOption {
	return func(f *InformerFactory) { f.transform = t }
}

// NewInformerFactory returns a factory over client; resync 0 = none.
func NewInformerFactory(client Interface, resync time.Duration, opts ...InformerOption) *InformerFactory {
	f := &InformerFactory{client: client, resync: resync, informers: map[reflect.Type]cache.SharedIndexInformer{}, started: map[reflect.Type]bool{}}
	for _, o := range opts {
		o(f)
	}
	return f
}

// Start runs the informers requested so far that are not running yet, until
// stop closes.
func (f *InformerFactory) Start(stop <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.shuttingDown {
		return
	}
	for t, inf := range f.informers {
		if !f.started[t] {
			f.wg.Go(func() { inf.Run(stop) })
			f.started[t] = true
		}
	}
}

// Shutdown stops starting informers and waits for the started ones to
// return (after their stop channel closed).
func (f *InformerFactory) Shutdown() {
	f.mu.Lock()
	f.shuttingDown = true
	f.mu.Unlock()
	f.wg.Wait()
}

// WaitForCacheSync waits for the started informers' caches to sync, or stop
// to close, and reports each one's state.
func (f *InformerFactory) WaitForCacheSync(stop <-chan struct{}) map[reflect.Type]bool {
	f.mu.Lock()
	started := map[reflect.Type]cache.SharedIndexInformer{}
	for t, inf := range f.informers {
		if f.started[t] {
			started[t] = inf
		}
	}
	f.mu.Unlock()
	out := make(map[reflect.Type]bool, len(started))
	for t, inf := range started {
		out[t] = cache.WaitForCacheSync(stop, inf.HasSynced)
	}
	return out
}

// lister is a typed client's list and watch.
type lister[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// informerFor returns the factory's informer of obj's type, making it with
// the typed client r on first use.
func informerFor[L runtime.Object](f *InformerFactory, obj runtime.Object, r lister[L]) cache.SharedIndexInformer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := reflect.TypeOf(obj)
	if inf, ok := f.informers[t]; ok {
		return inf
	}
	tweak := func(o *metav1.ListOptions) {
		if f.tweak != nil {
			f.tweak(o)
		}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return r.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return r.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, f.client), obj,
		cache.SharedIndexInformerOptions{ResyncPeriod: f.resync, Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}})
	if f.transform != nil {
		_ = inf.SetTransform(f.transform) // fails only once started; it is new
	}
	f.informers[t] = inf
	return inf
}

// PodInformer is the shared Pod informer and its lister.
type PodInformer struct{ f *InformerFactory }

// Pods returns the factory's Pod informer.
func (f *InformerFactory) Pods() PodInformer { return PodInformer{f} }

// Informer returns the shared informer, creating it on first use.
func (i PodInformer) Informer() cache.SharedIndexInformer {
	return informerFor(i.f, &corev1.Pod{}, i.f.client.CoreV1().Pods(i.f.namespace))
}

// Lister lists from the informer's cache.
func (i PodInformer) Lister() corelisters.PodLister {
	return corelisters.NewPodLister(i.Informer().GetIndexer())
}

// SecretInformer is the shared Secret informer and its lister.
type SecretInformer struct{ f *InformerFactory }

// Secrets returns the factory's Secret informer.
func (f *InformerFactory) Secrets() SecretInformer { return SecretInformer{f} }

// Informer returns the shared informer, creating it on first use.
func (i SecretInformer) Informer() cache.SharedIndexInformer {
	return informerFor(i.f, &corev1.Secret{}, i.f.client.CoreV1().Secrets(i.f.namespace))
}

// Lister lists from the informer's cache.
func (i SecretInformer) Lister() corelisters.SecretLister {
	return corelisters.NewSecretLister(i.Informer().GetIndexer())
}

// ConfigMapInformer is the shared ConfigMap informer and its lister.
type ConfigMapInformer struct{ f *InformerFactory }

// ConfigMaps returns the factory's ConfigMap informer.
func (f *InformerFactory) ConfigMaps() ConfigMapInformer { return ConfigMapInformer{f} }

// Informer returns the shared informer, creating it on first use.
func (i ConfigMapInformer) Informer() cache.SharedIndexInformer {
	return informerFor(i.f, &corev1.ConfigMap{}, i.f.client.CoreV1().ConfigMaps(i.f.namespace))
}

// Lister lists from the informer's cache.
func (i ConfigMapInformer) Lister() corelisters.ConfigMapLister {
	return corelisters.NewConfigMapLister(i.Informer().GetIndexer())
}

// NamespaceInformer is the shared Namespace informer and its lister.
type NamespaceInformer struct{ f *InformerFactory }

// Namespaces returns the factory's Namespace informer (cluster-scoped:
// WithNamespace does not apply).
func (f *InformerFactory) Namespaces() NamespaceInformer { return NamespaceInformer{f} }

// Informer returns the shared informer, creating it on first use.
func (i NamespaceInformer) Informer() cache.SharedIndexInformer {
	return informerFor(i.f, &corev1.Namespace{}, i.f.client.CoreV1().Namespaces())
}

// Lister lists from the informer's cache.
func (i NamespaceInformer) Lister() corelisters.NamespaceLister {
	return corelisters.NewNamespaceLister(i.Informer().GetIndexer())
}
