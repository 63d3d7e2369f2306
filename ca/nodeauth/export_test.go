package nodeauth

// StoredPods returns the informer's copies of the pods.
func StoredPods(a *Authorizer) []any { return a.informer.GetStore().List() }
