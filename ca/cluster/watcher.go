package cluster

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/meshid/meshid/ca/kubeclient"
	"github.com/meshid/meshid/internal/logs"
)

// LabelMultiCluster marks a remote secret (value "true"), as Istio's
// istioctl create-remote-secret writes it.
const LabelMultiCluster = "istio/multiCluster"

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// Client lists and watches the remote secrets. Required.
	Client kubeclient.Interface
	// Namespace holds the remote secrets: the CA's own. Required.
	Namespace string
	// Router gets the clusters. Required.
	Router *Router
	// InsecureKubeconfigOptions are what Sanitize allows (the Option
	// constants or auth provider names); empty allows none.
	InsecureKubeconfigOptions []string
	// MaxKubeconfigSize bounds one kubeconfig; 0 is
	// DefaultMaxKubeconfigSize.
	MaxKubeconfigSize int
	Logger            *slog.Logger // nil discards logs
}

// Watcher follows the remote secrets of a namespace with a client-go
// informer limited to that namespace and LabelMultiCluster=true: each
// data key of a secret is a cluster ID and its value a kubeconfig. A new
// or changed secret configures its clusters (Router.Set), a key or secret
// removed forgets them (Router.Remove). A key that is not a cluster ID, the
// local cluster's ID, or a cluster another secret configured first is
// ignored and logged; a refused kubeconfig is logged and marks its cluster
// invalid (Router.Invalidate). Logs name the secret and key, never the
// kubeconfig.
type Watcher struct {
	cfg      WatcherConfig
	log      *slog.Logger
	factory  *kubeclient.InformerFactory
	informer cache.SharedIndexInformer

	mu    sync.Mutex
	owned map[string]map[string][32]byte // owner -> cluster ID -> SHA-256 of its kubeconfig
}

// NewWatcher validates cfg and builds the informer; Run starts it.
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("cluster: WatcherConfig.Client is required")
	case cfg.Namespace == "":
		return nil, errors.New("cluster: WatcherConfig.Namespace is required")
	case cfg.Router == nil:
		return nil, errors.New("cluster: WatcherConfig.Router is required")
	case cfg.MaxKubeconfigSize < 0:
		return nil, errors.New("cluster: negative MaxKubeconfigSize")
	}
	cfg.Logger = logs.OrDiscard(cfg.Logger)
	factory := kubeclient.NewInformerFactory(cfg.Client, 0,
		kubeclient.WithNamespace(cfg.Namespace),
		kubeclient.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelMultiCluster + "=true" }))
	w := &Watcher{cfg: cfg, log: cfg.Logger, factory: factory, informer: factory.Secrets().Informer(), owned: map[string]map[string][32]byte{}}
	_, err := w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.onSecret(obj) },
		UpdateFunc: func(_, obj any) { w.onSecret(obj) },
		DeleteFunc: w.onDelete,
	})
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Run runs the informer until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	w.factory.Start(ctx.Done())
	defer w.factory.Shutdown()
	if cache.WaitForCacheSync(ctx.Done(), w.informer.HasSynced) {
		w.log.Info("remote secrets synced", logs.KeyNamespace, w.cfg.Namespace, logs.KeyClusters, len(w.cfg.Router.Clusters()))
	}
	<-ctx.Done()
	return nil
}

// HasSynced reports whether the informer has listed the secrets once.
func (w *Watcher) HasSynced() bool { return w.informer.HasSynced() }

// ownerOf is a secret's owner name in the Router.
func ownerOf(s *corev1.Secret) string { return "secret " + s.Namespace + "/" + s.Name }

// secretOf is the Secret an informer handler was given, unwrapping the
// tombstone a missed delete arrives as.
func secretOf(obj any) (*corev1.Secret, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	s, ok := obj.(*corev1.Secret)
	return s, ok
}

func (w *Watcher) onSecret(obj any) {
	if s, ok := secretOf(obj); ok {
		w.sync(s, s.Data)
	}
}

// onDelete syncs the deleted Secret as holding no keys: every cluster it
// owned is removed.
func (w *Watcher) onDelete(obj any) {
	if s, ok := secretOf(obj); ok {
		w.sync(s, nil)
	}
}

// sync makes the clusters Secret s owns those configured by data.
func (w *Watcher) sync(s *corev1.Secret, data map[string][]byte) {
	owner := ownerOf(s)
	w.mu.Lock()
	defer w.mu.Unlock()
	prev := w.owned[owner]
	next := map[string][32]byte{}
	for _, id := range slices.Sorted(maps.Keys(data)) {
		log := w.log.With(logs.KeySecret, s.Namespace+"/"+s.Name, logs.KeyKey, clip(id))
		if sum, ok := w.apply(log, owner, id, data[id], prev); ok {
			next[id] = sum
		}
	}
	for id := range prev {
		if _, ok := next[id]; !ok {
			w.cfg.Router.Remove(id, owner)
		}
	}
	if len(next) == 0 {
		delete(w.owned, owner)
		return
	}
	w.owned[owner] = next
}

// apply configures cluster id from one key of owner's secret; ok is true
// when owner now holds id (working or invalid).
func (w *Watcher) apply(log *slog.Logger, owner, id string, data []byte, prev map[string][32]byte) (sum [32]byte, ok bool) {
	if err := CheckID(id); err != nil {
		log.Warn("remote secret: the key is not a cluster ID; ignored", logs.KeyError, err)
		return sum, false
	}
	if id == w.cfg.Router.LocalID() {
		log.Warn("remote secret: the key is the local cluster's ID; ignored")
		return sum, false
	}
	sum = sha256.Sum256(data)
	if old, held := prev[id]; held && old == sum {
		return sum, true // unchanged
	}
	rc, err := Sanitize(data, w.cfg.MaxKubeconfigSize, w.cfg.InsecureKubeconfigOptions)
	if err != nil {
		log.Warn("remote secret: kubeconfig refused", logs.KeyError, err)
		if err := w.cfg.Router.Invalidate(id, owner); err != nil {
			log.Warn("remote secret: cluster not recorded", logs.KeyError, err)
			return sum, false
		}
		return sum, true
	}
	if err := w.cfg.Router.Set(id, rc, owner); err != nil {
		log.Warn("remote secret: cluster not configured", logs.KeyError, err)
		return sum, false
	}
	return sum, true
}
