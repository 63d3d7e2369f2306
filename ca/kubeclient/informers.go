package kubeclient

import (
	"context"
	"reflect"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	certlisters "k8s.io/client-go/listers/certificates/v1"
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

// Informer is the factory's shared informer of one type and the client-go
// lister L that reads its cache.
type Informer[L any] struct {
	f         *InformerFactory
	obj       runtime.Object
	lw        *cache.ListWatch
	newLister func(cache.Indexer) L
}

// newInformer is obj's Informer, listing and watching with the typed client
// r under the factory's list options.
func newInformer[L any, LL runtime.Object](f *InformerFactory, obj runtime.Object, r lister[LL], newLister func(cache.Indexer) L) Informer[L] {
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
	return Informer[L]{f: f, obj: obj, lw: lw, newLister: newLister}
}

// Informer returns the factory's informer of the type, creating it on
// first use.
func (i Informer[L]) Informer() cache.SharedIndexInformer {
	f := i.f
	f.mu.Lock()
	defer f.mu.Unlock()
	t := reflect.TypeOf(i.obj)
	if inf, ok := f.informers[t]; ok {
		return inf
	}
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(i.lw, f.client), i.obj,
		cache.SharedIndexInformerOptions{ResyncPeriod: f.resync, Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}})
	if f.transform != nil {
		_ = inf.SetTransform(f.transform) // fails only once started; it is new
	}
	f.informers[t] = inf
	return inf
}

// Lister lists from the informer's cache.
func (i Informer[L]) Lister() L { return i.newLister(i.Informer().GetIndexer()) }

// Pods is the factory's Pod informer.
func (f *InformerFactory) Pods() Informer[corelisters.PodLister] {
	return newInformer(f, &corev1.Pod{}, f.client.CoreV1().Pods(f.namespace), corelisters.NewPodLister)
}

// Secrets is the factory's Secret informer.
func (f *InformerFactory) Secrets() Informer[corelisters.SecretLister] {
	return newInformer(f, &corev1.Secret{}, f.client.CoreV1().Secrets(f.namespace), corelisters.NewSecretLister)
}

// ConfigMaps is the factory's ConfigMap informer.
func (f *InformerFactory) ConfigMaps() Informer[corelisters.ConfigMapLister] {
	return newInformer(f, &corev1.ConfigMap{}, f.client.CoreV1().ConfigMaps(f.namespace), corelisters.NewConfigMapLister)
}

// Namespaces is the factory's Namespace informer (cluster-scoped:
// WithNamespace does not apply).
func (f *InformerFactory) Namespaces() Informer[corelisters.NamespaceLister] {
	return newInformer(f, &corev1.Namespace{}, f.client.CoreV1().Namespaces(), corelisters.NewNamespaceLister)
}

// PodCertificateRequests is the factory's PodCertificateRequest informer.
func (f *InformerFactory) PodCertificateRequests() Informer[certlisters.PodCertificateRequestLister] {
	return newInformer(f, &certificatesv1.PodCertificateRequest{}, f.client.CertificatesV1().PodCertificateRequests(f.namespace),
		certlisters.NewPodCertificateRequestLister)
}

// ClusterTrustBundles is the factory's ClusterTrustBundle informer
// (cluster-scoped: WithNamespace does not apply).
func (f *InformerFactory) ClusterTrustBundles() Informer[certlisters.ClusterTrustBundleLister] {
	return newInformer(f, &certificatesv1.ClusterTrustBundle{}, f.client.CertificatesV1().ClusterTrustBundles(),
		certlisters.NewClusterTrustBundleLister)
}

// NamedSecretInformer is an informer on the one Secret name in namespace
// (a field selector on metadata.name), for the CA's own Secrets: the CA
// Secrets, the rotation state, the JWT signing keys. A fake client ignores
// the selector, so handlers still check the name.
func NamedSecretInformer(client Interface, namespace, name string) cache.SharedIndexInformer {
	return NewInformerFactory(client, 0, WithNamespace(namespace),
		WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		})).Secrets().Informer()
}
