package boundtoken

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"

	"github.com/meshid/meshid/ca/kubeclient"
)

// The resources a bound token names.
var (
	serviceAccounts = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	pods            = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	secrets         = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
)

// objects holds the metadata of every service account and pod (and
// secret) of the cluster, each slimmed to what the checks read.
type objects struct {
	sas     *kubeclient.MetadataInformer
	pods    *kubeclient.MetadataInformer
	secrets *kubeclient.MetadataInformer // nil unless WatchSecrets
	counts  map[string]*atomic.Int64     // resource -> objects held
}

func newObjects(client metadata.Interface, watchSecrets bool) *objects {
	o := &objects{
		sas:  kubeclient.NewMetadataInformer(client, serviceAccounts, 0, slim),
		pods: kubeclient.NewMetadataInformer(client, pods, 0, slim),
	}
	if watchSecrets {
		o.secrets = kubeclient.NewMetadataInformer(client, secrets, 0, slim)
	}
	o.counts = map[string]*atomic.Int64{}
	for gvr, i := range map[schema.GroupVersionResource]*kubeclient.MetadataInformer{serviceAccounts: o.sas, pods: o.pods, secrets: o.secrets} {
		if i == nil {
			continue
		}
		n := &atomic.Int64{}
		o.counts[gvr.Resource] = n
		// Counted from events: a store has no length, and listing its keys
		// on every scrape would copy them all.
		_, _ = i.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { n.Add(1) },
			DeleteFunc: func(any) { n.Add(-1) },
		})
	}
	return o
}

// collectors export how many objects each informer holds.
func (o *objects) collectors() []prometheus.Collector {
	var out []prometheus.Collector
	for res, n := range o.counts {
		out = append(out, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "meshid_ca_bound_token_informer_objects",
			Help:        "Objects (metadata only) the bound-token verifier's informers hold, by resource.",
			ConstLabels: prometheus.Labels{"resource": res},
		}, func() float64 { return float64(n.Load()) }))
	}
	return out
}

// slim keeps of an object's metadata only what the checks and the
// informer need: name, namespace, UID, resource version and deletion
// time. Labels, annotations, owner references and managed fields are
// most of a pod's metadata and are dropped before the object is stored.
func slim(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil // a deletion tombstone
	}
	return &metav1.PartialObjectMetadata{
		TypeMeta: m.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:              m.Name,
			Namespace:         m.Namespace,
			UID:               m.UID,
			ResourceVersion:   m.ResourceVersion,
			DeletionTimestamp: m.DeletionTimestamp,
		},
	}, nil
}

func (o *objects) informers() []*kubeclient.MetadataInformer {
	out := []*kubeclient.MetadataInformer{o.sas, o.pods}
	if o.secrets != nil {
		out = append(out, o.secrets)
	}
	return out
}

// run runs the informers until ctx ends and they have stopped.
func (o *objects) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, i := range o.informers() {
		wg.Go(func() { i.Informer().Run(ctx.Done()) })
	}
	wg.Wait()
}

func (o *objects) synced() bool {
	for _, i := range o.informers() {
		if !i.Informer().HasSynced() {
			return false
		}
	}
	return true
}

// waitForSync waits until every informer has synced or ctx ends.
func (o *objects) waitForSync(ctx context.Context) bool {
	syncs := make([]cache.InformerSynced, 0, 3)
	for _, i := range o.informers() {
		syncs = append(syncs, i.Informer().HasSynced)
	}
	return cache.WaitForCacheSync(ctx.Done(), syncs...)
}

// Outcomes of a check of a bound object.
var (
	// errMissing: the informer does not hold the object, or holds it with
	// another UID. It may be informer lag (a pod created a moment ago, or
	// deleted and recreated): TokenReview judges.
	errMissing = errors.New("not in the informer with this UID")
	// errDeleted: the object was marked for deletion more than
	// DeletedLeeway ago; the API server refuses its tokens too.
	errDeleted = errors.New("deleted")
)

// check reports whether the object ns/name of informer i exists with uid
// and was not deleted before deletedBefore.
func check(i *kubeclient.MetadataInformer, ns, name, uid string, deletedBefore time.Time) error {
	obj, err := i.Lister().ByNamespace(ns).Get(name)
	if err != nil {
		return errMissing
	}
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok || string(m.UID) != uid {
		return errMissing
	}
	if m.DeletionTimestamp != nil && m.DeletionTimestamp.Time.Before(deletedBefore) {
		return errDeleted
	}
	return nil
}
