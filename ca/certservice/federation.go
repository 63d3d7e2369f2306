package certservice

import (
	"context"
	"maps"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"

	"github.com/meshid/meshid/internal/federationapi"
)

// FederatedBundles holds the federated trust domains' bundles;
// *spiffefed.Federator implements it. Both maps are keyed by trust domain
// SPIFFE ID ("spiffe://<td>") and must not be modified: encoded holds each
// SPIFFE bundle (JSON), jwks each trust domain's jwt-svid keys (JWKS).
type FederatedBundles interface {
	FederatedBundles() (encoded, jwks map[string][]byte)
}

// federationService serves meshid.v1.FederationService.
type federationService struct{ s *Server }

// FetchFederatedBundles returns every federated trust domain's bundle. It
// needs no credentials, as FetchJWTBundles: bundles hold public keys only.
// A CA without federation answers an empty map.
func (f federationService) FetchFederatedBundles(context.Context, *workloadpb.X509BundlesRequest) (*workloadpb.X509BundlesResponse, error) {
	if f.s.fed == nil {
		return &workloadpb.X509BundlesResponse{}, nil
	}
	encoded, _ := f.s.fed.FederatedBundles()
	return &workloadpb.X509BundlesResponse{Bundles: encoded}, nil
}

// federatedJWKS returns a copy of the federated trust domains' JWKS, to
// which the caller may add.
func (s *Server) federatedJWKS() map[string][]byte {
	if s.fed == nil {
		return map[string][]byte{}
	}
	out := map[string][]byte{}
	_, jwks := s.fed.FederatedBundles()
	maps.Copy(out, jwks)
	return out
}

var _ federationapi.Server = federationService{}
