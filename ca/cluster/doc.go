// Package cluster makes one CA serve the proxies of several Kubernetes
// clusters (an Istio multi-cluster mesh). A request names its cluster in
// the ClusterID metadata (authn.Credentials.ClusterID); the Router sends
// its token to that cluster's API server for review (TokenReview, the same
// audiences, a review cache per cluster), and node authorization to that
// cluster's pods. An empty or local ClusterID is reviewed by the CA's own
// cluster; an unknown one is refused (Unauthenticated, naming it); a remote
// API server that cannot answer fails only its own cluster (Unavailable).
//
// Remote clusters come from --remote-kubeconfig files (Config.Kubeconfigs)
// and from Istio-style remote secrets, which the Watcher follows: Secrets
// of the CA's namespace labelled istio/multiCluster=true, each data key a
// cluster ID and its value a kubeconfig. A secret's kubeconfig is
// sanitized as Istio does (Sanitize): no exec or auth-provider plugins and
// no file references unless explicitly allowed. A bad secret is logged
// with its name and key (never its contents) and shown in the
// meshid_ca_remote_cluster_state gauge; it never stops the CA.
//
// A CA without a Router (no cluster client, no remote cluster) puts
// LocalOnly first in its chain, so that a token naming any cluster but the
// local one is refused there too.
//
// Every metric's cluster label takes only configured cluster IDs, the
// local ID or "unknown", so no caller can grow the label set.
package cluster
