package caclient

import (
	"context"
	"fmt"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"

	"github.com/meshid/meshid/internal/federationapi"
)

// FetchFederatedBundles returns the bundles of the trust domains the CA
// federates with: SPIFFE bundles (JSON) keyed by trust domain SPIFFE ID
// (internal/federationapi). As FetchJWTBundles, the call carries no
// credentials; the channel is the CA's verified TLS.
func (c *Client) FetchFederatedBundles(ctx context.Context) (map[string][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := federationapi.NewClient(c.conn).FetchFederatedBundles(ctx, &workloadpb.X509BundlesRequest{})
	if err != nil {
		return nil, fmt.Errorf("caclient: FetchFederatedBundles: %w", err)
	}
	return resp.GetBundles(), nil
}
