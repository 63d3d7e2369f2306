package kubeclient

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatalister"
	"k8s.io/client-go/tools/cache"
)

// MetadataInformer is an informer of one resource's metadata
// (metav1.PartialObjectMetadata) in all namespaces and its lister: what
// client-go's metadatainformer.NewFilteredMetadataInformer builds, without
// that package, whose GenericInformer type links client-go's informers and
// so every API group.
type MetadataInformer struct {
	gvr      schema.GroupVersionResource
	informer cache.SharedIndexInformer
}

// NewMetadataInformer returns an informer of gvr's metadata over client,
// applying transform (nil = none) to each object before it is stored;
// resync 0 = none. Run it with Informer().Run.
func NewMetadataInformer(client metadata.Interface, gvr schema.GroupVersionResource, resync time.Duration, transform cache.TransformFunc) *MetadataInformer {
	r := client.Resource(gvr)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return r.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return r.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), &metav1.PartialObjectMetadata{},
		resync, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if transform != nil {
		_ = inf.SetTransform(transform) // fails only once started; it is new
	}
	return &MetadataInformer{gvr: gvr, informer: inf}
}

// Informer returns the shared informer.
func (m *MetadataInformer) Informer() cache.SharedIndexInformer { return m.informer }

// Lister lists from the informer's cache.
func (m *MetadataInformer) Lister() cache.GenericLister {
	return metadatalister.NewRuntimeObjectShim(metadatalister.New(m.informer.GetIndexer(), m.gvr))
}
