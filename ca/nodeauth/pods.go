package nodeauth

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// indexNodeAccount indexes pods by node, namespace and service account:
// the one question node authorization asks ("is a pod of this account on
// this node?") is a single index lookup.
const indexNodeAccount = "node/namespace/serviceaccount"

// nodeAccountKey is the index key. Node, namespace and service-account
// names are DNS labels or subdomains, so "/" cannot occur in them and keys
// cannot collide.
func nodeAccountKey(node, ns, sa string) string { return node + "/" + ns + "/" + sa }

// nodeAccountIndex indexes a scheduled pod; an unscheduled one proves
// nothing about a node and is not indexed.
func nodeAccountIndex(obj any) ([]string, error) {
	p, ok := obj.(*podInfo)
	if !ok || p.Node == "" {
		return nil, nil
	}
	return []string{nodeAccountKey(p.Node, p.Namespace, p.ServiceAccount)}, nil
}

// podInfo is what node authorization keeps of a pod: its name, namespace,
// UID and resource version (in an otherwise empty ObjectMeta, which the
// informer's keys need), service account, node and phase.
//
// Why not a trimmed *corev1.Pod: the empty corev1.Pod struct alone is
// 1,240 bytes, so even a pod with every other field cleared cost 1,451
// heap bytes in the informer; a podInfo costs a few hundred
// (BenchmarkInformerMemory, docs/benchmarks.md).
type podInfo struct {
	metav1.ObjectMeta
	ServiceAccount string
	Node           string
	Phase          corev1.PodPhase
}

var _ runtime.Object = (*podInfo)(nil)

// GetObjectKind implements runtime.Object; a podInfo has no kind.
func (p *podInfo) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object.
func (p *podInfo) DeepCopyObject() runtime.Object {
	c := *p
	p.ObjectMeta.DeepCopyInto(&c.ObjectMeta)
	return &c
}

// terminated reports whether the pod has finished for good.
func (p *podInfo) terminated() bool {
	return p.Phase == corev1.PodSucceeded || p.Phase == corev1.PodFailed
}

func infoOf(pod *corev1.Pod) *podInfo {
	return &podInfo{
		ObjectMeta: metav1.ObjectMeta{
			Name:            pod.Name,
			Namespace:       pod.Namespace,
			UID:             pod.UID,
			ResourceVersion: pod.ResourceVersion,
		},
		ServiceAccount: pod.Spec.ServiceAccountName,
		Node:           pod.Spec.NodeName,
		Phase:          pod.Status.Phase,
	}
}

// slimPod is the informer's transform: a pod becomes its podInfo before
// it is stored. Anything else (a deletion tombstone) passes unchanged.
func slimPod(obj any) (any, error) {
	if pod, ok := obj.(*corev1.Pod); ok {
		return infoOf(pod), nil
	}
	return obj, nil
}
