package caserver

import (
	"context"
	"crypto/x509"
	"net"
	"sync"

	"github.com/meshid/meshid/ca"
	"github.com/meshid/meshid/ca/certservice"
	"github.com/meshid/meshid/ca/jwtissuer"
	"github.com/meshid/meshid/ca/spiffefed"
)

// federationParts are the CA's SPIFFE federation: its bundle endpoint and
// the Federator of the trust domains it federates with. Its methods accept
// a nil receiver (no federation configured).
type federationParts struct {
	endpoint  *spiffefed.Endpoint  // nil unless BundleEndpoint.Listen
	federator *spiffefed.Federator // nil without FederateWith

	mu     sync.Mutex
	issuer *jwtissuer.Issuer // the JWT-SVID keys, set by build
}

// newFederation builds the configured parts, or returns nil.
func (s *Server) newFederation() (*federationParts, error) {
	cfg := s.cfg
	if cfg.Federation.BundleEndpoint.Listen == "" && len(cfg.Federation.Peers) == 0 {
		return nil, nil
	}
	f := &federationParts{}
	if cfg.Federation.BundleEndpoint.Listen != "" {
		ec := cfg.Federation.BundleEndpoint
		ec.TrustDomain, ec.Source, ec.Authority = cfg.TrustDomain, f.source(s.Authority), s.Authority
		ec.Clock, ec.Logger, ec.Registerer = cfg.Clock, cfg.Logger, cfg.Registerer
		e, err := spiffefed.NewEndpoint(ec)
		if err != nil {
			return nil, err
		}
		f.endpoint = e
	}
	if len(cfg.Federation.Peers) > 0 {
		fed, err := spiffefed.New(spiffefed.Config{
			TrustDomain: cfg.TrustDomain, Peers: cfg.Federation.Peers, StateDir: cfg.StateDir,
			Clock: cfg.Clock, Logger: cfg.Logger, Registerer: cfg.Registerer,
		})
		if err != nil {
			return nil, err
		}
		f.federator = fed
	}
	return f, nil
}

// source publishes the authority's roots (the union during a rotation, as
// ROOTCA) and the JWT-SVID keys.
func (f *federationParts) source(authority func() *ca.Authority) spiffefed.Source {
	return func() ([]*x509.Certificate, []byte, error) {
		a := authority()
		if a == nil {
			return nil, nil, ca.Errorf(ca.KindUnavailable, "the CA is not built yet")
		}
		f.mu.Lock()
		iss := f.issuer
		f.mu.Unlock()
		var jwks []byte
		if iss != nil {
			var err error
			if jwks, err = iss.JWKS(); err != nil {
				return nil, nil, err
			}
		}
		return a.Bundle().Roots, jwks, nil
	}
}

func (f *federationParts) setIssuer(iss *jwtissuer.Issuer) {
	if f == nil {
		return
	}
	f.mu.Lock()
	f.issuer = iss
	f.mu.Unlock()
}

// bundles is what ca/certservice hands to the agents; nil (not a typed nil)
// without a Federator.
func (f *federationParts) bundles() certservice.FederatedBundles {
	if f == nil || f.federator == nil {
		return nil
	}
	return f.federator
}

func (f *federationParts) listen() error {
	if f == nil || f.endpoint == nil {
		return nil
	}
	return f.endpoint.Listen()
}

// runs are the Run methods to start.
func (f *federationParts) runs() []func(context.Context) error {
	var out []func(context.Context) error
	if f != nil && f.endpoint != nil {
		out = append(out, f.endpoint.Run)
	}
	if f != nil && f.federator != nil {
		out = append(out, f.federator.Run)
	}
	return out
}

// BundleEndpointAddr is the bound bundle endpoint address, or nil before
// Listen or without an endpoint.
func (s *Server) BundleEndpointAddr() net.Addr {
	if s.fed == nil || s.fed.endpoint == nil {
		return nil
	}
	return s.fed.endpoint.Addr()
}

// Federation returns the state of each federated trust domain (nil
// without federation), for inspect.
func (s *Server) Federation() []spiffefed.PeerStatus {
	if s.fed == nil || s.fed.federator == nil {
		return nil
	}
	return s.fed.federator.Status()
}
