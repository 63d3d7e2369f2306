package nodeauth

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName == "" {
		return nil, nil
	}
	return []string{nodeAccountKey(pod.Spec.NodeName, pod.Namespace, pod.Spec.ServiceAccountName)}, nil
}

// slimPod is the informer's transform: it keeps only what node
// authorization reads (name, namespace, UID, service account, node and
// phase) and the resource version, so the CA holds a few hundred bytes per
// pod instead of the whole object (often tens of KiB with managed fields,
// annotations and status). Anything that is not a pod passes unchanged.
func slimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:            pod.Name,
			Namespace:       pod.Namespace,
			UID:             pod.UID,
			ResourceVersion: pod.ResourceVersion,
		},
		Spec:   corev1.PodSpec{ServiceAccountName: pod.Spec.ServiceAccountName, NodeName: pod.Spec.NodeName},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}, nil
}
