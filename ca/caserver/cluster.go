package caserver

import (
	"errors"

	"github.com/meshid/meshid/ca/authn"
	"github.com/meshid/meshid/ca/cluster"
)

// clusterRouter returns the Router that sends each token to the API server
// of the cluster the request names (the local one, or a remote one of
// RemoteKubeconfigs), or nil when the CA has no cluster at all.
func (s *Server) clusterRouter() (*cluster.Router, error) {
	cfg := s.cfg
	if s.kc == nil && len(cfg.Clusters.RemoteKubeconfigs) == 0 {
		if cfg.Clusters.RemoteSecrets {
			return nil, errors.New("caserver: RemoteSecrets needs a Kubernetes client (--kubeconfig or in-cluster config) to watch the remote secrets")
		}
		return nil, nil
	}
	rcfg := cluster.Config{
		LocalID:             cfg.Clusters.ID,
		Kubeconfigs:         cfg.Clusters.RemoteKubeconfigs,
		Audiences:           cfg.Authn.TokenAudiences,
		TrustedNodeAccounts: cfg.Authn.TrustedNodeAccounts,
		TrustDomain:         cfg.TrustDomain,
		Clock:               cfg.Clock,
		Logger:              cfg.Logger,
		Registerer:          cfg.Registerer,
	}
	if s.kc != nil {
		tr, err := authn.NewTokenReview(authn.TokenReviewConfig{
			Client:     s.kc.auth,
			Audiences:  cfg.Authn.TokenAudiences,
			Issuers:    cfg.Authn.TokenReviewIssuers,
			Logger:     cfg.Logger,
			Registerer: cfg.Registerer,
		})
		if err != nil {
			return nil, err
		}
		rcfg.Local = tr
	}
	if s.node != nil { // a nil *Authorizer in the interface would not be nil
		rcfg.LocalNode = s.node
	}
	return cluster.New(rcfg)
}

// remoteSecrets returns the Watcher of the Istio remote secrets in
// Namespace, or nil unless RemoteSecrets.
func (s *Server) remoteSecrets() (*cluster.Watcher, error) {
	cfg := s.cfg
	if !cfg.Clusters.RemoteSecrets {
		return nil, nil
	}
	if s.kc == nil || s.router == nil {
		return nil, errors.New("caserver: RemoteSecrets needs a Kubernetes client (--kubeconfig or in-cluster config) to watch the remote secrets")
	}
	return cluster.NewWatcher(cluster.WatcherConfig{
		Client:                    s.kc.controllers,
		Namespace:                 cfg.Kube.Namespace,
		Router:                    s.router,
		InsecureKubeconfigOptions: cfg.Clusters.InsecureKubeconfigOptions,
		Logger:                    cfg.Logger,
	})
}
