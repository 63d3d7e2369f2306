package caclient

import (
	"context"
	"fmt"

	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/metadata"

	"github.com/meshid/meshid/internal/jwtapi"
	"github.com/meshid/meshid/internal/logs"
)

// MintJWTSVID asks the CA (meshid.v1.JWTSVIDService) for a JWT-SVID for id
// with audience, authenticated with the token file as for Sign. It checks
// that the answer is one token for id; its signature, subject, audience and
// expiry are checked against the JWT bundle by the caller (secretcache),
// which holds the bundle. Errors from the CA keep their gRPC code.
func (c *Client) MintJWTSVID(ctx context.Context, id spiffeid.ID, audience []string) (string, error) {
	token, err := c.readToken()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	if c.clusterID != "" { // the request message has no metadata: the CA reads the header
		ctx = metadata.AppendToOutgoingContext(ctx, "ClusterID", c.clusterID)
	}
	resp, err := jwtapi.NewClient(c.conn).MintJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: audience, SpiffeId: id.String()})
	if err != nil {
		c.log.Debug("MintJWTSVID failed", logs.KeyCode, FailureCode(err), logs.KeyError, err)
		return "", fmt.Errorf("caclient: MintJWTSVID: %w", err)
	}
	svids := resp.GetSvids()
	switch {
	case len(svids) != 1:
		return "", invalid("%d JWT-SVIDs in the answer, want 1", len(svids))
	case svids[0].GetSpiffeId() != id.String():
		return "", invalid("JWT-SVID for %q, want %s", svids[0].GetSpiffeId(), id)
	case svids[0].GetSvid() == "":
		return "", invalid("empty JWT-SVID")
	}
	return svids[0].GetSvid(), nil
}

// FetchJWTBundles returns the CA's JWT bundles: RFC 7517 key sets keyed by
// trust domain SPIFFE ID. The call carries no credentials; the channel is
// the CA's verified TLS.
func (c *Client) FetchJWTBundles(ctx context.Context) (map[string][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := jwtapi.NewClient(c.conn).FetchJWTBundles(ctx, &workloadpb.JWTBundlesRequest{})
	if err != nil {
		return nil, fmt.Errorf("caclient: FetchJWTBundles: %w", err)
	}
	if len(resp.GetBundles()) == 0 {
		return nil, invalid("no JWT bundle in the answer")
	}
	return resp.GetBundles(), nil
}
