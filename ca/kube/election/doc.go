// Package election runs Lease-based leader election for the meshid CA with
// client-go's leaderelection package. Every CA replica signs (active-active);
// leadership only gates the cluster-wide chores: bootstrapping the
// self-signed root Secret and publishing the root ConfigMap.
//
// An Elector campaigns for the Lease in the CA's own namespace, runs
// Config.Lead while it holds it, and campaigns again after it loses it, until
// its context ends. On shutdown it releases the Lease so another replica
// takes over without waiting for the Lease to expire.
package election
