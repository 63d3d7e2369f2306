package podcert

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/meshid/meshid/ca/kubeclient"
)

var (
	serviceAccounts = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	nodes           = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
)

// objects are the leader's caches of what a request is checked against:
// pods (slimmed to the fields checked), service accounts and nodes
// (metadata only). A miss is read from the API server once, so that
// informer lag never denies a pod created a moment ago.
type objects struct {
	client  kubeclient.Interface
	pods    cache.SharedIndexInformer
	factory *kubeclient.InformerFactory
	sas     *kubeclient.MetadataInformer
	nodes   *kubeclient.MetadataInformer
}

func newObjects(c *Controller) *objects {
	factory := kubeclient.NewInformerFactory(c.cfg.Client, 0, kubeclient.WithTransform(slimPod))
	return &objects{
		client:  c.cfg.Client,
		factory: factory,
		pods:    factory.Pods().Informer(),
		sas:     kubeclient.NewMetadataInformer(c.cfg.Metadata, serviceAccounts, 0, slimMeta),
		nodes:   kubeclient.NewMetadataInformer(c.cfg.Metadata, nodes, 0, slimMeta),
	}
}

// run runs the informers until ctx ends and waits for their sync; false
// when ctx ended first.
func (o *objects) start(ctx context.Context, wg *sync.WaitGroup) bool {
	o.factory.Start(ctx.Done())
	wg.Go(func() { <-ctx.Done(); o.factory.Shutdown() })
	wg.Go(func() { o.sas.Informer().Run(ctx.Done()) })
	wg.Go(func() { o.nodes.Informer().Run(ctx.Done()) })
	return cache.WaitForCacheSync(ctx.Done(), o.pods.HasSynced, o.sas.Informer().HasSynced, o.nodes.Informer().HasSynced)
}

// pod returns the pod ns/name, nil when it does not exist.
func (o *objects) pod(ctx context.Context, ns, name string, uid types.UID) (*corev1.Pod, error) {
	if obj, ok, _ := o.pods.GetIndexer().GetByKey(ns + "/" + name); ok {
		// A cached pod with no node yet is older than its binding (a
		// kubelet asks only for a pod bound to it, often before the
		// informer saw the binding): read it live.
		if p, ok := obj.(*corev1.Pod); ok && p.UID == uid && p.Spec.NodeName != "" {
			return p, nil
		}
	}
	p, err := o.client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", ns, name, err)
	}
	return p, nil
}

// uid returns the UID of the object key in i, reading it with get on a
// miss or a different UID; "" when it does not exist.
func uidOf(ctx context.Context, i *kubeclient.MetadataInformer, key string, want types.UID, get func(context.Context) (types.UID, error)) (types.UID, error) {
	if obj, ok, _ := i.Informer().GetIndexer().GetByKey(key); ok {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok && m.UID == want {
			return m.UID, nil
		}
	}
	uid, err := get(ctx)
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	return uid, err
}

// serviceAccountUID returns the UID of service account ns/name, "" when it
// does not exist.
func (o *objects) serviceAccountUID(ctx context.Context, ns, name string, want types.UID) (types.UID, error) {
	return uidOf(ctx, o.sas, ns+"/"+name, want, func(ctx context.Context) (types.UID, error) {
		sa, err := o.client.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", wrapGet(err, "service account", ns+"/"+name)
		}
		return sa.UID, nil
	})
}

// nodeUID returns the UID of node name, "" when it does not exist.
func (o *objects) nodeUID(ctx context.Context, name string, want types.UID) (types.UID, error) {
	return uidOf(ctx, o.nodes, name, want, func(ctx context.Context) (types.UID, error) {
		n, err := o.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", wrapGet(err, "node", name)
		}
		return n.UID, nil
	})
}

// wrapGet keeps NotFound recognisable.
func wrapGet(err error, what, name string) error {
	if apierrors.IsNotFound(err) {
		return err
	}
	return fmt.Errorf("get %s %s: %w", what, name, err)
}

// slimPod keeps of a pod what a request is checked against: name,
// namespace, UID, deletion time, node, service account, and the signer
// names of its podCertificate volumes.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a deletion tombstone
	}
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID,
			ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp,
		},
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName, ServiceAccountName: p.Spec.ServiceAccountName},
	}
	for _, s := range podCertificateSigners(p) {
		out.Spec.Volumes = append(out.Spec.Volumes, corev1.Volume{VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{PodCertificate: &corev1.PodCertificateProjection{SignerName: s}}},
		}}})
	}
	return out, nil
}

// podCertificateSigners lists the signer names of p's podCertificate
// projections.
func podCertificateSigners(p *corev1.Pod) []string {
	var out []string
	for _, v := range p.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.PodCertificate != nil {
				out = append(out, s.PodCertificate.SignerName)
			}
		}
	}
	return out
}

// slimMeta keeps name, namespace, UID and resource version.
func slimMeta(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	return &metav1.PartialObjectMetadata{
		TypeMeta: m.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		},
	}, nil
}
