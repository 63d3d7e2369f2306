package nodeauth

// StoredPod is what the informer keeps of a pod, for tests.
type StoredPod struct {
	Name, Namespace, UID, ServiceAccount, Node, Phase string
	// Extra counts fields kept beyond those: labels, annotations, owner
	// references, managed fields, finalizers.
	Extra int
}

// StoredPods returns the informer's copies of the pods.
func StoredPods(a *Authorizer) []StoredPod {
	var out []StoredPod
	for _, o := range a.informer.GetStore().List() {
		p := o.(*podInfo)
		out = append(out, StoredPod{
			Name: p.Name, Namespace: p.Namespace, UID: string(p.UID), ServiceAccount: p.ServiceAccount, Node: p.Node, Phase: string(p.Phase),
			Extra: len(p.Labels) + len(p.Annotations) + len(p.OwnerReferences) + len(p.ManagedFields) + len(p.Finalizers),
		})
	}
	return out
}
