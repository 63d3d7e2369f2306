// Package election is the meshid CA's Lease-based leader election. Every CA
// replica signs (active-active); leadership only gates the cluster-wide
// chores: bootstrapping the self-signed root Secret and publishing the root
// ConfigMap.
//
// An Elector campaigns for a coordination.k8s.io/v1 Lease in the CA's own
// namespace, runs Config.Lead while it holds it, and campaigns again after it
// loses it, until its context ends. On shutdown it waits for Lead to return,
// then releases the Lease (clears its holder) so another replica takes over
// at once instead of waiting for the Lease to expire.
//
// The Lease protocol is the one Kubernetes components speak (client-go's
// tools/leaderelection), so the Lease reads the same to kubectl and to any
// other tool:
//
//   - A candidate takes the Lease when it does not exist, has no holder, or
//     has not changed for the holder's leaseDurationSeconds as measured on
//     the candidate's own clock from when it first saw that version (never
//     from the renewTime written by another machine, whose clock may be
//     skewed).
//   - Every write is an Update carrying the resourceVersion that was read,
//     so of two candidates racing for an expired Lease the API server lets
//     one through and refuses the other with a conflict.
//   - The holder renews every RetryPeriod and stops leading (Lead's context
//     is cancelled) when it has not renewed for RenewDeadline, which is
//     shorter than LeaseDuration, so it stops before anyone may take over.
//   - leaseTransitions counts changes of holder.
//
// It is hand-written rather than imported for the CA's size: client-go's
// tools/leaderelection imports its kubernetes.Clientset and informers, which
// link every API group of k8s.io/api. Measured on the stripped static meshid
// binary: 36,978,850 bytes with this package, 50,065,570 with
// tools/leaderelection merely imported (k8s.io/api packages linked: 3 and
// 56); docs/benchmarks.md, "Container images", has the commands.
package election
