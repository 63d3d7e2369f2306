package caserver

import (
	"context"
	"errors"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/keystore"
	"github.com/meshid/meshid/ca/kube/election"
	"github.com/meshid/meshid/ca/kube/podcert"
)

// podCertificates returns the pod certificate signer of
// PodCertificateSigner, or nil when it is off.
func (s *Server) podCertificates() (*podcert.Controller, error) {
	cfg := s.cfg
	if cfg.Kube.PodCertificateSigner == "" {
		return nil, nil
	}
	if s.kc == nil || s.kc.podcerts == nil || s.kc.metadata == nil {
		return nil, errors.New("caserver: PodCertificateSigner needs a Kubernetes client from --kubeconfig or the in-cluster config")
	}
	return podcert.New(podcert.Config{
		SignerName:  cfg.Kube.PodCertificateSigner,
		Client:      s.kc.podcerts,
		Metadata:    s.kc.metadata,
		Namespace:   cfg.Kube.Namespace,
		Candidate:   election.Candidate{Identity: cfg.Kube.PodName},
		TrustDomain: cfg.TrustDomain,
		Signer:      authoritySigner{s},
		Roots:       authoritySigner{s},
		DefaultTTL:  cfg.Issuance.DefaultTTL,
		MaxTTL:      cfg.Issuance.MaxTTL,
		GraceRatio:  cfg.Kube.PodCertificateRefresh,
		Clock:       cfg.Clock,
		Logger:      cfg.Logger,
		Registerer:  cfg.Registerer,
	})
}

// authoritySigner is the CA's authority as the signer sees it: the one
// signing path, and the roots it hands out (the union during a rotation),
// unavailable while Run waits for the CA Secret.
type authoritySigner struct{ s *Server }

func (a authoritySigner) Sign(ctx context.Context, req ca.Request) (*ca.Issued, error) {
	auth := a.s.Authority()
	if auth == nil {
		return nil, ca.Errorf(ca.KindUnavailable, "the CA is not ready: waiting for the CA Secret")
	}
	return auth.Sign(ctx, req)
}

func (a authoritySigner) Bundle() *keystore.Bundle {
	if auth := a.s.Authority(); auth != nil {
		return auth.Bundle()
	}
	return nil
}
